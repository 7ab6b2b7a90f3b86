"""Audit throughput: compact records audited per second, in one process and in two.

    python benchmarks/bench_audit.py [ROUNDS]   (default 2,000,000)

Records ROUNDS rounds of a correct numpy sampler (``tests/test_host.py``'s standard rule; k = 4, V = 8, compact fields only) to a
Parquet file in row groups of 131,072 rounds, then audits it serially and with ``workers=2``
(best of three each; the parallel run includes starting its processes). The baseline is the serial
rate measured in the same run.
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

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rounds.parquet")
        record_sampler(standard_np, path, rounds=rounds, batch=65_536)
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
    print(f"{rounds:,} compact rounds ({size / rounds:.1f} bytes a round on disk)")
    for w, r in rates.items():
        print(f"  workers={w}: {r:,.0f} rounds/s ({r / rates[1]:.2f} x serial)")
    return rates


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
