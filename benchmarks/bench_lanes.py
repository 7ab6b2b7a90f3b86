"""Engine rounds/s against the block's width (lanes run side by side), on this machine's default device.

    python benchmarks/bench_lanes.py [--grid 64:4,32768:4] [--lanes 1024,4096,65536] [--schemes standard,tree]
    python benchmarks/bench_lanes.py --schemes cached --grid 32:4 --lanes 64,1024,8192

The battery's blocks are 1024 lanes wide (``specsample bench``: 4096; a transformer case's: 64), which
fills two CPU cores; a GPU runs each round's small operations as kernels over the lanes, so its rate
depends on how many run side by side. Each row is one scheme, V, k and width: rounds/s (best of three
timed runs after a compile run, each at least 2^22 sequences of a Dirichlet pair; 2^15 for a scheme over
transformers, on the battery's close pair of vocabulary V) and the ratio to the first width's in the same
run. Lanes are part of the definition of the random stream, so widths give different (equally valid)
counts; the battery's width is not changed by this benchmark.
"""

from __future__ import annotations

import argparse

from specsample.models.pairs import make_pair, neural_pair  # first: on CPU, specsample gives every core a device
from specsample.schemes import StatefulStep, make_scheme

import jax  # noqa: E402
from bench_trees import rate as tree_rate  # noqa: E402 - a script's folder is on its path


def rate(scheme_name: str, vocab: int, k: int, lanes: int, *, sequences: int = 1 << 22, repeat: int = 3) -> float:
    """Best rounds/s of ``repeat`` timed runs of ``sequences`` (rounded up to whole blocks; at most 2^15 over
    transformers) after a compile run (:func:`bench_trees.rate`)."""
    scheme = make_scheme(scheme_name, k)
    if isinstance(scheme.step, StatefulStep):  # rounds over transformers: their KV caches ride in the lanes
        pair = neural_pair("transformer-close", 0, vocab, prompt_len=2)
        per_lane, kw, sequences = max(1, (1 << 10) // lanes), dict(prompt=pair.prompt), min(sequences, 1 << 15)
    else:
        pair, per_lane, kw = make_pair("dirichlet", 0, vocab), max(1, (1 << 18) // lanes), {}
    return tree_rate(scheme, pair, sequences, k + 2, lanes, per_lane, repeat, **kw)[0]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="64:4,32768:4", help="V:k points, comma-separated")
    ap.add_argument("--lanes", default="1024,4096,16384,65536,262144", help="block widths, comma-separated")
    ap.add_argument("--schemes", default="standard", help="registered scheme names, comma-separated")
    a = ap.parse_args(argv)
    grid = [tuple(int(x) for x in p.split(":")) for p in a.grid.split(",")]
    widths = [int(x) for x in a.lanes.split(",")]
    print(f"backend: {jax.default_backend()}, devices: {jax.devices()}")
    print(f"{'scheme':>10} {'V':>6} {'k':>2} {'lanes':>7} {'rounds/s':>10} {'x first':>8}")
    for name in a.schemes.split(","):
        for vocab, k in grid:
            first = None
            for lanes in widths:
                r = rate(name, vocab, k, lanes)
                first = first or r
                print(f"{name:>10} {vocab:>6} {k:>2} {lanes:>7} {r:>10.3g} {r / first:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
