"""The audit's power at serving vocabularies (record format 2): at V = 8 and V = 50,000, a correct
engine's compact records pass, and five realistic bugs each fail at their own stage within 1e6 rounds:
a bonus drawn from the wrong position's row, a bonus drawn from q, drafts drawn from a tempered q while
the untempered q is logged, a rejection resampled from p, and a softmax-normalised residual.

The engine is simulated with numpy, its draws and its compact fields read from per-row tables built
once (a row of its own at every slot, as a language model's are), so a million rounds at V = 50,000
take about a second to make."""

import numpy as np
import pytest

pytest.importorskip("pyarrow")

from specsample.audit import audit  # noqa: E402
from specsample.audit.recorder import table  # noqa: E402
from specsample.audit.records import write_records  # noqa: E402

K = 4


class Rows:
    """Draws and the CDF intervals (token-id and rank order) of a set of rows, from tables built once."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows
        self.cdf = np.cumsum(rows, axis=-1)
        order = np.lexsort((np.broadcast_to(np.arange(rows.shape[-1]), rows.shape), -rows), axis=-1)
        ranked = np.take_along_axis(rows, order, -1)
        lo = np.cumsum(ranked, -1) - ranked
        self.rank_lo = np.empty_like(rows)
        np.put_along_axis(self.rank_lo, order, lo, -1)

    def sample(self, r: int, u: np.ndarray) -> np.ndarray:
        """Tokens from row ``r`` with uniforms ``u`` (inverse CDF)."""
        c = self.cdf[r]
        y = np.searchsorted(c, u * c[-1], side="right")
        return np.minimum(y, c.size - 1)

    def fields(self, r, y):
        """(p(y), F(y-), F(y), rank F(y-), rank F(y)) under row(s) r."""
        p = self.rows[r, y]
        hi = self.cdf[r, y]
        lo = hi - p
        rl = self.rank_lo[r, y]
        return p, lo, hi, rl, rl + p


def _law(vocab, rng, family):
    if family == "dirichlet":  # no token much above the rest: a wrong row hides among thousands a bin
        return rng.dirichlet(np.ones(vocab))
    logits = rng.standard_normal(vocab) * (2.5 if vocab > 100 else 1.0)  # a tokenizer-like softmax
    w = np.exp(logits - logits.max())
    return w / w.sum()


def simulate(vocab: int, rounds: int, bug: str = "", seed: int = 0, family: str = "softmax"):
    """A table of ``rounds`` rounds of the standard rule, correct or with ``bug``, and its compact fields."""
    rng = np.random.default_rng([vocab, seed])
    p = np.stack([_law(vocab, rng, family) for _ in range(K + 1)])  # target rows: slots 0..k (k: the bonus)
    q = np.stack([0.6 * p[i] + 0.4 * _law(vocab, rng, family) for i in range(K)])  # draft rows near them
    res = np.maximum(p[:K] - q, 0.0)
    res /= res.sum(-1, keepdims=True)
    P, Q, R = Rows(p), Rows(q), Rows(res)
    drawn_q = Rows(q ** (1 / 0.8) / (q ** (1 / 0.8)).sum(-1, keepdims=True)) if bug == "tempered drafts" else Q
    drafts = np.stack([drawn_q.sample(i, rng.random(rounds)) for i in range(K)], 1)
    px = p[np.arange(K), drafts]
    qx = q[np.arange(K), drafts]
    ok = rng.random((rounds, K)) * qx < px
    j = np.where(ok.all(1), K, np.argmin(ok, 1))
    u = rng.random(rounds)
    y = np.empty(rounds, np.int64)
    for slot in range(K + 1):
        at = np.flatnonzero(j == slot)
        if slot == K:  # the bonus
            src = {"bonus from the wrong row": (P, K - 1), "bonus from q": (Q, K - 1)}.get(bug, (P, K))
        else:
            src = {"residual from p": (P, slot)}.get(bug, (R, slot))
            if bug == "softmax residual":  # max(0, p - q) normalised with softmax: about uniform at large V
                w = np.exp(res[slot] - res[slot].max())
                src = (Rows((w / w.sum())[None]), 0)
        y[at] = src[0].sample(src[1], u[at])
    n = j + 1
    tokens = np.concatenate([drafts, np.zeros((rounds, 1), np.int64)], 1)
    tokens[np.arange(rounds), j] = y
    # the fields the engine logs: the law each token must follow (the correct rule's), never the bug's
    q_draft, q_lo, q_hi, qr_lo, qr_hi = Q.fields(np.arange(K), drafts)
    stop_rows = np.where(j < K, j, 0)
    s = [np.empty(rounds) for _ in range(4)]
    rej, bon = j < K, j == K
    for which, rows_, idx in ((rej, R, stop_rows), (bon, P, np.full(rounds, K))):
        _, lo, hi, rl, rh = rows_.fields(idx[which], y[which])
        for arr, v in zip(s, (lo, hi, rl, rh)):
            arr[which] = v
    fields = {"q_draft": q_draft, "p_draft": px, "q_cdf_lo": q_lo, "q_cdf_hi": q_hi, "q_rank_lo": qr_lo,
              "q_rank_hi": qr_hi, "stop_cdf_lo": s[0], "stop_cdf_hi": s[1], "stop_rank_lo": s[2],
              "stop_rank_hi": s[3]}
    return table([f"r{i}" for i in range(rounds)], np.zeros(rounds, np.int64), drafts, tokens, n, fields=fields)


BUGS = [("bonus from the wrong row", "bonus"), ("bonus from q", "bonus"), ("tempered drafts", "drafting"),
        ("residual from p", "rejection"), ("softmax residual", "rejection")]


@pytest.mark.parametrize("vocab, rounds, family", [(8, 100_000, "softmax"), (50_000, 150_000, "softmax"),
                                                   pytest.param(50_000, 1_000_000, "dirichlet", marks=pytest.mark.long)])
def test_correct_records_pass_and_each_bug_fails_at_its_stage(tmp_path, vocab, rounds, family):
    path = write_records(str(tmp_path / "ok.parquet"), simulate(vocab, rounds, family=family))
    report = audit(path)
    assert report.passed, report.table()
    for bug, stage in BUGS:
        path = write_records(str(tmp_path / "bad.parquet"), simulate(vocab, rounds, bug, seed=1, family=family))
        report = audit(path)
        assert not report.passed, (vocab, bug)
        named = set(report.broken_stages()) | {s for s in ("rejection", "bonus") if f"(stage: {s})" in
                                               report.first_violation()}
        assert stage in named, (vocab, bug, report.headline())


def test_the_rank_order_sees_what_the_id_order_misses_at_a_large_vocabulary(tmp_path):
    # a bonus from the wrong row at V = 50,000, Dirichlet(1) rows: the PIT in token-id order spreads it over
    # 2,500 tokens a bin, where each bin's mass is about 0.05 under either row; in rank order the first bins
    # hold the target's most probable tokens, which the wrong row rarely draws
    path = write_records(str(tmp_path / "bad.parquet"), simulate(50_000, 200_000, "bonus from the wrong row", 2,
                                                                 family="dirichlet"))
    c = audit(path).cases[0]
    rank, ids = c.test("stage:bonus[rank]"), c.test("stage:bonus")
    assert rank.statistic > 20 * ids.statistic, (rank.detail, ids.detail)  # chi-square on 19 dof, both
