"""Token trees over neural models: tree attention in one target pass, KV caches compacted each round.

The round of :mod:`specsample.schemes.tree` (a static tree, verified from the root down) with the
rows coming from the transformers' KV caches, as a serving engine computes them:

1. **draft**: feed the draft cache the pending history tokens (as :func:`~specsample.schemes.cached.cached`
   does), then grow the tree level by level *in the draft's own cache*: each level's nodes are appended
   in one pass with the tree mask (:mod:`specsample.models.tree_attention`), their rows draw the next level;
   the deepest level is drawn but never fed;
2. **verify**: one pass of the target over the flattened tree (the last history token as root, then
   every node) with the tree mask and depth positions gives the row at every node;
3. walk down the tree (:func:`~specsample.schemes.tree.verify_tree`);
4. **compact** both caches: the accepted path's keys and values are gathered to the slots right after
   the history and the rest dropped. The last token is pending for both caches, as in the chain.

The children are distinct by default (``rule="rrs-wor"``, as engines draft them: a duplicate
sibling wastes a node), which also makes a compaction bug visible: with i.i.d. children the first
child often carries the accepted token, and gathering the wrong branch then moves nothing.
``tree_cached(k, rule="rrs")`` and ``rule="topk"`` run the other rules over the same caches.

Controls, each one place away from :func:`tree_cached`:

* ``tree-mask-siblings``: the tree mask lets nodes of one parent see each other;
* ``tree-compact-first-branch``: compaction gathers the first child's path (the leftmost branch),
  not the accepted one;
* ``tree-flat-positions``: a node's position is its flat index in the flattened tree, not its depth.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ..models import tree_attention as ta
from .base import Scheme, StatefulStep
from .cached import CachedState, prefilled_state, restart_cached, whole_slots
from .tree import (TREE_RULES, default_branching, draft_level, level_sizes, n_uniforms, split_tree_uniforms,
                   verify_tree)


def cache_size(prompt_len: int, length: int, branching: tuple) -> int:
    """Slots a lane's cache needs: the history (a round starts with fewer than ``length`` tokens after
    the prompt, and compaction keeps only the accepted path), then room for the whole flattened tree
    of the round in flight (root and nodes) and the draft's pending pair. Every round attends over
    the whole cache, so it is no larger than that (but for :func:`~.cached.whole_slots`)."""
    return whole_slots(prompt_len + length + ta.tree_nodes(branching) + 3)


def init_tree_cached(target, draft, prompt, length: int, *, branching: tuple) -> CachedState:
    """Both caches prefilled with the prompt but its last token (fed by the first round)."""
    return prefilled_state(target, draft, prompt, length, len(branching),
                           cache_size(len(prompt), length, branching))


def _level_offsets(branching: tuple) -> list:
    sizes = level_sizes(branching)
    return [sum(sizes[:d]) for d in range(len(sizes))], sizes


def tree_cached_round(u, target, draft, state: CachedState, *, branching: tuple, rule: str, siblings: bool = False,
                      first_branch: bool = False, flat_positions: bool = False):
    """One tree round with KV caches (module docstring); the keywords are the controls' bugs."""
    D = len(branching)
    offsets, sizes = _level_offsets(branching)
    u_draft, u_acc, u_final = split_tree_uniforms(u, branching)
    bugs = dict(siblings=siblings, flat_positions=flat_positions)
    n, pend = state.n, state.draft_pending
    # 1. draft: the pending history tokens (a window of 2, the extra one dropped), then the tree by levels
    d_start = state.draft_cache.length
    rows, dc, _ = draft.extend(state.draft_cache, jax.lax.dynamic_slice(state.tokens, (n - pend,), (2,)))
    fed = d_start + pend
    dc = dc.rollback(fed)
    draft_parents = ta.flat_tree(branching, root=False)
    q_rows = jnp.where(pend == 2, rows[1], rows[0])[None]
    levels = []
    for d, b in enumerate(branching):
        levels.append(draft_level(q_rows, u_draft[offsets[d] : offsets[d] + sizes[d]], b, rule))
        if d < D - 1:  # the deepest level is drawn, never fed
            q_rows, dc = ta.extend_tree(draft, dc, levels[-1][0], draft_parents, tree_start=fed, first=offsets[d],
                                        **bugs)
    # 2. verify: the target's row at every node in one pass over (last token, every node)
    t_start = state.target_cache.length
    nodes = jnp.concatenate([state.tokens[n - 1][None]] + [lv[0] for lv in levels])
    p_all, tc = ta.extend_tree(target, state.target_cache, nodes, ta.flat_tree(branching), tree_start=t_start, **bugs)
    p_rows = [p_all[:1]] + [p_all[1 + offsets[d] : 1 + offsets[d] + sizes[d]] for d in range(D)]
    # 3. walk down the tree
    out, path = verify_tree(levels, p_rows, u_acc, u_final, branching=branching, rule=rule)
    j = out.n_accepted
    # 4. compact: the accepted path's entries (the bug: the leftmost path's) right after the history
    if first_branch:
        path = jnp.asarray([0] * D, jnp.int32)
    flat = jnp.asarray(offsets, jnp.int32) + path  # flat index (without the root) of the node kept at each depth
    tc = ta.compact(tc, t_start + 1, t_start + 1 + flat, j)
    dc = ta.compact(dc, fed, fed + flat[: max(D - 1, 0)], jnp.minimum(j, D - 1))
    tokens = jax.lax.dynamic_update_slice(state.tokens, out.tokens, (n,))
    new = CachedState(tokens, n + out.n_emitted, tc, dc, jnp.where(j == D, 2, 1).astype(jnp.int32))
    return out, new


def _factory(name: str, description: str, lossless: bool = True, **bug):
    def make(k: int = 3, branching=None, rule: str = "rrs-wor") -> Scheme:
        br = tuple(int(b) for b in (branching or default_branching(int(k))))
        if not br or min(br) < 1:
            raise ValueError(f"branching must be positive counts per depth, got {branching!r}")
        if rule not in TREE_RULES:
            raise ValueError(f"unknown tree rule {rule!r}; valid rules: {', '.join(TREE_RULES)}")
        step = StatefulStep(functools.partial(tree_cached_round, branching=br, rule=rule, **bug), n_uniforms(br),
                            functools.partial(init_tree_cached, branching=br), restart=restart_cached)
        return Scheme(name=name, k=len(br), max_tokens=len(br) + 1, step=step, lossless=lossless,
                      description=f"{description}; branching {br}")

    make.__name__ = name.replace("-", "_").replace(":", "_")
    make.__doc__ = f"{description} (default branching: :func:`~specsample.schemes.tree.default_branching`)."
    return make


tree_cached = _factory("tree-cached", "token tree over KV caches: tree attention in one target pass, "
                       "the accepted path compacted (distinct children, recursive rejection)")

TREE_CACHE_CONTROLS = {
    "control:tree-mask-siblings": _factory("control:tree-mask-siblings", "tree mask that lets siblings see "
                                           "each other", lossless=False, siblings=True),
    "control:tree-compact-first-branch": _factory("control:tree-compact-first-branch", "compaction keeps the "
                                                  "first branch's K/V, not the accepted path's", lossless=False,
                                                  first_branch=True),
    "control:tree-flat-positions": _factory("control:tree-flat-positions", "tree nodes positioned by flat index, "
                                            "not depth", lossless=False, flat_positions=True),
}
