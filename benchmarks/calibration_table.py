"""The README's table of the suite's own error rates (issue 7), measured in one run.

    python benchmarks/calibration_table.py [--runs 100] [--control-runs 10] [--peer-reps 20] [--json out.json]

Prints markdown: false-alarm rate of the standard scheme over independent quick batteries,
detection rate of every control next to its predicted lower bound, peers' criteria on equal
samples, and the minimum detectable deviation by bisection against the prediction.
"""

import argparse
import json

import specsample

specsample.use_all_cpu_cores()

from specsample.calibrate import calibrate, min_detectable_deviation, peer_comparison  # noqa: E402
from specsample.schemes import CONTROLS  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=100)
ap.add_argument("--control-runs", type=int, default=10)
ap.add_argument("--peer-reps", type=int, default=20)
ap.add_argument("--json", default=None)
args = ap.parse_args()

out = {}
print("| scheme | runs | rejected | rate (95% CI) | predicted detection (lower bound) |")
print("|---|---|---|---|---|")
if args.runs:  # --runs 0 skips the (long) false-alarm measurement
    std = calibrate("standard", args.runs, budget="quick")
    out["standard"] = std.__dict__
    print(f"| `standard` (lossless) | {std.runs} | {std.rejections} | {std.rate:.3f} ({std.low:.3f}-{std.high:.3f}) "
          f"| alpha = 0.01; KS of position[0] p-values p = {std.uniformity_pvalue:.2f} |", flush=True)
for name in CONTROLS:
    r = calibrate(name, args.control_runs, budget="quick")
    out[name] = r.__dict__
    pred = "-" if r.predicted_detection != r.predicted_detection else f"{r.predicted_detection:.3f}"
    print(f"| `{name}` | {r.runs} | {r.rejections} | {r.rate:.3f} ({r.low:.3f}-{r.high:.3f}) | {pred} |", flush=True)

rows = peer_comparison(["standard"] + list(CONTROLS), reps=args.peer_reps)
out["peers"] = rows
crit = list(rows[0]["detection"])
print()
print("| scheme | first-token TV | " + " | ".join(crit) + " |")
print("|---|---|" + "---|" * len(crit))
for r in rows:
    print(f"| `{r['scheme']}` | {r['first_token_tv']:.4f} | " + " | ".join(f"{r['detection'][c]:.2f}" for c in crit) + " |",
          flush=True)

print()
print("| N | Holm level | observed min TV (bisection) | predicted for that alternative | worst case over all alternatives |")
print("|---|---|---|---|---|")
for n, level in ((1 << 15, 0.01 / 300), (1 << 21, 0.01 / 672)):
    d = min_detectable_deviation(n, alpha=level)
    out.setdefault("min_detectable", []).append(d)
    print(f"| {n} | {level:.2g} | {d['observed_tv']:.4f} | {d['predicted_tv']:.4f} | {d['worst_case_tv']:.4f} |", flush=True)
if args.json:
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2, default=str)
