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

import numpy as np

from .rounds import RoundLaw, add_emissions, model_rows
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

    def node(context: tuple, path: tuple, mass: float, out: dict) -> None:
        d = len(path)
        p = model_rows(target, context, path)[d]
        if d == D:
            add_emissions(out, path, mass, model_rows(target, context, path)[D - 1] if bonus_parent else p)
            return
        q = model_rows(draft, context, path)[d]
        b = branching[d]

        def accept(c, prob):
            if prob > 0:
                node(context, path + (int(c),), mass * prob, out)

        if rule == "rrs":
            r, reach = p, 1.0
            for _ in range(b):
                both = np.minimum(q, r)
                for c in np.flatnonzero(both > 0):
                    accept(c, reach * both[c])
                reach *= 1.0 - both.sum()
                r = _norm(np.maximum(r - q, 0.0), r)
            if reach > 0:
                add_emissions(out, path, mass * reach, r)
        elif rule == "topk":
            r, reach = p, 1.0
            for c in np.argsort(-q.astype(np.float32), kind="stable")[:b]:
                accept(c, reach * r[c])
                reach *= 1.0 - r[c]
                nr = r.copy()
                nr[c] = 0.0
                r = _norm(nr, r) if renormalise else nr
            if reach > 0:  # an exhausted residual (the no-renorm control only): the device draws the last token
                add_emissions(out, path, mass * reach, _norm(r, np.eye(r.size)[-1]))
        elif rule == "rrs-wor":
            def sibling(i, r, used, reach):
                w = q.copy()
                w[list(used)] = 0.0
                if i == b or w.sum() == 0:  # no candidate left: the residual
                    if reach > 0:
                        add_emissions(out, path, mass * reach, r)
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

    def law(context: tuple) -> dict:
        out: dict = {}
        node(context, (), 1.0, out)
        return out

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
