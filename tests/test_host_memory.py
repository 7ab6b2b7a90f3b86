"""Host samplers at serving vocabularies fit in memory: every call's rows are sized from V and the memory
free, the stage pass holds no row per round, peak memory is reported, and a round that cannot fit is
refused before any work."""

import tracemalloc

import numpy as np
import pytest

from specsample.battery import memory
from specsample.battery.stages import play_host
from specsample.models.pairs import make_pair
from test_host import standard_np


def test_calls_are_sized_from_the_vocabulary_and_the_memory_free(monkeypatch):
    assert memory.rounds_per_call(4, 8, 4096) == 4096
    assert memory.rounds_per_call(4, 32768, 4096) == memory.ROW_BUDGET // (9 * 32768) == 113
    monkeypatch.setattr(memory, "available_bytes", lambda: 64 << 20)  # 64 MiB free
    assert memory.rounds_per_call(4, 32768, 4096) == (64 << 20) // (4 * memory.COPIES) // (9 * 32768)
    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 20)
    with pytest.raises(ValueError, match=r"one round's rows at V = 32768, k = 4 take 9 MiB .* 1 MiB is free"):
        memory.rounds_per_call(4, 32768, 4096)
    assert memory.peak_rss_mib() > 10


def test_the_stage_pass_at_32k_tokens_holds_no_row_per_round():
    # 1,024 stage rounds at V = 32,768 drew their drafts from a row per round: 2 x 256 MiB of float64 (and
    # 4,096 rounds in one call, 4.5 GiB of rows); now from one cumulative row per window, and each call
    # carries at most ROW_BUDGET floats of rows
    pr = make_pair("large-vocab", 0)
    calls = []

    def call(drafts, q, p):
        calls.append(q.shape[0])
        return standard_np(drafts, q, p, np.random.default_rng(len(calls)))

    tracemalloc.start()
    rounds = play_host(call, pr.target, pr.draft, 4, n_rounds=1024, seed=0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rounds.tokens.shape == (1024, 5) and max(calls) == 113
    assert peak < 300 << 20, peak / 2**20  # a call's rows (133 MiB of float32) and the sampler's temporaries
