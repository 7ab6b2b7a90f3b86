"""Token trees: draft a static tree, verify every node, accept one root-to-node path.

A tree of depth D has ``branching[d]`` children under every node of depth d - 1 (the root is the
context). The whole tree is drafted first; verification walks down from the root: at each node the
children are tried in turn against a residual r that starts at the target's row there, and the
first accepted child is descended into (its own children face a fresh residual, the target's row
after the longer path). When every child is rejected the round ends with a token from r; after an
accepted leaf it ends with a bonus token from p. Three rules (DESIGN section 9):

- ``tree`` (SpecInfer's recursive rejection sampling, children i.i.d. from q): accept c with
  min(1, r(c) / q(c)); on rejection r <- norm(max(0, r - q));
- ``tree-wor`` (children distinct: each drawn from q renormalised over the tokens its earlier
  siblings did not take; the without-replacement correction of SpecTr / Jeon et al.): accept c with
  min(1, r(c) / q_i(c)) and r <- norm(max(0, r - q_i)), q_i the law child i was drawn from;
- ``tree-topk`` (EAGLE / Medusa trees: the children are the draft's b most likely tokens, a
  deterministic proposal): accept candidate c with probability r(c); on rejection
  r <- norm(r with c removed).

Each is lossless: the first token a node emits follows the target's row there, whichever child
is accepted. Exact laws by enumeration live in :mod:`specsample.laws.tree_exact`.

References
----------
Miao, X. et al. (2024). SpecInfer: accelerating large language model serving with tree-based
speculative inference and verification. ASPLOS. arXiv:2305.09781.
Sun, Z. et al. (2023). SpecTr: fast speculative decoding via optimal transport. NeurIPS.
Jeon, W. et al. (2024). Recursive speculative decoding. arXiv:2402.14160.
Li, Y. et al. (2024). EAGLE-2: faster inference of language models with dynamic draft trees.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp

from ..models.tables import take, window_index
from ..models.tree_chains import history_offset, with_chains
from .base import RoundOutput, Scheme, UniformStep, fenced, sample_weights

TREE_RULES = ("rrs", "rrs-wor", "topk")


def default_branching(k: int) -> tuple:
    """A tree of depth k: three candidates at the root, two under each, then chains: (3, 2, 1, ...)."""
    return ((3, 2) + (1,) * max(0, k - 2))[:k]


def _normalise(w, fallback):
    s = jnp.sum(w)
    return jnp.where(s > 0, w / jnp.where(s > 0, s, 1.0), fallback)


def _row(model, window):
    w = window.shape[-1]
    return model.probs(window[w - model.order :])[0]


def _shift(window, token):
    """The window after appending ``token`` (fixed width W; W = 0 for context-free models)."""
    if window.shape[-1] == 0:
        return window
    return jnp.concatenate([window[1:], token[None]])


def _children(q_row, u, b: int, rule: str):
    """Tokens [b], validity [b] and each child's proposal law [b, V] under one node."""
    if rule == "topk":
        top = jnp.argsort(-q_row, stable=True)[:b].astype(jnp.int32)
        return top, jnp.ones(b, bool), jnp.zeros((b,) + q_row.shape)  # point proposals: no law needed
    if rule == "rrs":
        toks = jnp.stack([sample_weights(q_row, u[i]) for i in range(b)])
        return toks, jnp.ones(b, bool), jnp.broadcast_to(q_row, (b,) + q_row.shape)
    used = jnp.zeros_like(q_row)
    toks, valid, laws = [], [], []
    for i in range(b):  # without replacement: each from q over the tokens not yet taken
        w = q_row * (1.0 - used)
        ok = jnp.sum(w) > 0
        law = _normalise(w, jnp.zeros_like(w))
        t = sample_weights(jnp.where(ok, w, q_row), u[i])
        toks.append(t)
        valid.append(ok)
        laws.append(law)
        used = jnp.where(ok & (jnp.arange(q_row.shape[-1]) == t), 1.0, used)  # a select, not a scatter
    return jnp.stack(toks), jnp.stack(valid), jnp.stack(laws)


def sibling_test(rule: str, r, q_i, c, u, renormalise: bool = True):
    """One child's test at a node: ``(accepted, residual after a rejection)``.

    ``r`` is the node's residual so far (the target's row before any rejection), ``c`` the child's
    token, ``q_i`` the law it was drafted from (unused by ``topk``, whose candidates are points)
    and ``u`` its uniform: accept with min(1, r(c) / q_i(c)) and move r to norm(max(0, r - q_i)), or
    (``topk``) accept with r(c) and remove c from r, renormalised unless ``renormalise`` is False.
    """
    if rule == "topk":
        removed = jnp.where(jnp.arange(r.shape[-1]) == c, 0.0, r)
        return u < r[c], (_normalise(removed, r) if renormalise else removed)
    return u * q_i[c] < r[c], _normalise(jnp.maximum(r - q_i, 0.0), r)


def level_sizes(branching: tuple) -> list:
    """Nodes at each depth 1..D of a static tree: the running product of the branching."""
    return [math.prod(branching[: d + 1]) for d in range(len(branching))]


def draft_level(q_rows, u, b: int, rule: str):
    """The children of every node of one level: tokens [m b], validity [m b], proposal laws [m b, V].

    ``q_rows`` [m, V] are the draft's rows at the level's m nodes, ``u`` their m b uniforms.
    """
    t, ok, lw = jax.vmap(lambda row, uu: _children(row, uu, b, rule))(q_rows, u.reshape(-1, b))
    return t.reshape(-1), ok.reshape(-1), lw.reshape((-1,) + lw.shape[2:])


def verify_tree(levels, p_rows, u_acc, u_final, *, branching: tuple, rule: str, renormalise: bool = True,
                bonus_parent: bool = False, anchor=None):
    """Walk down a drafted tree from the root; what a round emits and which nodes it accepted.

    The tree comes whole or on demand. Whole (a network scores every node in one pass):
    ``levels[d]`` is (tokens, valid, laws) of the nodes of depth d + 1 (:func:`draft_level`) and
    ``p_rows[d]`` the target's rows at the nodes of depth d ([1, V] at the root, one row per node
    below). On demand (table models, whose rows are gathers): ``levels(d, node, path)`` gives the
    children (tokens [b], valid [b], laws [b, V]) of node ``node`` of depth d and ``p_rows(d, node,
    path)`` its target row, ``path`` the tokens accepted above it; the walk asks only for the D + 1
    nodes it visits, so the rest of the tree is never drafted nor scored, and the round reports the
    children of the visited node at each depth only (sum(branching) drafts, depth after depth: the
    *walk layout*; whole, one per node of the tree: the *node layout*). Both give the same tokens for
    the same uniforms.
    ``anchor``: an array of the program whose values XLA cannot see (a model's table), from which
    each depth's fence reads its trip count (:func:`~specsample.schemes.base.fenced`); by default
    the root's target row.
    Returns ``(RoundOutput, path)``: ``path[d]`` is the index within depth d + 1 of the node accepted
    there (meaningful for d < n_accepted), what cache compaction gathers.
    """
    lazy = callable(levels)
    if lazy:
        children_at, row_at = levels, p_rows
    else:
        def children_at(d, node, _path):
            b = branching[d]
            return tuple(jax.lax.dynamic_slice_in_dim(x, node * b, b) for x in levels[d])

        def row_at(d, node, _path):
            return p_rows[d][node]
    D = len(branching)
    sizes = level_sizes(branching)
    first_row = row_at(0, jnp.zeros((), jnp.int32), [])

    def depth(d, b, a_off, path_tokens, cur, alive, n_acc, stop_row):
        """Test the children of the node visited at depth d: the walk's state after them, and the report."""
        tokens, valid, laws = children_at(d, cur, list(path_tokens))
        r = stop_row if d == 0 else row_at(d, cur, list(path_tokens))
        hit = jnp.zeros((), bool)
        tok = jnp.zeros((), jnp.int32)
        child = jnp.zeros((), jnp.int32)
        n_slots = b if lazy else sizes[d]  # on demand: only the visited node's children are reported
        d_d = jnp.zeros(n_slots, jnp.int32)
        t_d = jnp.zeros(n_slots, bool)
        a_d = jnp.zeros(n_slots, bool)
        slots = jnp.arange(n_slots)
        for i in range(b):
            idx = cur * b + i
            c = tokens[i]
            live = alive & ~hit & valid[i]
            ok, reduced = sibling_test(rule, r, laws[i], c, u_acc[a_off + i], renormalise)
            take = live & ok
            tok = jnp.where(take, c, tok)
            child = jnp.where(take, idx, child)
            r = jnp.where(live & ~ok, reduced, r)
            hit = hit | take
            here = slots == (i if lazy else idx)  # selects, not scatters: XLA's CPU scatter dominates a small round
            d_d = jnp.where(here & alive, c, d_d)
            t_d = t_d | (here & live)
            a_d = a_d | (here & take)
        return (tok, jnp.where(hit, child, cur), alive & hit, n_acc + (alive & hit),
                jnp.where(alive & ~hit, r, stop_row), d_d, t_d, a_d)

    cur = jnp.zeros((), jnp.int32)
    alive = jnp.ones((), bool)
    n_acc = jnp.zeros((), jnp.int32)
    stop_row = first_row  # the residual where the walk stopped (one draw at the end, not one per level)
    path_tokens, path = [], []
    drafts, tested, accepted = [], [], []
    a_off = 0
    for d, b in enumerate(branching):
        # each depth's results are stored before the next reads them (fused, every output of the
        # round would recompute the walk so far): see :func:`~specsample.schemes.base.fenced`
        tok, cur, alive, n_acc, stop_row, d_d, t_d, a_d = fenced(functools.partial(
            depth, d, b, a_off, tuple(path_tokens), cur, alive, n_acc, stop_row),
            first_row if anchor is None else anchor)
        a_off += b
        path_tokens.append(tok)
        path.append(cur)
        drafts.append(d_d if lazy else levels[d][0])
        tested.append(t_d)
        accepted.append(a_d)
    # the bonus row: the accepted leaf's own (the bug: its parent's, one node too high)
    bonus_row = (row_at(D - 1, cur // branching[-1], path_tokens[:-1]) if bonus_parent
                 else row_at(D, cur, path_tokens))
    last = sample_weights(jnp.where(alive, bonus_row, stop_row), u_final)
    out = jnp.concatenate([jnp.where(jnp.arange(D) < n_acc, jnp.stack(path_tokens), 0), jnp.zeros(1, jnp.int32)])
    out = out.at[n_acc].set(last)
    return RoundOutput(out.astype(jnp.int32), (n_acc + 1).astype(jnp.int32), n_acc.astype(jnp.int32),
                       jnp.concatenate(drafts).astype(jnp.int32), jnp.concatenate(tested),
                       jnp.concatenate(accepted)), jnp.stack(path)


def split_tree_uniforms(u, branching: tuple):
    """A round's uniforms: one per drafted node, one per sibling slot on a path, one for the last token."""
    n_nodes = sum(level_sizes(branching))
    return u[:n_nodes], u[n_nodes : n_nodes + sum(branching)], u[-1]


def n_uniforms(branching: tuple) -> int:
    return sum(level_sizes(branching)) + sum(branching) + 1


def report_cuts(branching: tuple, n_drafts: int) -> tuple:
    """``(walk, cuts)``: where each depth's entries start in a tree round's drafts, and where the last
    ends. The walk layout (``n_drafts == sum(branching)``: the visited node's children, as table trees
    report) or the node layout (every node, as a whole tree is verified); alike when every b is 1."""
    walk = n_drafts == sum(branching)
    return walk, list(itertools.accumulate(branching if walk else level_sizes(branching), initial=0))


def walk_uniforms(branching: tuple) -> int:
    """Uniforms of a table tree round: one per child of the node visited at each depth, one per
    sibling test, one for the last token: 2 sum(branching) + 1."""
    return 2 * sum(branching) + 1


def split_walk_uniforms(u, branching: tuple):
    """A walk's uniforms: drafting (the visited node's children, depth after depth), tests, last token."""
    s = sum(branching)
    return u[:s], u[s : 2 * s], u[2 * s]


def tree_round(u, target, draft, context, *, branching: tuple, rule: str, renormalise: bool = True,
               bonus_parent: bool = False):
    """One round of a static tree on table models from its 2 sum(branching) + 1 uniforms.

    The walk asks for the children and rows of the nodes it visits only (:func:`verify_tree` on
    demand), so a round drafts D sibling groups and reads D + 1 target rows, not one per node. Only
    the visited node's children are ever drafted, so they take the depth's uniforms whichever node
    that is (:func:`split_walk_uniforms`): a round draws 2 sum(branching) + 1 numbers, not one per
    node of the tree (a third of the engine's time went to the numbers of unvisited nodes).
    On a target that carries its residual chains (:func:`~specsample.models.tree_chains.with_chains`,
    the scheme's ``prepare``) rows are not built at all (:func:`_tabled_round`).
    ``renormalise=False`` and ``bonus_parent=True`` are the tree controls' one-place bugs.
    """
    chains = getattr(target, "chains", None)
    if (chains is not None and chains.rule == rule and chains.renormalise == renormalise
            and chains.depth >= max(branching)):
        return _tabled_round(u, target, draft, context, chains, branching=branching, bonus_parent=bonus_parent)
    u_draft, u_acc, u_final = split_walk_uniforms(u, branching)
    starts = [sum(branching[:d]) for d in range(len(branching))]

    def window(path):  # the context after the accepted tokens above a node
        w = context
        for t in path:
            w = _shift(w, t)
        return w

    def children(d, node, path):
        b = branching[d]
        uu = u_draft[starts[d] : starts[d] + b]
        return _children(_row(draft, window(path)), uu, b, rule)

    out, _ = verify_tree(children, lambda d, node, path: _row(target, window(path)), u_acc, u_final,
                         branching=branching, rule=rule, renormalise=renormalise, bonus_parent=bonus_parent,
                         anchor=getattr(target, "table", None))
    return out


def _tabled_round(u, target, draft, context, chains, *, branching: tuple, bonus_parent: bool):
    """:func:`tree_round` on a pair whose target carries :class:`~specsample.models.tree_chains.TreeChains`
    (or :class:`~specsample.models.tree_chains.WorChains`).

    The residual at a node after i rejected children is r_i of the node's window, a gather; the
    children are alias draws from q (``rrs``), from q over the tokens the rejected siblings did not
    take (``rrs-wor``: the law and the residual are rows of the window and the siblings' history) or
    the tabled candidates (``topk``); the round's last token is one alias draw, from the residual
    after all children of its node were rejected or from p after an accepted leaf. The same law as
    the walk that builds rows, not the same tokens for the same uniforms (the walk drafts by inverse
    CDF). Rows are never built, so a round costs O(nodes visited).
    """
    u_draft, u_acc, u_final = split_walk_uniforms(u, branching)
    starts = [sum(branching[:d]) for d in range(len(branching))]
    vocab = target.vocab_size
    D = len(branching)

    def windows(path):  # the context after the tokens accepted above a node, as each table's row
        w = context
        for t in path:
            w = _shift(w, t)
        full = window_index(w, chains.order, vocab, jnp)[-1]
        return w, target._row(full, vocab**chains.order)

    def depth(d, b, a_off, path_tokens, alive, n_acc, stop):
        """The children of the node visited at depth d: the walk's state after them, and the report."""
        w, row = windows(path_tokens)
        hit = jnp.zeros((), bool)
        tok = jnp.zeros((), jnp.int32)
        cs, lives, takes = [], [], []
        wor = chains.rule == "rrs-wor"
        if wor:  # the siblings drafted so far and the residual the rejected ones left
            res, rejected = chains.residual_row(row), []
        for i in range(b):
            u_d, u_a = u_draft[starts[d] + i], u_acc[a_off + i]
            valid = True
            if chains.rule == "topk":
                c = take(chains.top, row, i)
                ok = u_a < chains.value(row, i, c)
            elif wor:  # from q over the tokens the rejected siblings did not take, tested against their residual
                history = history_offset(vocab, i) + _history_code(rejected, vocab)
                c = chains.law_tables.sample(chains.law_row(row, i, _history_code(rejected, vocab, as_set=True)), u_d)
                # u q_h(c) < r(c) as one threshold (-1: nothing is left to draw; the token reported comes from q)
                threshold = take(chains.accept, chains.law_row(row, 0, history), c)
                valid = threshold >= 0
                ok = u_a < threshold
            else:  # u q(c) < r_i(c) as one threshold
                c = draft.sample(w, u_d)
                ok = u_a < take(chains.accept, chains.row(row, i), c)
            live = alive & ~hit & valid
            take_it = live & ok
            tok = jnp.where(take_it, c, tok)  # the path is its tokens: windows, not node indices
            hit = hit | take_it
            if wor:
                after = chains.residual_row(row, history)
                res = jnp.where(live & ~ok, after, res)
                rejected.append(c)
            cs.append(c)
            lives.append(live)
            takes.append(take_it)
        stop = jnp.where(alive & ~hit, res if wor else chains.row(row, b), stop)
        # the visited node's children (compact report), a scalar each: vmap batches the fence's loop lanes-first,
        # so a stacked [b] array came out lane-major and the round's report was a transposed copy (1.08-1.09 x)
        return (tok, alive & hit, n_acc + (alive & hit), stop,
                tuple(jnp.where(alive, c, 0) for c in cs), tuple(lives), tuple(takes))

    alive = jnp.ones((), bool)
    n_acc = jnp.zeros((), jnp.int32)
    stop = jnp.zeros((), jnp.int32)  # the chain row of the residual where the walk stopped
    path_tokens, drafts, tested, accepted = [], [], [], []
    a_off = 0
    for d, b in enumerate(branching):
        # each depth's results are stored before the next reads them: fused, every output of the
        # round would recompute the whole walk (0.24 of standard's rounds/s at V = 64, k = 4; 0.7 fenced)
        tok, alive, n_acc, stop, cs, lives, takes = fenced(
            functools.partial(depth, d, b, a_off, tuple(path_tokens), alive, n_acc, stop), target.table)
        drafts.extend(cs)
        tested.extend(lives)
        accepted.extend(takes)
        a_off += b
        path_tokens.append(tok)
    # the bonus row: the accepted leaf's own (the bug: its parent's, one node too high)
    _, leaf = windows(path_tokens[:-1] if bonus_parent else path_tokens)
    # p is every window's first chain row, so the bonus and the residual token are one draw from the
    # chain tables (the same alias tables as the target's own: the same tokens)
    last = chains.tables.sample(jnp.where(alive, chains.target_row(leaf), stop), u_final)
    out = jnp.concatenate([jnp.where(jnp.arange(D) < n_acc, jnp.stack(path_tokens), 0), jnp.zeros(1, jnp.int32)])
    # a scatter, as :func:`~specsample.schemes.base.emit` writes it, stores the tokens; a select was fused
    # into each reader of the round's tokens (the engine's count indices read each twice where two tokens
    # share a cell): at V = 64, k = 4 the scatter made `tree` 1.24 x and `tree-topk` 1.46 x as fast
    out = out.at[n_acc].set(last)
    return RoundOutput(out.astype(jnp.int32), (n_acc + 1).astype(jnp.int32), n_acc.astype(jnp.int32),
                       jnp.stack(drafts).astype(jnp.int32), jnp.stack(tested), jnp.stack(accepted))


def _history_code(tokens: list, vocab: int, as_set: bool = False):
    """The siblings ``tokens`` as a base-V number, the first most significant (a row within their level).

    ``as_set``: the tokens sorted first. q_h depends on the set of rejected siblings only, so every
    order of one set reads one row (at V = 64 half the rows a round touches: fewer cache misses); the
    residual they leave depends on their order.
    """
    t = list(tokens)
    for end in range(len(t) - 1, 0, -1) if as_set else ():  # a sorting network of min/max pairs
        for j in range(end):
            t[j], t[j + 1] = jnp.minimum(t[j], t[j + 1]), jnp.maximum(t[j], t[j + 1])
    code = jnp.zeros((), jnp.int32)
    for x in t:
        code = code * vocab + x
    return code


@functools.lru_cache(maxsize=None)
def _prepare(rule: str, depth: int, renormalise: bool = True):
    """The scheme's ``prepare``: the target's residual chains (``rrs-wor``: and the siblings' laws).
    One object per (rule, depth, renormalise), so every scheme made alike shares the edge rows' prepared
    models (:func:`specsample.battery.edges.jax_edge_check` keys them by it)."""
    return functools.partial(with_chains, rule=rule, depth=depth, renormalise=renormalise)


def _factory(name: str, rule: str, description: str, lossless: bool = True, **bug):
    def make(k: int = 3, branching=None) -> Scheme:
        br = tuple(int(b) for b in (branching or default_branching(int(k))))
        if not br or min(br) < 1:
            raise ValueError(f"branching must be positive counts per depth, got {branching!r}")
        walk = functools.partial(tree_round, branching=br, rule=rule, **bug)
        return Scheme(name=name, k=len(br), max_tokens=len(br) + 1, step=UniformStep(walk, walk_uniforms(br)),
                      description=f"{description}; branching {br}", lossless=lossless,
                      prepare=_prepare(rule, max(br), bug.get("renormalise", True)))

    make.__name__ = name.replace("-", "_")
    make.__doc__ = f"{description} (a static tree; default branching: :func:`default_branching`)."
    return make


tree = _factory("tree", "rrs", "token tree, children i.i.d. from q, recursive rejection sampling (SpecInfer)")
tree_wor = _factory("tree-wor", "rrs-wor", "token tree, distinct children (without replacement), recursive rejection")
tree_topk = _factory("tree-topk", "topk",
                     "token tree of the draft's top-b tokens (EAGLE/Medusa), residual renormalised")

TREE_CONTROLS = {
    "control:tree-topk-no-renorm": _factory(
        "control:tree-topk-no-renorm", "topk", "top-b tree whose residual is not renormalised after a rejected "
        "candidate is removed", lossless=False, renormalise=False),
    "control:tree-bonus-parent-row": _factory(
        "control:tree-bonus-parent-row", "rrs", "tree whose bonus token comes from the accepted leaf's parent row",
        lossless=False, bonus_parent=True),
}
TREE_RULE_OF = {"tree": "rrs", "tree-wor": "rrs-wor", "tree-topk": "topk", "control:tree-topk-no-renorm": "topk",
                "control:tree-bonus-parent-row": "rrs"}
