"""The end-to-end mode's own false-alarm rate: a correct loop verified at the quick budget, many seeds.

    python benchmarks/e2e_false_alarms.py [RUNS]   (default 40)

The loop is the one of ``tests/test_e2e.py``: speculative sampling over two random bigram tables
(V = 5, k = 3), tested on its first 3 tokens (exact mode: the joint of 125 cells and every
position), the boundary pass included. Each run has its own seed; a run fails when any test is
rejected at Holm family-wise alpha = 0.01, so the rate must not exceed 0.01 (one-sided binomial).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import stats  # noqa: E402
from specsample.loops import verify as e2e  # noqa: E402
from test_e2e import bigram, next_token_of, speculative_generate  # noqa: E402


def main(runs: int = 40) -> dict:
    p, q = bigram(1), bigram(2)
    t0 = time.perf_counter()
    fails = narrow = 0
    for s in range(runs):
        r = e2e.verify_generate(next_token_of(p), speculative_generate(p, q), [3], length=3, budget="quick",
                                seed=1000 + s)
        fails += not r.passed
        narrow += (not r.passed) and r.narrow
    test = stats.rejection_rate(fails, runs, 0.01)
    print(f"{runs} runs of a correct loop at --budget quick ({r.cases[0].sequences:,} sequences each): {fails} "
          f"false alarms ({narrow} narrow); one-sided binomial p against alpha = 0.01: {test.pvalue:.3f}; "
          f"{time.perf_counter() - t0:.0f} s")
    return {"runs": runs, "false_alarms": fails, "narrow": narrow, "pvalue": test.pvalue}


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
