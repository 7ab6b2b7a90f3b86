"""Serving engines' conventions: ragged flat batches, draft probs with target logits, a given bonus token.

The flat layout hands each request its own draft count (0..k), so an indexing bug that shows
only when counts differ is reached; both sides are tested.
"""

import numpy as np
import pytest

from specsample import cli, host
from test_host import standard_np

CASES = "dirichlet/V8/k4,zeros-in-p/V8/k4,ngram-2/V4/k4"


def flat_np(ids, counts, q, p_logits, bonus, rng, *, equal_counts_bug=False):
    """The standard rule in the flat layout (numpy, target logits, bonus given), request by request.

    ``equal_counts_bug``: request b's rows are taken to start at b * max(counts), right only when
    every request has the same count.
    """
    b = len(counts)
    kmax = int(counts.max(initial=0))
    starts = np.arange(b) * kmax if equal_counts_bug else np.cumsum(counts) - counts
    p = np.exp(p_logits - p_logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.full((b, kmax + 1), -1, np.int64)
    last_row = max(0, len(ids) - 1)
    for r in range(b):
        c = int(counts[r])
        sl = np.minimum(starts[r] + np.arange(c), last_row)
        tok, n = standard_np(ids[sl][None], q[sl][None], np.concatenate([p[sl], p[:1]])[None], rng) if c else \
            (np.array([[0]]), np.array([1]))
        n = int(n[0])
        out[r, :n] = tok[0, :n]
        if n == c + 1:  # all accepted: the bonus given by the caller
            out[r, c] = bonus[r]
    return out


def flat_np_equal_counts_bug(ids, counts, q, p_logits, bonus, rng):
    return flat_np(ids, counts, q, p_logits, bonus, rng, equal_counts_bug=True)


FLAT = dict(layout="flat", bonus="given", inputs="probs,logits")


def test_a_correct_flat_sampler_passes():
    report = host.verify_host(flat_np, budget=3000, k=4, cases=CASES, **FLAT)
    assert report.passed, report.table()


def test_an_indexing_bug_of_unequal_counts_is_reached_and_rejected():
    report = host.verify_host(flat_np_equal_counts_bug, budget=3000, k=4, cases=CASES, **FLAT)
    assert not report.passed


@pytest.mark.long  # 20 s: the default run keeps a correct flat sampler passing and two bugs rejected
def test_the_torch_reference_in_the_full_convention_passes_everything():
    pytest.importorskip("torch")
    from specsample.host import adapters

    report = host.verify_host(adapters.torch_ragged(), budget=4000, k=(1, 4), cases=CASES + ",boundary/V8/k4")
    assert report.passed, report.table()
    assert report.case("boundary/V8/k4").tests[0].statistic == 0


def test_a_self_drafting_sampler_is_told_k():
    seen = set()

    def drafts_itself(context, draft, target, rng, k):
        seen.add(k)
        b = len(context)
        drafts = np.zeros((b, k), np.int64)
        rows_q = np.zeros((b, k, draft.vocab_size), np.float32)
        toks = context.copy()
        for i in range(k):
            rows_q[:, i] = draft(toks)[:, -1]
            cdf = np.cumsum(rows_q[:, i], -1)
            drafts[:, i] = np.minimum((cdf < rng.random(b)[:, None] * cdf[:, -1:]).sum(1), draft.vocab_size - 1)
            toks = np.concatenate([toks, drafts[:, i : i + 1]], 1)
        p = target(toks)[:, -(k + 1):]
        tokens, n = standard_np(drafts, rows_q, p, rng)
        return tokens, n, drafts

    report = host.verify_host(drafts_itself, budget=2000, k=(1, 4), cases="dirichlet/V8/k1,dirichlet/V8/k4",
                              drafts="self")
    assert report.passed and seen == {1, 4}


@pytest.mark.parametrize("value", ["probs,logits", "logits,probs", "logits", "probs,probs"])
def test_inputs_take_one_kind_or_two(value):
    s = host.HostSampler(flat_np, inputs=value)
    assert s.draft_inputs == value.split(",")[0] and s.target_inputs == value.split(",")[-1]


def test_bad_combinations_are_refused():
    with pytest.raises(ValueError, match="DRAFT,TARGET"):
        host.HostSampler(flat_np, inputs="probs,logs")
    with pytest.raises(ValueError, match="self-drafting"):
        host.HostSampler(flat_np, drafts="self", layout="flat")


def test_cases_exclusion_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "flat.py"
    import inspect

    import test_host

    path.write_text("import numpy as np\n" + inspect.getsource(test_host.standard_np) + inspect.getsource(flat_np))
    args = ["verify", "--sampler", f"{path}:flat_np", "--ragged", "--bonus-given", "--inputs", "probs,logits",
            "--budget", "1500", "--k", "4", "--cases", "dirichlet*,!dirichlet-peaked*,!dirichlet-flat*",
            "--no-progress"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "dirichlet/V8/k4" in out and "dirichlet-peaked" not in out
