"""Audit throughput: compact records audited per second, in one process and in two.

    python benchmarks/bench_audit.py [ROUNDS]   (default 2,000,000)

Records ROUNDS rounds of a correct numpy sampler (k = 4, V = 8, compact fields only) to a
Parquet file in row groups of 131,072 rounds, then audits it serially and with ``workers=2``
(best of three each; the parallel run includes starting its processes). The baseline is the serial
rate measured in the same run.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np


def standard_np(drafts, q, p, rng):
    b, k = drafts.shape
    rows = np.arange(b)
    px = np.take_along_axis(p[:, :k], drafts[..., None], 2)[..., 0]
    qx = np.take_along_axis(q, drafts[..., None], 2)[..., 0]
    ok = rng.random((b, k)) * qx < px
    j = np.where(ok.all(1), k, np.argmin(ok, 1))
    q_j = np.where((j < k)[:, None], q[rows, np.minimum(j, k - 1)], 0.0)
    w = np.maximum(p[rows, j] - q_j, 0.0)
    w = np.where(w.sum(1, keepdims=True) > 0, w, p[rows, j])
    cdf = np.cumsum(w, 1)
    last = np.minimum((cdf <= (rng.random(b) * cdf[:, -1])[:, None]).sum(1), p.shape[-1] - 1)
    out = np.concatenate([drafts, np.zeros((b, 1), np.int64)], 1)
    out[rows, j] = last
    return out, j + 1


def main(rounds: int = 2_000_000) -> dict:
    # imported here, not at the top: worker processes start by importing this script (spawn), and
    # the recorder's imports (JAX, through the pair families) would cost each of them seconds
    from specsample.audit import audit, record_sampler

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
