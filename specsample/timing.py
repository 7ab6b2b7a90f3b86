"""Best-of timing, shared by the benchmarks (numpy only: no JAX, no matplotlib)."""

from __future__ import annotations

import time


def best_of(fn, repeat: int = 3, warmup: bool = False) -> float:
    """The shortest wall time of ``repeat`` calls of ``fn`` (seconds).

    The minimum is the least disturbed by other load on a shared machine. ``warmup`` makes one
    untimed call first (a JAX function's compile).
    """
    if warmup:
        fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
