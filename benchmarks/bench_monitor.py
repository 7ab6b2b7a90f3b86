"""Detection delay of the live monitor (``specsample audit --follow``) against the size of a deviation.

A correct engine's PIT values are uniform; a broken stage moves mass. For each deviation (its total
variation in the 20-bin PIT law, and its shape) this simulates streams of PIT draws and reports the
median and 90th-percentile number of draws until the alarm, at alpha = 0.01:

* ``anytime``: the monitor's e-process (Dirichlet mixtures over 2, 4, 10 and 20 bins and over each
  bin against the rest, averaged),
  read after every file of ``--file`` draws; its false-alarm bound holds over the whole stream;
* ``repeated``: what re-running a fixed-size audit gives: the 20-bin chi-square on all draws so far
  after every ``--every`` draws, look j at level alpha / (j (j + 1)) (Bonferroni over an unbounded
  number of looks, so that it too keeps alpha over the stream);
* ``one look``: the draws a single fixed-size chi-square needs for power 0.99 at alpha (it must be
  planned for a TV it cannot know, and says nothing before it is done).

Shapes: ``halves`` moves mass from the lower ten bins to the upper ten (a broad shift, as a residual
taken from the wrong law gives); ``spike`` moves it from every bin into one (a narrow one, as a few
tokens favoured).

Run: ``python benchmarks/bench_monitor.py [--streams 50] [--file 1000] [--every 10000]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import stats as sps

from stats import anytime, min_detectable_tv

BINS, ALPHA = 20, 0.01
VIEWS = anytime.coarsenings(BINS)
UNIFORM = np.full(BINS, 1 / BINS)


def law(shape: str, tv: float) -> np.ndarray:
    f = UNIFORM.copy()
    if shape == "halves":
        f[: BINS // 2] -= tv / (BINS // 2)
        f[BINS // 2:] += tv / (BINS // 2)
    else:
        f -= tv / (BINS - 1)
        f[0] = UNIFORM[0] + tv
        f[1:] = UNIFORM[1:] - tv / (BINS - 1)
    return f


def delay_anytime(cells: np.ndarray, file: int) -> float:
    counts = np.zeros(BINS)
    line = np.log(1 / ALPHA)
    for end in range(file, cells.size + 1, file):
        counts += np.bincount(cells[end - file:end], minlength=BINS)
        if anytime.multiscale_log_e(counts, UNIFORM, VIEWS) >= line:
            return end
    return np.inf


def delay_repeated(cells: np.ndarray, every: int) -> float:
    counts = np.zeros(BINS)
    for j, end in enumerate(range(every, cells.size + 1, every), 1):
        counts += np.bincount(cells[end - every:end], minlength=BINS)
        if sps.chisquare(counts).pvalue <= anytime.alpha_share(ALPHA, j):
            return end
    return np.inf


def one_look(tv: float) -> int:
    lo, hi = 10, 10 ** 9
    while hi - lo > max(1, lo // 200):  # the smallest n whose min detectable TV reaches tv
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if min_detectable_tv(mid, BINS - 1, ALPHA, 0.99).tv > tv else (lo, mid)
    return hi


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--file", type=int, default=1000, help="draws a record file holds (the monitor's look)")
    ap.add_argument("--every", type=int, default=10_000, help="draws between two runs of the repeated audit")
    ap.add_argument("--max", type=int, default=2_000_000, help="draws a stream lasts at most")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    print(f"alpha {ALPHA}, {args.streams} streams a row; anytime read every {args.file:,} draws, the repeated "
          f"audit every {args.every:,}")
    print(f"{'shape':7s} {'TV':>6s} {'anytime median':>15s} {'p90':>10s} {'repeated median':>16s} {'p90':>10s} "
          f"{'one look':>10s}")
    for shape in ("halves", "spike"):
        for tv in (0.1, 0.05, 0.02, 0.01):
            f = law(shape, tv)
            n = min(args.max, 200 * one_look(tv))
            a, r = [], []
            for _ in range(args.streams):
                cells = rng.choice(BINS, size=n, p=f)
                a.append(delay_anytime(cells, args.file))
                r.append(delay_repeated(cells, args.every))
            print(f"{shape:7s} {tv:6.2f} {np.median(a):15,.0f} {np.percentile(a, 90):10,.0f} {np.median(r):16,.0f} "
                  f"{np.percentile(r, 90):10,.0f} {one_look(tv):10,}")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
