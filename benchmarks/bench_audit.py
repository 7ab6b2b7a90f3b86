"""Audit throughput: compact records audited per second, in one process and with ``workers=2``.

    python benchmarks/bench_audit.py [ROUNDS]   (default 2,000,000)

Records ROUNDS rounds of a correct sampler of the standard rule (k = 4, compact fields of format 2
only) to a Parquet file in row groups of 131,072 rounds, then audits it serially and with
``workers=2`` (best of three each; a parallel run includes starting its processes, and on a machine
of fewer than four cores ``audit`` counts in one process and says so). The baseline is the serial
rate measured in the same run. Three files:

* ``repeated``: ``tests/test_host.py``'s numpy rule on four context-free pairs at V = 8, as
  ``record_sampler`` writes them: their probabilities repeat and compress to about 20 bytes a round;
* ``distinct``: the same rule, every round on its own random rows at V = 8 (Dirichlet(1)), as a
  language model's are: nothing repeats, about 230 bytes a round;
* ``V50000``: V = 50,000, each slot's rows one of 32 Dirichlet(1) pairs drawn at random, token ids
  spread over the vocabulary as a serving engine's are, requests of 128 rounds (about 254 bytes a
  round): the scale the audit's serial rate is held to (2e6 rounds/s on two cores).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time


def main(rounds: int = 2_000_000) -> dict:
    # imported here, not at the top: worker processes start by importing this script (spawn), and
    # the recorder's imports (JAX, through the pair families) would cost each of them seconds
    from specsample.audit import audit, record_sampler

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from test_host import standard_np  # the tests' numpy standard rule

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("repeated", "distinct", "V50000"):
            path = os.path.join(tmp, f"{kind}.parquet")
            if kind == "repeated":
                record_sampler(standard_np, path, rounds=rounds, batch=65_536)
            elif kind == "distinct":
                _record_distinct(standard_np, path, rounds)
            else:
                _record_vocab(path, rounds)
            size = os.path.getsize(path)
            rates = {}
            for workers in (1, 2):
                best = float("inf")
                for _ in range(3):
                    t = time.perf_counter()
                    report = audit(path, workers=workers)
                    best = min(best, time.perf_counter() - t)
                assert report.passed, report.table()
                rates[workers] = rounds / best
            print(f"{rounds:,} compact rounds, {kind} rows ({size / rounds:.1f} bytes a round on disk)")
            for w, r in rates.items():
                print(f"  workers={w}: {r:,.0f} rounds/s ({r / rates[1]:.2f} x serial)")
            out[kind] = rates
    return out


def _laws(vocab: int, contexts: int, rng) -> dict:
    """``contexts`` Dirichlet(1) pairs over ``vocab`` tokens: q, p, the residual norm(max(0, p - q)), and
    for each law its inclusive CDF in token-id order and the mass ranked before each token (most probable
    first, ties by id), as the compact fields need them."""
    import numpy as np

    q, p = rng.dirichlet(np.ones(vocab), contexts), rng.dirichlet(np.ones(vocab), contexts)
    res = np.maximum(p - q, 0.0)
    res /= res.sum(-1, keepdims=True)
    out = {"q": q, "p": p, "r": res}
    for name in ("q", "p", "r"):
        law = out[name]
        out[name + "_cdf"] = np.cumsum(law, -1)
        order = np.lexsort((np.broadcast_to(np.arange(vocab), law.shape), -law), axis=-1)
        ranked = np.take_along_axis(law, order, -1)
        before = np.empty_like(law)
        np.put_along_axis(before, order, np.cumsum(ranked, -1) - ranked, -1)
        out[name + "_rank"] = before
    return out


def _draw(laws: dict, name: str, ctx, u):
    """Inverse-CDF draws from ``laws[name]``'s rows ``ctx`` with uniforms ``u`` (one search over all rows)."""
    import numpy as np

    cdf = laws[name + "_cdf"]
    c, v = cdf.shape
    flat = (cdf + np.arange(c)[:, None]).ravel()
    return np.minimum(np.searchsorted(flat, ctx + u * cdf[ctx, -1], side="right") - ctx * v, v - 1)


def _record_vocab(path: str, rounds: int, k: int = 4, vocab: int = 50_000, contexts: int = 32,
                  batch: int = 65_536) -> None:
    """``rounds`` rounds of the standard rule at ``vocab`` tokens, compact fields (format 2) only, written
    without full rows: each slot's rows are one of ``contexts`` Dirichlet(1) pairs, drawn at random, so
    the token ids spread over the vocabulary as a serving engine's do; requests of 128 rounds each."""
    import numpy as np

    from specsample.audit.records import table, write_records

    rng = np.random.default_rng(1)
    laws = _laws(vocab, contexts, rng)
    tables = []
    for start in range(0, rounds, batch):
        b = min(batch, rounds - start)
        ctx = rng.integers(0, contexts, (b, k + 1))
        drafts = _draw(laws, "q", ctx[:, :k], rng.random((b, k)))
        qx, px = laws["q"][ctx[:, :k], drafts], laws["p"][ctx[:, :k], drafts]
        accepted = rng.random((b, k)) < np.minimum(1.0, px / qx)
        n_acc = np.where(accepted.all(1), k, np.argmin(accepted, 1))
        rows = np.arange(b)
        bonus = n_acc == k
        stop_ctx = ctx[rows, n_acc]
        y = np.where(bonus, _draw(laws, "p", stop_ctx, rng.random(b)), _draw(laws, "r", stop_ctx, rng.random(b)))
        tokens = np.concatenate([drafts, np.zeros((b, 1), np.int64)], 1)
        tokens[rows, n_acc] = y
        stop = {end: np.where(bonus, laws["p" + end][stop_ctx, y], laws["r" + end][stop_ctx, y])
                for end in ("", "_cdf", "_rank")}
        fields = {"q_draft": qx, "p_draft": px,
                  "q_cdf_lo": laws["q_cdf"][ctx[:, :k], drafts] - qx, "q_cdf_hi": laws["q_cdf"][ctx[:, :k], drafts],
                  "q_rank_lo": laws["q_rank"][ctx[:, :k], drafts], "stop_cdf_hi": stop["_cdf"],
                  "stop_cdf_lo": stop["_cdf"] - stop[""], "stop_rank_lo": stop["_rank"],
                  "stop_rank_hi": stop["_rank"] + stop[""]}
        fields["q_rank_hi"] = fields["q_rank_lo"] + qx
        i = np.arange(start, start + b)
        tables.append(table(np.char.add("request-", (i // 128).astype(str)), i % 128, drafts, tokens, n_acc + 1,
                            fields=fields))
    write_records(path, tables)


def _record_distinct(fn, path: str, rounds: int, k: int = 4, vocab: int = 8, batch: int = 65_536) -> None:
    """``rounds`` rounds of ``fn``, each on its own random rows (Dirichlet(1)), compact fields only."""
    import numpy as np

    from specsample.audit.records import table, write_records

    rng = np.random.default_rng(0)
    tables = []
    for start in range(0, rounds, batch):
        b = min(batch, rounds - start)
        q, p = rng.dirichlet(np.ones(vocab), (b, k)), rng.dirichlet(np.ones(vocab), (b, k + 1))
        cdf = np.cumsum(q, -1)
        drafts = np.minimum((cdf <= rng.random((b, k, 1)) * cdf[..., -1:]).sum(-1), vocab - 1)
        tokens, n = fn(drafts, q, p, rng)
        tables.append(table("distinct", np.arange(start, start + b), drafts, tokens, n, q, p))
    write_records(path, tables)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
