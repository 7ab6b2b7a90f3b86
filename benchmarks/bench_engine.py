"""Benchmark: engine rounds/s for the standard scheme (V=64, k=4, Dirichlet pair), next to
a vectorised numpy implementation and the raw random-number rate, all measured in this run.

    python benchmarks/bench_engine.py [--json out.json]
"""

import argparse

from specsample.bench import main

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    main(grid=((64, 4),), json_path=args.json)
