"""Exact round laws of the dynamic trees (:mod:`specsample.schemes.tree_dynamic`), by enumeration.

A dynamic tree's shape couples its subtrees (which nodes are expanded depends on every node of a
level), so the law is not a recursion over one node's children as for static trees
(:mod:`.tree_exact`). Instead every way the draft can build the tree is enumerated with its
probability (one way for the top-m rule; every ordered draw of distinct children for the sampled
one), and on each built tree the walk is a recursion as before. Values, expansion and rerank are
computed in float32 with the same stable orders as the JAX round, so ties break the same way.
Small cases only: the sampled rule's realisations grow as (V!/(V-m)!)^(1 + m (D - 1)).
"""

from __future__ import annotations

import itertools

import numpy as np

from .rounds import RoundLaw, add_emissions, model_rows
from .tree_exact import _norm
from ..models.tables import TableModel
from ..schemes.tree_dynamic import DYNAMIC_SPEC, default_keep


def _children(q: np.ndarray, m: int, rule: str):
    """Every way to draw a node's m children: (probability, tokens, valid, laws)."""
    if rule == "topk":
        tok = np.argsort(-q.astype(np.float32), kind="stable")[:m]
        yield 1.0, tok, np.ones(m, bool), np.zeros((m, q.size))
        return

    def draw(i, used, pr, toks, oks, laws):
        if i == m:
            yield pr, np.array(toks), np.array(oks), np.array(laws)
            return
        w = q.copy()
        w[list(used)] = 0.0
        if w.sum() <= 0:  # nothing left to draw: the rest are invalid
            yield from draw(i + 1, used, pr, toks + [0], oks + [False], laws + [np.zeros_like(q)])
            return
        law = w / w.sum()
        for c in np.flatnonzero(law > 0):
            yield from draw(i + 1, used | {int(c)}, pr * law[c], toks + [int(c)], oks + [True], laws + [law])

    yield from draw(0, frozenset(), 1.0, [], [], [])


def _trees(draft: TableModel, context: tuple, m: int, depth: int, rule: str):
    """Every built tree with its probability: (probability, levels), levels as in the JAX round."""
    q0 = model_rows(draft, context, ())[0]

    def level(prob, q_rows, parents, paths, pvals):
        """Children of the given nodes (one block each), every combination of their draws."""
        for combo in itertools.product(*[list(_children(q, m, rule)) for q in q_rows]):
            pr = prob
            tok, val, law, par, path = [], [], [], [], []
            for (pc, t, ok, lw), q, parent, pth, pv in zip(combo, q_rows, parents, paths, pvals):
                pr *= pc
                qt = q.astype(np.float32)[t]
                v = np.where(ok & (qt > 0) & (pv > 0), np.float32(pv) * qt, np.float32(0)).astype(np.float32)
                tok += list(t)
                val += list(v)
                law += list(lw)
                par += [parent] * m
                path += [pth + (int(x),) for x in t]
            yield pr, dict(tok=np.array(tok), val=np.array(val, np.float32), law=np.array(law),
                           parent=np.array(par), path=path)

    def grow(prob, levels):
        if len(levels) == depth:
            yield prob, levels
            return
        prev = levels[-1]
        ranked = np.where(prev["val"] > 0, prev["val"], np.float32(-1))
        expand = np.argsort(-ranked, kind="stable")[:m]
        rows = [model_rows(draft, context, prev["path"][e])[len(prev["path"][e])] for e in expand]
        for pr, lv in level(prob, rows, list(expand), [prev["path"][e] for e in expand],
                            [prev["val"][e] for e in expand]):
            yield from grow(pr, levels + [lv])

    for pr, lv in level(1.0, [q0], [0], [()], [np.float32(1)]):
        yield from grow(pr, [lv])


def _kept(levels, keep, by_own: bool):
    if keep is None:
        return [lv["val"] > 0 for lv in levels]
    vals = []
    for d, lv in enumerate(levels):
        if by_own and d > 0:
            pv = levels[d - 1]["val"][lv["parent"]]
            vals.append(np.where(lv["val"] > 0, lv["val"] / np.where(pv > 0, pv, np.float32(1)), 0).astype(np.float32))
        else:
            vals.append(lv["val"])
    allv = np.concatenate(vals)
    order = np.argsort(-np.where(allv > 0, allv, np.float32(-1)), kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    kept = (rank < keep) & (allv > 0)
    return np.split(kept, np.cumsum([lv["tok"].size for lv in levels])[:-1])


def dynamic_law(rule: str, target: TableModel, draft: TableModel, depth: int, width: int = 2,
                keep: int | None = None, *, bug: str | None = None) -> RoundLaw:
    """``context -> {emitted: probability}`` of a dynamic tree (``keep`` None: no rerank)."""
    m = width

    def walk(context, levels, kept, carrier, d, cur, path, mass, out):
        p = model_rows(target, context, path)[len(path)]
        if d == depth:
            add_emissions(out, path, mass, p)
            return
        if d == 0:
            block = 0
        else:
            expand = levels[d]["parent"][::m]
            if not np.any(expand == cur):
                add_emissions(out, path, mass, p)
                return
            block = int(np.argmax(expand == cur))
        lv = levels[d]
        r, reach = p, 1.0
        for i in range(m):
            j = block * m + i
            c = int(lv["tok"][j])
            if not (kept[d][j] or carrier[d][j]) or (bug == "target-prune" and p[c] <= 0):
                continue
            if carrier[d][j]:  # the orphan control: a dropped parent passed through untested
                walk(context, levels, kept, carrier, d + 1, j, path + (c,), mass * reach, out)
                reach = 0.0
                break
            if rule == "topk":
                a = r[c]
                nr = r.copy()
                nr[c] = 0.0
                reduced = _norm(nr, r)
            else:
                qi = lv["law"][j]
                a = min(1.0, r[c] / qi[c])
                reduced = _norm(np.maximum(r - qi, 0.0), r)
            if a > 0:
                walk(context, levels, kept, carrier, d + 1, j, path + (c,), mass * reach * a, out)
            reach *= 1.0 - a
            if a < 1:
                r = reduced
        if reach > 0:
            add_emissions(out, path, mass * reach, r)

    def law(context: tuple) -> dict:
        out: dict = {}
        for pr, levels in _trees(draft, context, m, depth, rule):
            kept = _kept(levels, keep, bug == "orphan")
            carrier = [np.zeros_like(k) for k in kept]
            if bug == "orphan":
                below = np.zeros(kept[-1].size, bool)
                for d in range(depth - 1, 0, -1):
                    has = np.zeros(kept[d - 1].size, bool)
                    np.logical_or.at(has, levels[d]["parent"], kept[d] | below)
                    carrier[d - 1] = ~kept[d - 1] & has
                    below = has
            walk(context, levels, kept, carrier, 0, 0, (), pr, out)
        return out

    return law


def scheme_law(name: str, target: TableModel, draft: TableModel, k: int, width: int = 2) -> RoundLaw:
    """The exact round law of a registered dynamic tree or its control, depth k, default width and keep."""
    rule, rerank, bug = DYNAMIC_SPEC[name]
    return dynamic_law(rule, target, draft, k, width, default_keep(width, k) if rerank else None, bug=bug)


__all__ = ["dynamic_law", "scheme_law"]
