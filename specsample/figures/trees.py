"""What a token tree buys: tokens per target pass by tree shape and rule, exact and measured.

Every round is one target pass, so tokens per round *is* tokens per target pass. The exact values
come from :func:`specsample.laws.tree_exact.expected_accepted` (the oracle, drawn as lines), the markers
from the engine running the registered tree schemes on the same pairs. A chain of depth k is the
tree (1, ..., 1) (standard speculative sampling); the speed-up a tree buys at equal target passes
is its tokens per pass over the chain's of the same depth.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..engine import lanes as engine  # noqa: E402
from ..models.pairs import make_pair  # noqa: E402
from ..schemes import make_scheme  # noqa: E402
from ..schemes.tree import default_branching  # noqa: E402
from ..models.tree_attention import tree_nodes  # noqa: E402
from ..laws.tree_exact import tree_law  # noqa: E402

RULES = {"rrs": ("tree", "#1f77b4"), "rrs-wor": ("tree-wor", "#2ca02c"), "topk": ("tree-topk", "#d62728")}
CHAIN = "#7f7f7f"
FAMILIES = {  # shape families drawn as lines: name -> shape of depth d
    "(3, 2, 1, ...)": default_branching,
    "(2, 2, ...)": lambda d: (2,) * d,
    "(d + 1,) one level": lambda d: (d + 1,),
}
PAIRS = 4  # context-free V = 8 Dirichlet pairs the values are averaged over


def pairs(seed: int, n: int = PAIRS, family: str = "dirichlet") -> list:
    return [make_pair(family, seed * 1000 + i, 8) for i in range(n)]


_LEVEL: dict = {}


def _level_acceptance(rule: str, pair, b: int) -> float:
    """Probability that one of b children is accepted at a node (context-free pair: the same at every node)."""
    key = (rule, id(pair), b)
    if key not in _LEVEL:
        law = tree_law(rule, pair.target, pair.draft, (b,))(())
        _LEVEL[key] = (pair, float(sum(p for out, p in law.items() if len(out) == 2)))
    return _LEVEL[key][1]


def tokens_per_pass(rule: str, branching: tuple, prs: list) -> float:
    """Exact expected tokens per target pass (1 + accepted depth), averaged over context-free ``prs``.

    With context-free models every node has the same rows and its subtree was drafted independently,
    so the walk descends one level with probability a(b) whatever happened above: the accepted depth
    is a product of per-level acceptances, 1 + sum_d prod_{i <= d} a(b_i) tokens per pass (checked
    against the enumeration of :func:`specsample.laws.tree_exact.expected_accepted` in the tests).
    """
    out = []
    for p in prs:
        if p.target.order or p.draft.order:
            raise ValueError("tokens_per_pass takes context-free pairs; use tree_exact.expected_accepted")
        reach = np.cumprod([_level_acceptance(rule, p, int(b)) for b in branching])
        out.append(1.0 + float(reach.sum()))
    return float(np.mean(out))


def measured_tokens_per_pass(name: str, k: int, prs: list, sequences: int, seed: int) -> float:
    """Tokens per round of a registered scheme from engine runs on ``prs`` (pooled rounds)."""
    scheme = make_scheme(name, k)
    emitted = rounds = 0
    for i, p in enumerate(prs):
        c = engine.run(scheme, p.target, p.draft, sequences=sequences, length=4 * (k + 1), seed=seed + i,
                       lanes=256, per_lane=4).pair(0)
        emitted += float((c.emitted * np.arange(c.emitted.size)).sum())
        rounds += float(c.rounds)
    return emitted / rounds


def speedup_table(prs: list, depths=range(1, 6)) -> dict:
    """Tokens per pass of the default tree over the chain of the same depth, per rule: {rule: [ratios]}."""
    chain = [tokens_per_pass("rrs", (1,) * d, prs) for d in depths]
    return {rule: [tokens_per_pass(rule, default_branching(d), prs) / c for d, c in zip(depths, chain)]
            for rule in RULES}


def fig_trees(scale: float, seed: int):
    """Left: tokens per target pass against nodes per tree, per rule and shape family, the chain beside.
    Right: the speed-up at equal target passes (tree over chain of the same depth), oracle and engine."""
    prs = pairs(seed)
    n = max(256, int(2e4 * scale))
    measured_depths = (1, 2, 3) if scale < 0.5 else (1, 2, 3, 4)
    measured = {(name, d): measured_tokens_per_pass(name, d, prs, n, seed)
                for name in ["standard"] + [v[0] for v in RULES.values()] for d in measured_depths}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    ax = axes[0]
    chain_d = list(range(1, 9))
    ax.plot([tree_nodes((1,) * d) for d in chain_d], [tokens_per_pass("rrs", (1,) * d, prs) for d in chain_d],
            color=CHAIN, lw=2.5, label="chain (standard), k = 1..8")
    styles = ["-", "--", ":"]
    for rule, (_, colour) in RULES.items():
        for style, (fam, shape) in zip(styles, FAMILIES.items()):
            d_max = 5 if fam != "(d + 1,) one level" else 7
            shapes = [shape(d) for d in range(1, d_max + 1) if tree_nodes(shape(d)) <= 64]
            ax.plot([tree_nodes(s) for s in shapes], [tokens_per_pass(rule, s, prs) for s in shapes], style,
                    color=colour, alpha=0.85, label=f"{rule} {fam}")
    for rule, (name, colour) in RULES.items():
        xs = [tree_nodes(default_branching(d)) for d in measured_depths]
        ax.plot(xs, [measured[name, d] for d in measured_depths], "o", color=colour, mec="k", ms=6)
    ax.plot(list(measured_depths), [measured["standard", d] for d in measured_depths], "o", color=CHAIN, mec="k", ms=6, label="engine (markers)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("drafted nodes scored per target pass (tree size)")
    ax.set_ylabel("tokens per target pass")
    ax.set_title(f"Lines: exact oracle; markers: engine ({len(prs)} Dirichlet pairs, V = 8)")
    ax.legend(fontsize=6.5, ncol=2, loc="upper left")
    ax.grid(alpha=0.3)

    ax = axes[1]
    depths = list(range(1, 7))
    table = speedup_table(prs, depths)
    peaked = speedup_table(pairs(seed, family="dirichlet-peaked"), depths)
    for rule, (name, colour) in RULES.items():
        ax.plot(depths, table[rule], "-", color=colour, lw=2, label=f"{rule} tree (3, 2, 1, ...), Dirichlet")
        ax.plot(depths, peaked[rule], "--", color=colour, lw=1.5, label=f"{rule}, peaked Dirichlet (oracle only)")
        ratio = [measured[name, d] / measured["standard", d] for d in measured_depths]
        ax.plot(list(measured_depths), ratio, "o", color=colour, mec="k", ms=6)
    ax.axhline(1.0, color=CHAIN, lw=1)
    ax.set_xlabel("depth k (the chain it is compared with drafts k tokens)")
    ax.set_ylabel("tokens per pass: tree / chain of equal depth")
    ax.set_title("Speed-up at equal target passes (line: oracle; markers: engine)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def shape_table(prs: list, shapes=((1,), (1, 1, 1), (3,), (2, 2), (3, 2, 1), (2, 2, 2), (4, 2, 1), (3, 3, 2))) -> list:
    """Rows (shape, nodes, tokens per pass per rule) for the README table."""
    return [(s, tree_nodes(s), {rule: tokens_per_pass(rule, s, prs) for rule in RULES}) for s in shapes]

