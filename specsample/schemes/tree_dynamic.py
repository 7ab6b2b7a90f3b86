"""Dynamic token trees (EAGLE-2): each round's tree shape is chosen from the draft's own probabilities.

A node's *value* is the draft's probability of its whole path from the root (the product of q along
it). Depth 1 holds the root's m children; at every further depth the m nodes of the level with the
largest values are expanded, m children each, so depths 2..D hold m^2 nodes (the other nodes of the
level stay leaves). Two rules:

- ``tree-dynamic`` (EAGLE-2, and the EAGLE paths of SGLang and vLLM): the children are the draft's
  m most likely tokens, and a final rerank keeps the n nodes of largest value overall. Ties go to
  the shallower, earlier node, so a kept node's ancestors are kept (a child's value never exceeds
  its parent's). Each node's kept children are verified by the top-b rule of ``tree-topk``: accept
  candidate c with probability r(c), on rejection r <- norm(r with c removed).
- ``tree-dynamic-wor``: the children are m distinct draws from q (without replacement), verified by
  recursive rejection sampling as in ``tree-wor``; nodes are expanded by value, and there is no
  rerank.

Why the sampled rule has no rerank: pruning a *sampled* child by its own value (or by anything else
about its own token) leaves its siblings tested against laws they were not drawn from, which is
lossy; ``control:tree-dynamic-wor-rerank`` is that rerank and the battery rejects it. The shape of
a node's subtree may depend on anything drawn outside that subtree (its own token, its cousins',
even the target's rows: the top-b rule is lossless for any candidate list fixed before its
uniforms are read). What must not happen is a sibling list cut by its members' own tokens:
``control:tree-dynamic-target-prune`` skips the sampled candidates the target forbids, a tempting
shortcut that leaves the residual un-reduced by them, and ``control:tree-dynamic-orphan`` reranks
by each node's own draft probability, so an orphan can be kept without its parent, whose token the
round then emits untested (a retrieve path built before the rerank).

Uniforms: one per drafted node (the sampled rule's draws), m per depth for the sibling tests, one
for the last token. Exact laws: :mod:`specsample.laws.tree_dynamic_exact`.

References
----------
Li, Y., Wei, F., Zhang, C. and Zhang, H. (2024). EAGLE-2: faster inference of language models with
dynamic draft trees. EMNLP. arXiv:2406.16858.
Miao, X. et al. (2024). SpecInfer: accelerating large language model serving with tree-based
speculative inference and verification. ASPLOS. arXiv:2305.09781.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .base import RoundOutput, Scheme, UniformStep, fenced, sample_weights
from .tree import _children, _row, sibling_test


def level_sizes(width: int, depth: int) -> list:
    """Nodes at each depth 1..D: m at the first, m^2 below (m expanded nodes, m children each)."""
    return [width] + [width * width] * (depth - 1)


def default_keep(width: int, depth: int) -> int:
    """Nodes the rerank keeps by default: two per depth beyond the first level's m, at most all."""
    return min(sum(level_sizes(width, depth)), width + 2 * (depth - 1))


def _window(context, path):
    """The model's context after ``path`` (the last W tokens of context + path; W = 0: context-free)."""
    w = context.shape[-1]
    if w == 0 or path.shape[-1] == 0:
        return context
    return jnp.concatenate([context, path])[-w:]


def build_tree(u_draft, draft, context, *, width: int, depth: int, rule: str):
    """Draft a dynamic tree: per depth, tokens, validity, values, parents, proposal laws and paths.

    ``parents[d][j]`` indexes depth d's nodes (the root for d = 0); ``paths[d]`` is [L_d, d + 1],
    the tokens from the root to each node of depth d + 1.
    """
    sizes = level_sizes(width, depth)
    levels = []
    q0 = _row(draft, context)
    tok, ok, law = _children(q0, u_draft[:width], width, rule)
    val = jnp.where(ok & (q0[tok] > 0), q0[tok], 0.0)
    levels.append(dict(tok=tok, val=val, parent=jnp.zeros(width, jnp.int32), law=law, path=tok[:, None]))
    start = width
    for d in range(1, depth):
        prev = levels[-1]
        ranked = jnp.where(prev["val"] > 0, prev["val"], -1.0)
        expand = jnp.argsort(-ranked, stable=True)[:width].astype(jnp.int32)  # the m best nodes of the level
        pv = prev["val"][expand]
        paths = prev["path"][expand]
        uu = u_draft[start : start + sizes[d]].reshape(width, width)
        start += sizes[d]

        def grow(path, u, v):
            q = _row(draft, _window(context, path))
            t, good, lw = _children(q, u, width, rule)
            return t, jnp.where(good & (q[t] > 0) & (v > 0), v * q[t], 0.0), lw

        t, val, lw = jax.vmap(grow)(paths, uu, pv)
        path = jnp.concatenate([jnp.repeat(paths, width, axis=0), t.reshape(-1, 1)], axis=1)
        levels.append(dict(tok=t.reshape(-1), val=val.reshape(-1), parent=jnp.repeat(expand, width),
                           law=lw.reshape((-1,) + lw.shape[2:]), path=path))
    return levels


def _rerank(levels, keep: int, by_own: bool = False):
    """Kept flags per depth: the ``keep`` nodes of largest value (stable: shallower, earlier first).

    ``by_own`` (the orphan control) ranks by each node's own draft probability instead of its path's.
    """
    vals = []
    for d, lv in enumerate(levels):
        if by_own and d > 0:
            pv = levels[d - 1]["val"][lv["parent"]]
            vals.append(jnp.where(lv["val"] > 0, lv["val"] / jnp.where(pv > 0, pv, 1.0), 0.0))
        else:
            vals.append(lv["val"])
    allv = jnp.concatenate(vals)
    order = jnp.argsort(-jnp.where(allv > 0, allv, -1.0), stable=True)
    rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    kept = (rank < keep) & (allv > 0)
    out, s = [], 0
    for lv in levels:
        n = lv["tok"].shape[0]
        out.append(kept[s : s + n])
        s += n
    return out


def dynamic_round(u, target, draft, context, *, width: int, depth: int, rule: str, keep: int | None,
                  bug: str | None = None):
    """One round of a dynamic tree from its uniforms (see the module docstring for the layout).

    ``keep`` None: no rerank. ``bug`` names a control's one-place change: ``"orphan"`` (rerank by
    own probability, dropped parents emitted untested), ``"target-prune"`` (sampled candidates the
    target forbids are skipped, not tested).
    """
    sizes = level_sizes(width, depth)
    n_nodes = sum(sizes)
    u_draft, u_acc, u_final = u[:n_nodes], u[n_nodes : n_nodes + depth * width], u[-1]
    levels = build_tree(u_draft, draft, context, width=width, depth=depth, rule=rule)
    if keep is None:
        kept = [lv["val"] > 0 for lv in levels]
    else:
        kept = _rerank(levels, keep, by_own=bug == "orphan")
    # a dropped node with a kept descendant: the orphan control walks through it untested
    carrier = [jnp.zeros_like(k) for k in kept]
    if bug == "orphan":
        below = jnp.zeros(sizes[-1], bool)
        for d in range(depth - 1, 0, -1):
            has = jnp.zeros(sizes[d - 1], bool).at[levels[d]["parent"]].max(kept[d] | below)
            carrier[d - 1] = ~kept[d - 1] & has
            below = has
    root = _row(target, context)

    def walk_depth(d, cur, alive, n_acc, stop_row):
        """Test the children of the node visited at depth d: the walk's state after them, and the report."""
        lv = levels[d]
        if d == 0:
            r, block, has = root, jnp.zeros((), jnp.int32), jnp.ones((), bool)
        else:
            r = _row(target, _window(context, levels[d - 1]["path"][cur]))
            expand = lv["parent"][::width]
            has = jnp.any(expand == cur)
            block = jnp.argmax(expand == cur).astype(jnp.int32)
        p_here = r
        hit = jnp.zeros((), bool)
        tok = jnp.zeros((), jnp.int32)
        child = jnp.zeros((), jnp.int32)
        d_d = jnp.zeros(sizes[d], jnp.int32)
        t_d = jnp.zeros(sizes[d], bool)
        a_d = jnp.zeros(sizes[d], bool)
        slots = jnp.arange(sizes[d])
        for i in range(width):
            j = block * width + i
            c = lv["tok"][j]
            live = alive & ~hit & has & (kept[d][j] | carrier[d][j])
            if bug == "target-prune":
                live = live & (p_here[c] > 0)
            ok, reduced = sibling_test(rule, r, lv["law"][j], c, u_acc[d * width + i])
            ok = ok | carrier[d][j]
            take = live & ok
            tok = jnp.where(take, c, tok)
            child = jnp.where(take, j, child)
            r = jnp.where(live & ~ok, reduced, r)
            hit = hit | take
            here = slots == j
            d_d = jnp.where(here & alive & has, c, d_d)
            t_d = t_d | (here & live & ~carrier[d][j])
            a_d = a_d | (here & take)
        return (tok, jnp.where(hit, child, cur), alive & hit, n_acc + (alive & hit),
                jnp.where(alive & ~hit, r, stop_row), d_d, t_d, a_d)

    stop_row = root
    cur = jnp.zeros((), jnp.int32)
    alive = jnp.ones((), bool)
    n_acc = jnp.zeros((), jnp.int32)
    toks, drafts, tested, accepted = [], [], [], []
    for d in range(depth):
        # stored depth by depth, so the round's outputs do not each recompute the walk (:func:`fenced`)
        tok, cur, alive, n_acc, stop_row, d_d, t_d, a_d = fenced(functools.partial(
            walk_depth, d, cur, alive, n_acc, stop_row), getattr(target, "table", root))
        toks.append(tok)
        drafts.append(d_d)
        tested.append(t_d)
        accepted.append(a_d)
    bonus_row = _row(target, _window(context, levels[-1]["path"][cur]))
    last = sample_weights(jnp.where(alive, bonus_row, stop_row), u_final)
    out = jnp.concatenate([jnp.where(jnp.arange(depth) < n_acc, jnp.stack(toks), 0), jnp.zeros(1, jnp.int32)])
    out = out.at[n_acc].set(last)
    return RoundOutput(out.astype(jnp.int32), (n_acc + 1).astype(jnp.int32), n_acc.astype(jnp.int32),
                       jnp.concatenate(drafts).astype(jnp.int32), jnp.concatenate(tested),
                       jnp.concatenate(accepted))


def n_uniforms(width: int, depth: int) -> int:
    return sum(level_sizes(width, depth)) + depth * width + 1


def _factory(name: str, rule: str, description: str, *, rerank: bool, lossless: bool = True, bug=None):
    def make(k: int = 3, width: int = 2, keep: int | None = None) -> Scheme:
        depth, width = int(k), int(width)
        if depth < 1 or width < 1:
            raise ValueError(f"a dynamic tree needs depth k >= 1 and width >= 1, got k={k}, width={width}")
        n = (default_keep(width, depth) if keep is None else int(keep)) if rerank else None
        if n is not None and n < 1:
            raise ValueError(f"keep must be >= 1 (nodes the rerank keeps), got {keep}")
        step = functools.partial(dynamic_round, width=width, depth=depth, rule=rule, keep=n, bug=bug)
        shape = f"depth {depth}, width {width}" + (f", keep {n}" if n is not None else "")
        return Scheme(name=name, k=depth, max_tokens=depth + 1, step=UniformStep(step, n_uniforms(width, depth)),
                      description=f"{description}; {shape}", lossless=lossless)

    make.__name__ = name.split(":")[-1].replace("-", "_")
    make.__doc__ = f"{description} (a dynamic tree of depth k; see :mod:`specsample.schemes.tree_dynamic`)."
    return make


tree_dynamic = _factory("tree-dynamic", "topk", "dynamic tree (EAGLE-2): top-m children of the m best nodes "
                        "per depth by cumulative draft probability, top-n rerank, top-b verification", rerank=True)
tree_dynamic_wor = _factory("tree-dynamic-wor", "rrs-wor", "dynamic tree of distinct sampled children, the m "
                            "best nodes per depth expanded, recursive rejection sampling", rerank=False)

DYNAMIC_CONTROLS = {
    "control:tree-dynamic-wor-rerank": _factory(
        "control:tree-dynamic-wor-rerank", "rrs-wor", "dynamic tree of sampled children pruned by EAGLE-2's "
        "rerank (a sampled child dropped by its own value)", rerank=True, lossless=False),
    "control:tree-dynamic-target-prune": _factory(
        "control:tree-dynamic-target-prune", "rrs-wor", "dynamic tree whose shape reads the target: sampled "
        "candidates the target forbids are skipped rather than tested", rerank=False, lossless=False,
        bug="target-prune"),
    "control:tree-dynamic-orphan": _factory(
        "control:tree-dynamic-orphan", "topk", "dynamic tree whose rerank keeps a node without its parent (ranked "
        "by own draft probability); the dropped parent is emitted untested", rerank=True, lossless=False,
        bug="orphan"),
}
DYNAMIC_SPEC = {"tree-dynamic": ("topk", True, None), "tree-dynamic-wor": ("rrs-wor", False, None),
                "control:tree-dynamic-wor-rerank": ("rrs-wor", True, None),
                "control:tree-dynamic-target-prune": ("rrs-wor", False, "target-prune"),
                "control:tree-dynamic-orphan": ("topk", True, "orphan")}
"""name -> (rule, rerank, bug): what the exact law needs to mirror each registered dynamic tree."""
