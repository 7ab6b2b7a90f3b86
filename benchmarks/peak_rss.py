"""Peak resident memory of one engine run against its number of rounds (V=64, k=4).

Each size runs in a fresh process, so its peak RSS (``resource.getrusage``) is its own:

    python benchmarks/peak_rss.py 1e7 1e9

Memory should not grow with rounds: counts accumulate on device in fixed-size chunks.
"""

import json
import subprocess
import sys

CHILD = r"""
import resource, sys, time, json
import specsample
specsample.use_all_cpu_cores()
from specsample import engine
from specsample.pairs import make_pair
from specsample.schemes import standard
rounds = float(sys.argv[1])
pair = make_pair("dirichlet", 0, 64)
scheme = standard(4)
# length 6 at k = 4 takes about 2.3 rounds per sequence on this pair; measure it first
probe = engine.run(scheme, pair.target, pair.draft, sequences=1 << 18, length=6, lanes=4096, per_lane=64)
per_seq = probe.rounds.sum() / probe.sequences.sum()
t0 = time.perf_counter()
c = engine.run(scheme, pair.target, pair.draft, sequences=int(rounds / per_seq), length=6, lanes=4096,
               per_lane=64, seed=1)
dt = time.perf_counter() - t0
print(json.dumps(dict(rounds=int(c.rounds.sum()), seconds=dt,
                      peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""


def main(sizes):
    for s in sizes:
        out = subprocess.run([sys.executable, "-c", CHILD, s], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"rounds {r['rounds']:.3g}: peak RSS {r['peak_rss_mib']:.0f} MiB, {r['seconds']:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:] or ["1e7", "1e9"])
