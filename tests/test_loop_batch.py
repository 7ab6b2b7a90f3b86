"""Batch invariance of batched generate loops (issue 33, item 5): a correct batched loop passes; one whose
rows read their context from the batch's padded last column (for a row shorter than the longest, a
slot holding the row above's token) fails `batch-invariance`, as does one that starts every row from
the first row's prompt (this suite's own cached loop in test_provenance.py did, until this pass
caught it); one whose rows share one generator seed fails `batch-independence`."""

import numpy as np
import pytest

from specsample.loops.batch import loop_batch_check
from specsample.loops.verify import verify_generate
from specsample.models.pairs import ngram_pair

PAIR = ngram_pair(3, 4, 1, 0.2, 0.5)  # peaked rows: a wrong context moves the next token far
P = np.asarray(PAIR.target.table, np.float64).reshape(-1, 4)
Q = np.asarray(PAIR.draft.table, np.float64).reshape(-1, 4)
K = 2


def next_token(tokens):
    return P[np.asarray(tokens)]


def _round(rng, last):
    """One standard round after token ``last`` (an order-1 pair): the tokens it emits."""
    drafts, ctx = [], last
    for _ in range(K):
        ctx = int(rng.choice(4, p=Q[ctx]))
        drafts.append(ctx)
    out, ctx = [], last
    for t in drafts:
        if rng.random() * Q[ctx, t] < P[ctx, t]:
            out.append(t)
            ctx = t
            continue
        r = np.maximum(P[ctx] - Q[ctx], 0.0)
        out.append(int(rng.choice(4, p=r / r.sum() if r.sum() > 0 else P[ctx])))
        return out
    return out + [int(rng.choice(4, p=P[ctx]))]


def make_loop(bug=None):
    def generate(prompts, n, seeds):
        rngs = [np.random.default_rng(int(s if bug != "one-seed" else seeds[0])) for s in seeds]
        rows = [list(map(int, prompts[0] if bug == "first-prompt" else p)) for p in prompts]
        start = [len(r) for r in rows]
        while any(len(r) - s < n for r, s in zip(rows, start)):
            longest = max(len(r) for r in rows)
            for b, r in enumerate(rows):
                if len(r) - start[b] >= n:
                    continue
                # the bug: the context read from the padded batch's last column, where a shorter row has
                # padding that holds the row above's token (its rejected draft, in an engine's buffer)
                last = r[-1] if bug != "padding" or len(r) == longest else rows[b - 1][-1]
                r += _round(rngs[b], last)
        return np.array([r[s : s + n] for r, s in zip(rows, start)])

    return generate


def test_a_correct_batched_loop_is_batch_invariant():
    tests = {t.name: t for t in loop_batch_check(make_loop(), np.array([1]), 4, 4, seed=0)}
    assert tests["batch-invariance"].pvalue > 1e-3 and tests["batch-independence"].pvalue > 1e-3, tests


@pytest.mark.parametrize("bug,test", [("padding", "batch-invariance"), ("one-seed", "batch-independence"),
                                      ("first-prompt", "batch-invariance")])
def test_a_loop_whose_rows_see_their_neighbours_fails(bug, test):
    tests = {t.name: t for t in loop_batch_check(make_loop(bug), np.array([1]), 4, 4, seed=0)}
    assert tests[test].pvalue < 1e-6, tests


def test_the_batch_pass_joins_a_batched_end_to_end_run():
    report = verify_generate(next_token, make_loop(), [1], length=3, sequences=2000, batch=16, boundary=False)
    names = [t.name for t in report.cases[0].tests]
    assert "batch-invariance" in names and "batch-independence" in names
    assert report.passed, report.table()
    serial = verify_generate(next_token, lambda p, n, s: make_loop()(p[None], n, [s])[0], [1], length=3,
                             sequences=500, boundary=False)
    assert "batch-invariance" not in [t.name for t in serial.cases[0].tests]  # one call a sequence: no batch
    off = verify_generate(next_token, make_loop(), [1], length=3, sequences=500, batch=16, boundary=False,
                          batch_pass=False)
    assert "batch-invariance" not in [t.name for t in off.cases[0].tests]
