"""The KV-cache schemes through the battery, repeatedly: false alarms of `cached`, rejections of
every cache control, and each control's simulated deviation from the exact laws.

    python benchmarks/kv_controls.py [--runs 20] [--control-runs 10] [--deviation-sequences 131072]

Prints markdown tables (the README's numbers come from here) and writes kv_controls.json.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import stats
from specsample.battery import suite as battery
from specsample.engine import lanes as engine
from specsample.laws import exact
from specsample.schemes import CONTROLS, make_scheme
from specsample.schemes.cached import CACHE_CONTROLS, differential_check

CASES = ("transformer-close/V8/k4", "transformer-far/V8/k4")


def repeated(name: str, runs: int, budget: str, seed0: int) -> dict:
    fails, secs, worst = 0, [], []
    for s in range(runs):
        t0 = time.perf_counter()
        r = battery.verify(name, budget=budget, seed=seed0 + s)
        secs.append(time.perf_counter() - t0)
        fails += not r.passed
        worst.append(min(t.adjusted for c in r.cases for t in c.tests))
    return dict(scheme=name, budget=budget, runs=runs, failed=fails, seconds=secs,
                smallest_adjusted_p=[float(w) for w in worst])


def deviation(name: str, case_name: str, sequences: int, seed: int = 0) -> dict:
    case = next(c for c in battery.default_cases(battery.BUDGETS["default"]) if c.name == case_name)
    pair = case.pair(seed)
    c = engine.run(make_scheme(name, case.k), pair.target, pair.draft, sequences=sequences, length=case.length,
                   seed=seed, lanes=256, per_lane=4, prompt=pair.prompt).pair(0)
    p_rows = exact.prefix_rows(pair.target, pair.prompt, case.length)
    q_rows = exact.prefix_rows(pair.draft, pair.prompt, case.length)
    joint = exact.joint_from_rows(p_rows)
    rounds = exact.standard_rounds_law(p_rows, q_rows, case.k)
    tv_joint = 0.5 * float(np.abs(c.joint / c.sequences - joint).sum())
    tv_rounds = 0.5 * float(np.abs(c.rounds_per_sequence / c.sequences - rounds).sum())
    return dict(scheme=name, case=case_name, sequences=int(c.sequences), tv_joint=tv_joint, tv_rounds=tv_rounds,
                acceptance=float(c.draft_accepted.sum() / c.drafted.sum()),
                tokens_per_round=float((c.emitted * np.arange(c.emitted.size)).sum() / c.rounds))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--control-runs", type=int, default=10)
    ap.add_argument("--default-runs", type=int, default=1)
    ap.add_argument("--deviation-sequences", type=int, default=1 << 17)
    ap.add_argument("--json", default="kv_controls.json")
    a = ap.parse_args()
    out = {"repeated": [], "deviation": [], "differential": []}
    rows = [("cached", a.runs, "quick", 1000), ("recompute", max(1, a.runs // 4), "quick", 2000)]
    rows += [(n, a.control_runs, "quick", 3000) for n in CACHE_CONTROLS]
    rows += [(n, a.default_runs, "default", 4000) for n in ["cached", *CACHE_CONTROLS]]
    print("| scheme | budget | runs | failed | seconds per run (median) |\n|---|---|---|---|---|")
    for name, runs, budget, seed0 in rows:
        if runs < 1:
            continue
        r = repeated(name, runs, budget, seed0)
        out["repeated"].append(r)
        print(f"| {name} | {budget} | {runs} | {r['failed']} | {np.median(r['seconds']):.1f} |", flush=True)
    print("\n| scheme | case | TV joint | TV rounds/sequence | acceptance | tokens/round |\n|---|---|---|---|---|---|")
    for name in ["cached", *CACHE_CONTROLS]:
        for case in CASES:
            d = deviation(name, case, a.deviation_sequences)
            out["deviation"].append(d)
            print(f"| {name} | {case} | {d['tv_joint']:.4f} | {d['tv_rounds']:.4f} | {d['acceptance']:.3f} | "
                  f"{d['tokens_per_round']:.2f} |", flush=True)
    print("\n| pair | V | k | rounds | differing |\n|---|---|---|---|---|")
    from specsample.models.pairs import neural_pair

    for fam in ("transformer-close", "transformer-far"):
        for v, k in ((8, 1), (8, 4), (8, 8), (32, 4)):
            p = neural_pair(fam, 7, v, prompt_len=2)
            r = differential_check(p.target, p.draft, p.prompt, k=k, length=8, rounds=256, lanes=256)
            out["differential"].append(dict(family=fam, vocab=v, k=k, rounds=r.rounds, differing=r.differing))
            print(f"| {fam} | {v} | {k} | {r.rounds} | {r.differing} |", flush=True)
    fa = out["repeated"][0]
    print(f"\nfalse alarms of cached: {fa['failed']}/{fa['runs']}, one-sided binomial p against alpha = 0.01: "
          f"{stats.rejection_rate(fa['failed'], fa['runs'], 0.01).pvalue:.3g}")
    with open(a.json, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    assert set(CACHE_CONTROLS) <= set(CONTROLS)
    main()
