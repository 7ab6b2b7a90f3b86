"""The README's diagnosis table (issue 23): every negative control against the stage the diagnosis names.

    python benchmarks/diagnosis_table.py [--seeds 0,1,2] [--calibration-runs 20] [--json out.json]

For each control, a quick battery (k = 4) per seed; the report's broken stages (with the number
of failing cases naming each) against the stage the control's bug lives in. Then the false-alarm
rate of the correct schemes with the stage tests in the Holm family, and how often a stage test
of theirs was rejected at all.
"""

import argparse
import json
import time

import specsample

specsample.use_all_cpu_cores()

import stats  # noqa: E402
from specsample import verify  # noqa: E402
from specsample.schemes import CONTROLS  # noqa: E402

# where each bug lives; a bug that changes two stages names both (see the README)
EXPECTED = {
    "control:softmax-residual": "rejection", "control:resample-from-p": "rejection",
    "control:epsilon-residual": "rejection", "control:reused-uniform": "rejection",
    "control:bonus-from-q": "bonus", "control:draft-temperature": "drafting",
    "control:accept-all": "acceptance", "control:shared-uniform": "acceptance", "control:lenient": "acceptance",
    "control:typical": "acceptance + rejection", "control:off-by-one": "acceptance",
    "control:le-acceptance": "(boundary pass: u = 0 only)",
    "control:no-residual-fallback": "(edge rows only: a float32 residual)",
    "control:tree-topk-no-renorm": "(no stage laws: tree rule)", "control:tree-bonus-parent-row": "(no stage laws: tree rule)",
    **{f"control:tree-{n}": "(no stage laws: tree rule)" for n in (
        "mask-siblings", "compact-first-branch", "flat-positions", "dynamic-wor-rerank", "dynamic-target-prune",
        "dynamic-orphan")},
    "control:target-cache-not-rolled-back": "acceptance + rejection",
    "control:draft-cache-not-rolled-back": "drafting (+ acceptance, rejection)",
    "control:last-token-not-in-draft-cache": "drafting (+ acceptance, rejection)",
    "control:bonus-not-in-target-cache": "acceptance + rejection",
}

ap = argparse.ArgumentParser()
ap.add_argument("--seeds", default="0,1,2")
ap.add_argument("--calibration-runs", type=int, default=20)
ap.add_argument("--json", default=None)
args = ap.parse_args()
seeds = [int(s) for s in args.seeds.split(",")]
out = {"controls": {}, "calibration": {}}

print("| control | bug lives in | " + " | ".join(f"seed {s}: stages named (cases)" for s in seeds) + " |")
print("|---|---|" + "---|" * len(seeds))
for name in CONTROLS:
    cells = []
    for s in seeds:
        t0 = time.perf_counter()
        rep = verify(name, budget="quick", seed=s, k=4)
        named = rep.broken_stages()
        out["controls"].setdefault(name, []).append(dict(seed=s, passed=rep.passed, failed=len(rep.failed_cases),
                                                         named=named, seconds=time.perf_counter() - t0))
        cell = ", ".join(f"{st} ({n})" for st, n in named.items()) if named else (
            "pass" if rep.passed else "not localised")
        cells.append(f"{cell} of {len(rep.failed_cases)}" if named else cell)
    print(f"| `{name}` | {EXPECTED.get(name, '?')} | " + " | ".join(cells) + " |", flush=True)

print()
print("| scheme | runs | run-level false alarms | rate (95% CI) | runs with a stage test rejected | stage tests | "
      "KS of stage p-values |")
print("|---|---|---|---|---|---|---|")
for name, runs in (("standard", args.calibration_runs), ("cached", max(1, args.calibration_runs // 4))):
    fails, stage_fails, pvals = 0, 0, []
    for r in range(runs):
        rep = verify(name, budget="quick", seed=1000 + r, k=4)
        fails += not rep.passed
        st = [t for c in rep.cases for t in c.tests if t.name.startswith("stage:")]
        stage_fails += any(t.rejected for t in st)
        pvals += [t.pvalue for t in st if t.dof > 0]
    ci = stats.rejection_rate(fails, runs, 0.01)
    ks = stats.uniformity_test(pvals).pvalue if pvals else float("nan")
    out["calibration"][name] = dict(runs=runs, fails=fails, stage_fails=stage_fails, n_stage_tests=len(pvals), ks=ks)
    print(f"| `{name}` | {runs} | {fails} | {ci.rate:.3f} ({ci.low:.3f}-{ci.high:.3f}) | {stage_fails} | {len(pvals)} "
          f"| p = {ks:.2f} |", flush=True)
if args.json:
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2, default=str)
