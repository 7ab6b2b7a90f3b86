"""Benchmark: engine rounds/s for the standard scheme (Dirichlet pairs) over a V x k grid,
next to vectorised numpy and torch implementations and the raw random-number rate, all
measured in this run. The same as ``specsample bench``.

    python benchmarks/bench_engine.py [--grid 64:4,8:4] [--json out.json]
"""

import sys

from specsample.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
