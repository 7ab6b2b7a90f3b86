"""Decoding cost: greedy, DP-MAP and brute-force MAP over T, V and m, with fitted exponents.

    python benchmarks/bench_decode.py [--json PATH]

Prints the README's scaling table (best of three timings per point) and the greedy-vs-MAP
study over random n-gram models.
"""

import argparse
import json

import numpy as np

from specsample import decode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--models", type=int, default=1000)
    args = ap.parse_args()
    res = decode.scaling(repeats=3)
    print("| series | points (size: seconds) | fitted |")
    print("|---|---|---|")
    for name, s in res.items():
        key = "vocab" if s["axis"] == "V" else "length"
        pts = ", ".join(f"{p[key]}: {p['seconds']:.3g}" for p in s["points"])
        fit = f"~ {s['fit']:.2f}^T" if s["axis"] == "base" else f"~ {s['axis']}^{s['fit']:.2f}"
        print(f"| {name} | {pts} | {fit} |")
    study = {}
    print("\n| V | order | Dirichlet | greedy is not MAP | median p(greedy)/p(MAP) where not | 5th percentile |")
    print("|---|---|---|---|---|---|")
    for v, m, conc in [(4, 1, 1.0), (4, 1, 0.3), (4, 2, 1.0), (8, 1, 1.0)]:
        r = decode.greedy_vs_map(args.models, vocab=v, order=m, length=8, concentration=conc)
        worse = r.ratio[r.ratio < 1 - 1e-12]
        study[f"V{v}-m{m}-dir{conc:g}"] = {"fraction_differ": r.fraction_differ,
                                           "ratio_quantiles": np.quantile(r.ratio, [0.05, 0.5]).tolist()}
        print(f"| {v} | {m} | {conc:g} | {r.fraction_differ:.1%} | {np.median(worse):.3f} | "
              f"{np.quantile(worse, 0.05):.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scaling": res, "greedy_vs_map": study}, f, indent=2)


if __name__ == "__main__":
    main()
