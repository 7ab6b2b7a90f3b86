"""Samplers that build their own trees (``verify --sampler F --tree dynamic``), and an EAGLE-2 reference.

A sampler that chooses each round's tree itself (EAGLE-2's dynamic trees, a server's per-request
tree policy) has no round law specsample can know: the shape is the sampler's. What it must still
do is emit the target's law, so it is verified as a self-drafting sampler with no rule claimed
(:class:`~specsample.host.sampler.HostSampler` with ``drafts="self"``, ``rule=None``): it is called as
``fn(context int[B, W], draft, target, rng, k=D) -> (tokens [B, D + 1], n_emitted [B], drafts [B, D])``
with the two models as callables (``model(tokens [..., W + t]) -> rows [..., t + 1, V]``), and the
battery tests the stream it produces (positions, joint law, transitions) against p, and the hard
checks (ids, counts, tokens of probability 0) at the floating-point edges.

:func:`eagle2` is a numpy reference of :mod:`specsample.schemes.tree_dynamic`'s rules in that
convention (vectorised over the batch; loops over depth, expanded nodes and sibling slots), and
``eagle2(rule="rrs-wor", keep=n)`` its lossy twin: EAGLE-2's rerank applied to sampled children.
"""

from __future__ import annotations

import numpy as np

from .run import _draw as _cdf_draw
from .sampler import HostSampler


def _norm(w, fallback):
    s = w.sum(-1, keepdims=True)
    return np.where(s > 0, w / np.where(s > 0, s, 1.0), fallback)


def _draw(w, u):
    """One inverse-CDF draw per row of non-negative weights ``w`` [B, V] (never a weight of 0)."""
    return _cdf_draw(np.cumsum(w, -1), w > 0, u)


def _children(q, m: int, rule: str, rng):
    """Tokens [B, m], validity [B, m] and proposal laws [B, m, V] of m children under rows ``q`` [B, V]."""
    b, v = q.shape
    if rule == "topk":
        tok = np.argsort(-q.astype(np.float32), axis=1, kind="stable")[:, :m]
        return tok, np.take_along_axis(q, tok, 1) > 0, np.zeros((b, m, v))
    used = np.zeros((b, v), bool)
    toks, oks, laws = [], [], []
    for _ in range(m):
        w = np.where(used, 0.0, q)
        ok = w.sum(1) > 0
        law = _norm(w, np.zeros_like(w))
        t = _draw(np.where(ok[:, None], w, q), rng.random(b))
        used[np.arange(b), t] |= ok
        toks.append(t)
        oks.append(ok)
        laws.append(law)
    return np.stack(toks, 1), np.stack(oks, 1), np.stack(laws, 1)


def eagle2(width: int = 2, keep=None, rule: str = "topk") -> HostSampler:
    """An EAGLE-2 dynamic-tree sampler in the self-drafting convention (module docstring).

    ``rule="topk"``: the m most likely children, EAGLE-2's rerank keeping ``keep`` nodes (default
    ``m + 2 (D - 1)``); ``rule="rrs-wor"``: sampled distinct children, no rerank unless ``keep`` is
    given, which is the lossy twin.
    """
    if rule not in ("topk", "rrs-wor"):
        raise ValueError(f"eagle2 rule must be topk or rrs-wor, got {rule!r}")
    m = int(width)

    def sample(context, draft, target, rng, k: int = 3):
        ctx = np.asarray(context, np.int64)
        b = ctx.shape[0]
        rows = np.arange(b)
        n_keep = (m + 2 * (k - 1) if keep is None else int(keep)) if (rule == "topk" or keep is not None) else None

        def row(model, paths):  # the model's row after context + each row's path [B, d]
            return np.asarray(model(np.concatenate([ctx, paths], 1)), np.float64)[:, -1]

        # build: per depth, tokens, values, parents (index into the level above), laws, paths
        levels = []
        q0 = row(draft, ctx[:, :0])
        tok, ok, law = _children(q0, m, rule, rng)
        val = np.where(ok, np.take_along_axis(q0, tok, 1), 0.0).astype(np.float32)
        levels.append(dict(tok=tok, val=val, parent=np.zeros((b, m), np.int64), law=law, path=tok[:, :, None]))
        for _ in range(1, k):
            prev = levels[-1]
            expand = np.argsort(-np.where(prev["val"] > 0, prev["val"], -1), axis=1, kind="stable")[:, :m]
            toks, vals, laws, paths = [], [], [], []
            for e in range(m):
                pe = prev["path"][rows, expand[:, e]]
                pv = prev["val"][rows, expand[:, e]]
                q = row(draft, pe)
                t, good, lw = _children(q, m, rule, rng)
                qt = np.take_along_axis(q, t, 1).astype(np.float32)
                vals.append(np.where(good & (qt > 0) & (pv[:, None] > 0), pv[:, None] * qt, 0.0).astype(np.float32))
                toks.append(t)
                laws.append(lw)
                paths.append(np.concatenate([np.repeat(pe[:, None], m, 1), t[:, :, None]], 2))
            levels.append(dict(tok=np.concatenate(toks, 1), val=np.concatenate(vals, 1),
                               parent=np.repeat(expand, m, 1), law=np.concatenate(laws, 1),
                               path=np.concatenate(paths, 1)))
        if n_keep is None:
            kept = [lv["val"] > 0 for lv in levels]
        else:  # the rerank: the n nodes of largest value, shallower and earlier first on ties
            allv = np.concatenate([lv["val"] for lv in levels], 1)
            order = np.argsort(-np.where(allv > 0, allv, -1), axis=1, kind="stable")
            rank = np.empty_like(order)
            np.put_along_axis(rank, order, np.arange(order.shape[1])[None].repeat(b, 0), 1)
            flat = (rank < n_keep) & (allv > 0)
            kept = np.split(flat, np.cumsum([lv["tok"].shape[1] for lv in levels])[:-1], axis=1)
        # verify: walk down, the kept children of the current node in order
        cur = np.zeros(b, np.int64)
        alive = np.ones(b, bool)
        out = np.zeros((b, k + 1), np.int64)
        n_acc = np.zeros(b, np.int64)
        final = np.zeros(b, np.int64)
        for d in range(k):
            lv = levels[d]
            r = row(target, levels[d - 1]["path"][rows, cur] if d else ctx[:, :0])
            if d:
                expand = lv["parent"][:, ::m]
                has = (expand == cur[:, None]).any(1)
                block = np.argmax(expand == cur[:, None], 1)
            else:
                has, block = np.ones(b, bool), np.zeros(b, np.int64)
            hit = np.zeros(b, bool)
            child = np.zeros(b, np.int64)
            for i in range(m):
                j = block * m + i
                c = lv["tok"][rows, j]
                live = alive & ~hit & has & kept[d][rows, j]
                u = rng.random(b)
                rc = r[rows, c]
                if rule == "topk":
                    ok = u < rc
                    removed = r.copy()
                    removed[rows, c] = 0.0
                    reduced = _norm(removed, r)
                else:
                    qi = lv["law"][rows, j]
                    ok = u * qi[rows, c] < rc
                    reduced = _norm(np.maximum(r - qi, 0.0), r)
                take = live & ok
                child = np.where(take, j, child)
                out[:, d] = np.where(take, c, out[:, d])
                r = np.where((live & ~ok)[:, None], reduced, r)
                hit |= take
            stop = alive & ~hit
            final = np.where(stop, _draw(r, rng.random(b)), final)
            n_acc += alive & hit
            alive &= hit
            cur = np.where(hit, child, cur)
        bonus = row(target, levels[-1]["path"][rows, cur])
        final = np.where(alive, _draw(bonus, rng.random(b)), final)
        out[rows, n_acc] = final
        drafts = np.where(np.arange(k)[None] < n_acc[:, None], out[:, :k], 0)
        return out, n_acc + 1, drafts

    name = f"eagle2[{rule}, width {m}" + (f", keep {keep}" if keep is not None else "") + "]"
    return HostSampler(sample, name=name, drafts="self", rule=None)
