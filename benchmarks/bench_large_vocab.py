"""The serving-vocabulary cases and the default battery, before and after a change: wall time and rounds/s.

Runs ``specsample verify`` in fresh processes from one or more source trees (a checkout of an older
commit, made with ``git worktree add``, beside this one), each command ``--repeat`` times, warm (a first
run fills the compile cache and is not counted), and prints the range of wall times and, for each
large-vocabulary case, its rounds, its rounds per second of the run's wall time and its claim (min
detectable TV):

    git worktree add /tmp/before a3f9cff~1
    python benchmarks/bench_large_vocab.py /tmp/before . --repeat 3

Quote the numbers with the date, the machine and both commits (``docs/engine.md``'s table of times).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def run(tree: str, args: list) -> tuple[float, dict]:
    out = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "specsample", "verify", *args, "--no-progress", "--json", out],
                   env=env, cwd=os.path.abspath(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    try:
        with open(out) as f:
            report = json.load(f)
    except (OSError, ValueError):
        report = {}
    os.unlink(out)
    return wall, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trees", nargs="+", help="source trees to compare (the first is the baseline)")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    for label, args in (("large-vocab case", ["--cases", "large-vocab*"]), ("default battery", [])):
        for tree in a.trees:
            run(tree, args)  # warm: the compile cache filled
            walls, rep = [], {}
            for _ in range(a.repeat):
                w, rep = run(tree, args)
                walls.append(w)
            print(f"{label:17s} {tree:24s} wall {min(walls):6.1f}-{max(walls):6.1f} s  verdict {rep.get('verdict')}")
            serving = [c for c in rep.get("cases", []) if c.get("name", "").startswith("large-vocab")]
            for case in serving:  # each serving-vocabulary case: its rounds and its token-law claim
                rounds = case.get("rounds") or 0
                print(f"    {case['name']:28s} rounds {rounds:>10,}  rounds/s of wall {rounds / min(walls):>10,.0f}  "
                      f"min TV {case.get('min_detectable_tv')}")


if __name__ == "__main__":
    main()
