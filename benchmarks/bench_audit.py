"""Audit throughput: compact records audited per second, in one process and in two.

    python benchmarks/bench_audit.py [ROUNDS]   (default 2,000,000)

Records ROUNDS rounds of a correct numpy sampler (``tests/test_host.py``'s standard rule; k = 4, V = 8, compact fields only) to a
Parquet file in row groups of 131,072 rounds, then audits it serially and with ``workers=2``
(best of three each; the parallel run includes starting its processes). The baseline is the serial
rate measured in the same run. Two files: ``repeated`` (four context-free pairs, as
``record_sampler`` writes: their probabilities repeat and compress to about 16 bytes a round) and
``distinct`` (every round its own random rows, as a language model's are: nothing repeats, about
100 bytes a round on disk).
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
        for kind in ("repeated", "distinct"):
            path = os.path.join(tmp, f"{kind}.parquet")
            if kind == "repeated":
                record_sampler(standard_np, path, rounds=rounds, batch=65_536)
            else:
                _record_distinct(standard_np, path, rounds)
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
