"""Exact round laws of the token-tree rules (:mod:`specsample.schemes.tree`), by enumeration.

The law of what a node emits is a recursion over the tree: its children are tried in turn; child i
(token c, drawn from its proposal law q_i) is accepted with probability a_i(c) and then the round
continues with what *that child's* node emits (its subtree was drafted independently of the
siblings); a rejection updates the residual; after the last child the node emits one token from
the residual; below the last level a bonus from p. With i.i.d. children the residual update does not
depend on the rejected token; without replacement and for top-b candidates the enumeration follows
the sibling tokens. Gives ``context -> {emitted tokens: probability}`` (a
:data:`specsample.laws.rounds.RoundLaw`), composable by :func:`specsample.laws.exact.stream_joint`.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .rounds import RoundLaw, add_emissions, last_row
from ..models.tables import TableModel
from ..schemes.tree import TREE_RULE_OF, default_branching


def _norm(w: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    s = w.sum()
    return w / s if s > 0 else fallback


def tree_law(rule: str, target: TableModel, draft: TableModel, branching: tuple, *, renormalise: bool = True,
             bonus_parent: bool = False) -> RoundLaw:
    """``context -> {emitted: probability}`` for a tree rule ("rrs", "rrs-wor", "topk"); the keywords are
    the tree controls' bugs (:data:`specsample.schemes.tree.TREE_CONTROLS`)."""
    D = len(branching)

    @lru_cache(maxsize=None)
    def node(context: tuple, path: tuple) -> dict:
        """The law of what the round emits from the node at ``path`` on (memoised: a subtree's law does
        not depend on which sibling slot reached it, so each path is enumerated once)."""
        d = len(path)
        out: dict = {}
        if d == D:
            add_emissions(out, (), 1.0, last_row(target, context, path[:-1] if bonus_parent else path))
            return out
        p = last_row(target, context, path)
        q = last_row(draft, context, path)
        b = branching[d]
        taken: dict = {}  # child token -> total probability of accepting it (summed before its subtree is merged)

        def accept(c, prob):
            if prob > 0:
                taken[int(c)] = taken.get(int(c), 0.0) + prob

        if rule == "rrs":
            r, reach = p, 1.0
            for _ in range(b):
                both = np.minimum(q, r)
                for c in np.flatnonzero(both > 0).tolist():
                    accept(c, reach * float(both[c]))
                reach *= 1.0 - both.sum()
                r = _norm(np.maximum(r - q, 0.0), r)
            if reach > 0:
                add_emissions(out, (), reach, r)
        elif rule == "topk":
            r, reach = p, 1.0
            for c in np.argsort(-q.astype(np.float32), kind="stable")[:b]:
                accept(c, reach * r[c])
                reach *= 1.0 - r[c]
                nr = r.copy()
                nr[c] = 0.0
                r = _norm(nr, r) if renormalise else nr
            if reach > 0:  # an exhausted residual (the no-renorm control only): the device draws the last token
                add_emissions(out, (), reach, _norm(r, np.eye(r.size)[-1]))
        elif rule == "rrs-wor":
            def sibling(i, r, used, reach):
                w = q.copy()
                w[list(used)] = 0.0
                if i == b or w.sum() == 0:  # no candidate left: the residual
                    if reach > 0:
                        add_emissions(out, (), reach, r)
                    return
                qi = w / w.sum()
                for c in np.flatnonzero(qi > 0):
                    a = min(1.0, r[c] / qi[c])
                    accept(c, reach * qi[c] * a)
                    if a < 1.0:
                        sibling(i + 1, _norm(np.maximum(r - qi, 0.0), r), used | {int(c)}, reach * qi[c] * (1 - a))

            sibling(0, p, frozenset(), 1.0)
        else:
            raise ValueError(f"unknown tree rule {rule!r}")
        # each accepted child's subtree law once (without replacement a child is reached along many sibling
        # orders: merging its law per order cost 2 s a law at V = 8, depth 4)
        for c, prob in taken.items():
            for suffix, pr in node(context, path + (c,)).items():
                key = (c,) + suffix
                out[key] = out.get(key, 0.0) + prob * pr
        return out

    def law(context: tuple) -> dict:
        return dict(node(tuple(context), ()))

    return law


def expected_accepted(rule: str, target: TableModel, draft: TableModel, branching: tuple, context=()) -> float:
    """Expected accepted tree depth per round (emitted tokens - 1) from ``context``."""
    law = tree_law(rule, target, draft, branching)(tuple(context))
    return float(sum(p * (len(b) - 1) for b, p in law.items()))


def scheme_law(name: str, target: TableModel, draft: TableModel, k: int) -> RoundLaw:
    """The exact round law of a registered tree scheme or tree control, default branching of depth k."""
    return tree_law(TREE_RULE_OF[name], target, draft, default_branching(k),
                    renormalise=name != "control:tree-topk-no-renorm",
                    bonus_parent=name == "control:tree-bonus-parent-row")


def shape_law(rule: str, target: TableModel, draft: TableModel, parents) -> RoundLaw:
    """``context -> {emitted: probability}`` for a tree of any shape: ``parents`` [N + 1] in level order
    (-1 for the root), each node's children tried in their order. A node with no children emits from p
    there (the bonus); a static tree is the shape :func:`specsample.host.tree.static_parents` gives, and
    then this law is :func:`tree_law`'s. Children of one node are drafted as in the static rules (i.i.d.,
    distinct in order, or the draft's top ones), so the shapes that keep a prefix of each node's children
    of a static tree are drafted by drafting the static tree and dropping the rest.
    """
    parents = np.asarray(parents, np.int64)
    kids: list = [[] for _ in parents]
    for i, par in enumerate(parents):
        if par >= i:
            raise ValueError(f"node {i}'s parent {par} does not come before it: flatten the tree in level order")
        if par >= 0:
            kids[par].append(i)

    def node(context: tuple, path: tuple, n: int, mass: float, out: dict) -> None:
        p = last_row(target, context, path)
        ch = kids[n]
        if not ch:
            add_emissions(out, path, mass, p)
            return
        q = last_row(draft, context, path)
        if rule == "rrs":
            r, reach = p, 1.0
            for child in ch:
                both = np.minimum(q, r)
                for c in np.flatnonzero(both > 0):
                    node(context, path + (int(c),), child, mass * reach * both[c], out)
                reach *= 1.0 - both.sum()
                r = _norm(np.maximum(r - q, 0.0), r)
        elif rule == "topk":
            r, reach = p, 1.0
            for child, c in zip(ch, np.argsort(-q.astype(np.float32), kind="stable")):
                if reach * r[c] > 0:
                    node(context, path + (int(c),), child, mass * reach * r[c], out)
                reach *= 1.0 - r[c]
                nr = r.copy()
                nr[c] = 0.0
                r = _norm(nr, r)
        elif rule == "rrs-wor":
            def sibling(i, r, used, reach):
                w = q.copy()
                w[list(used)] = 0.0
                if i == len(ch) or w.sum() == 0:
                    if reach > 0:
                        add_emissions(out, path, mass * reach, r)
                    return
                qi = w / w.sum()
                for c in np.flatnonzero(qi > 0):
                    a = min(1.0, r[c] / qi[c])
                    if a > 0:
                        node(context, path + (int(c),), ch[i], mass * reach * qi[c] * a, out)
                    if a < 1.0:
                        sibling(i + 1, _norm(np.maximum(r - qi, 0.0), r), used | {int(c)}, reach * qi[c] * (1 - a))

            sibling(0, p, frozenset(), 1.0)
            return
        else:
            raise ValueError(f"unknown tree rule {rule!r}")
        if reach > 0:
            add_emissions(out, path, mass * reach, r)

    def law(context: tuple) -> dict:
        out: dict = {}
        node(tuple(context), (), 0, 1.0, out)
        return out

    return law
