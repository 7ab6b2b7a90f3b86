"""Lanes stepped in groups (specsample.engine.lane_groups): only rounds that build rows of a large
vocabulary are grouped, only on CPU, and the counts are those of all lanes at once, to the bit."""

import jax
import jax.numpy as jnp
import numpy as np

from specsample.engine import lane_groups, lanes as engine
from specsample.models import pairs
from specsample.schemes import make_scheme


def _group(name, vocab, n_lanes=256, platform="cpu"):
    s = make_scheme(name, 4)
    pr = pairs.make_pair("dirichlet", 0, vocab)
    prep = engine._prepare(s, pr.target, pr.draft, sequences=n_lanes, length=2, seed=0, lanes=n_lanes, per_lane=1,
                           joint=None, prng=engine.DEFAULT_PRNG, blocks_per_call=None, devices=None)
    t, d = prep.target.flat_pairs(), prep.draft.flat_pairs()
    n_u = s.step.n

    def one_lane(rand, pair, ctx, tt, dd):
        return s.step.round(rand, tt.at_pair(pair), dd.at_pair(pair), ctx)

    args = (jax.ShapeDtypeStruct((n_u,), jnp.float32), jnp.int32(0), jnp.zeros(0, jnp.int32))
    return lane_groups.group_size(one_lane, args, (t, d), vocab, n_lanes, platform)


def test_rounds_that_build_rows_are_grouped_and_table_lookups_are_not():
    assert _group("standard", 8192) == 256  # alias draws and paired residuals: no row per lane
    assert _group("tree", 8192) == 256  # tabled residual chains
    for name in ("multidraft", "kseq", "tree-wor"):  # rows of V floats per lane: 1 MiB / (4 V) lanes
        assert _group(name, 8192) == 32, name
        assert _group(name, 8192, n_lanes=48) == 16, name  # a power of two dividing the lanes
        assert _group(name, 8192, platform="gpu") == 256, name
    assert _group("multidraft", 1024) == 256  # short rows: every lane at once


def test_in_groups_is_the_batched_function():
    def batched(a, b):
        return {"s": a.sum(axis=0) * b, "m": jnp.stack([a[0] - b, a[1] + b])}

    a = jnp.arange(3 * 64, dtype=jnp.float32).reshape(3, 64)
    b = jnp.arange(64, dtype=jnp.float32)
    want = batched(a, b)
    for g in (1, 4, 64):
        got = lane_groups.in_groups(batched, g)(a, b)
        assert all(np.array_equal(got[k], want[k]) for k in want)


def test_grouped_counts_equal_the_counts_of_all_lanes_at_once(monkeypatch):
    pr = pairs.make_pair("dirichlet", 1, 4096)
    s = make_scheme("tree-wor", 2)  # rows built per lane, behind the walk's fenced loops

    def counts():
        c = engine.run(s, pr.target, pr.draft, sequences=1024, length=2, lanes=256, per_lane=4, seed=3)
        return [np.asarray(x) for x in c if isinstance(x, np.ndarray)]

    assert _group("tree-wor", 4096) == 64  # so the 256 lanes run as 4 groups
    grouped = counts()
    monkeypatch.setattr(lane_groups, "WIDE", 1 << 30)  # nothing grouped
    monkeypatch.setattr(engine, "_CACHE", {})
    whole = counts()
    assert len(grouped) == len(whole) and all(np.array_equal(g, w) for g, w in zip(grouped, whole))
