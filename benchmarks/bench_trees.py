"""Engine rounds/s for token-tree rounds, against chain rounds measured in the same run.

    python benchmarks/bench_trees.py [--quick]

Two tables for the README:

1. table pairs (context-free Dirichlet, V = 8 at k = 1..4 and V = 64 at k = 4, L = k + 2, the
   battery's block shape): rounds/s and tokens/s of ``standard`` (the baseline, depth k) and of the
   three tree rules with the default tree of the same depth, each as a ratio to the baseline;
2. transformer pairs (the battery's close V = 32 pair, k = 4): ``cached`` (the chain with KV caches)
   against ``tree-cached`` (tree attention, compaction), rounds/s and tokens/s, with the positions a
   round scores (:func:`by_branching` for the default tree).

    python benchmarks/bench_trees.py --branchings

times ``tree-cached`` instead over trees of depth 4 from the chain (1, 1, 1, 1) to the default (3, 2, 1, 1),
with the positions each round passes through the two networks: what a tree over transformers costs
on this machine, node by node (the chain tree shows the cost of the tree machinery alone).

Every rate is the best of three timed runs after a compile run: on a shared machine the best is
the least disturbed. Ratios, not seconds, are what carries over between machines.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from specsample.engine import lanes as engine
from specsample.battery.suite import NEURAL_BLOCK
from specsample.models.pairs import make_pair, neural_pair
from specsample.schemes import make_scheme
from specsample.schemes.tree import default_branching, level_sizes
from specsample.models.tree_attention import tree_nodes


def rate(scheme, pair, sequences, length, lanes, per_lane, repeat=3, **kw):
    """(rounds/s, tokens/s) of the best of ``repeat`` runs, after a compile run."""
    run = dict(length=length, lanes=lanes, per_lane=per_lane, **kw)
    engine.run(scheme, pair.target, pair.draft, sequences=lanes * per_lane, seed=0, **run)
    best = (0.0, 0.0)
    for i in range(repeat):
        t0 = time.perf_counter()
        c = engine.run(scheme, pair.target, pair.draft, sequences=sequences, seed=1 + i, **run)
        dt = time.perf_counter() - t0
        rounds = float(c.rounds.sum())
        tokens = float((c.emitted.sum(axis=0) * np.arange(c.emitted.shape[-1])).sum())
        best = max(best, (rounds / dt, tokens / dt))
    return best


def main(quick: bool = False):
    # long enough that a run's fixed cost (the pair's tables, dispatch) is a few percent of it: at 2^20
    # sequences `standard` ran for 0.05 s on a quiet machine and the ratios measured set-up, not rounds
    seqs = 1 << (16 if quick else 23)
    print("| V | k | scheme | nodes per round | rounds/s | tokens/s | rounds/s vs standard | tokens/s vs standard |")
    print("|---|---|---|---|---|---|---|---|")
    # the battery's block shape at V = 8 for every depth, and the V = 64, k = 4 point of issue #30
    for vocab, ks in ((8, (1, 3)),) if quick else ((8, (1, 2, 3, 4)), (64, (4,))):
        pair = make_pair("dirichlet", 0, vocab)
        for k in ks:
            base = rate(make_scheme("standard", k), pair, seqs, k + 2, 4096, 64)
            print(f"| {vocab} | {k} | standard | {k} | {base[0]:.3g} | {base[1]:.3g} | 1 | 1 |")
            for name in ("tree", "tree-wor", "tree-topk"):
                r = rate(make_scheme(name, k), pair, seqs, k + 2, 4096, 64)
                print(f"| {vocab} | {k} | {name} {default_branching(k)} | {tree_nodes(default_branching(k))} | "
                      f"{r[0]:.3g} | {r[1]:.3g} | {r[0] / base[0]:.2f} | {r[1] / base[1]:.2f} |", flush=True)
    print()
    by_branching((default_branching(4),), 1 << (12 if quick else 15))


BRANCHINGS = ((1, 1, 1, 1), (2, 1, 1, 1), (3, 1, 1, 1), (2, 2, 1, 1), (4, 1, 1, 1), (3, 2, 1, 1))


def scored_positions(branching: tuple) -> int:
    """Positions a tree round passes through the two networks, the draft's pending tokens aside: every
    node of every level but the deepest through the draft (the deepest is drawn, never fed), then the
    root and every node through the target. The chain (1, ..., 1) of depth k: 2k, as ``cached``."""
    sizes = level_sizes(branching)
    return sum(sizes[:-1]) + 1 + sum(sizes)


def by_branching(branchings=BRANCHINGS, sequences: int = 1 << 15):
    """``tree-cached`` against ``cached`` (the transformer pair, k = 4) over trees of depth 4."""
    from specsample.schemes.tree_cached import tree_cached

    neural = neural_pair("transformer-close", 0, 32, prompt_len=2)
    lanes, per_lane = NEURAL_BLOCK
    run = dict(lanes=lanes, per_lane=per_lane, prompt=neural.prompt)
    base = rate(make_scheme("cached", 4), neural, sequences, 6, **run)
    print("| transformer pair (V = 32, k = 4) | positions a round | rounds/s | tokens/s | rounds/s vs cached "
          "| tokens/s vs cached |")
    print("|---|---|---|---|---|---|")
    print(f"| cached (chain, KV caches) | {scored_positions((1,) * 4)} | {base[0]:.3g} | {base[1]:.3g} | 1 | 1 |")
    for br in branchings:
        r = rate(tree_cached(branching=br), neural, sequences, 6, **run)
        print(f"| tree-cached {br} | {scored_positions(br)} | {r[0]:.3g} | {r[1]:.3g} | {r[0] / base[0]:.2f} | "
              f"{r[1] / base[1]:.2f} |", flush=True)


if __name__ == "__main__":
    if "--branchings" in sys.argv:
        by_branching()
    else:
        main(quick="--quick" in sys.argv)
