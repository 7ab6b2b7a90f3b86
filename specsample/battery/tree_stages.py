"""Diagnosis for token trees: which stage of a tree round is broken, and at which depth.

A static tree round (:mod:`specsample.schemes.tree`) walks down from the root; at the node it
stands on (depth d, after the context and the accepted path), each stage has an exact law given
both models' rows there:

=================== ===========================================================================
stage               law at the node of depth d
=================== ===========================================================================
children            its b children are drafted from q (i.i.d.; distinct: child i from q over the
                    tokens its earlier siblings did not take; top-b: q's b most likely tokens)
sibling-acceptance  child i (token c, drawn from q_i) is accepted with probability
                    min(1, r_i(c) / q_i(c)) (top-b: r_i(c)), r_i the residual after the siblings
                    rejected before it (r_0 = p)
residual            when every child is rejected, the round's last token follows the residual
                    after the last rejection
leaf                at an accepted leaf (or a node with no child to test) the last token follows p
=================== ===========================================================================

:func:`play_tree` plays single rounds of a table tree scheme from random contexts and reads the
walk back from what the round reports (the sibling group drafted at each visited node, which
children were tested and which accepted); :func:`tree_stage_tests` replays each walk's residuals
and tests each stage, pooled as the chain's stages are
(:mod:`specsample.battery.diagnosis`). A failing tree case then names its stage and depth.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats as sps

import stats

from .diagnosis import MIN_EXPECTED, StageResult, _groups, _law_stage
from .report import TestResult
from .. import program_cache
from ..models.tables import TableModel, pair_for_device
from ..schemes import Scheme, program_identity
from ..schemes.tree import report_cuts

TREE_STAGES = ("children", "sibling-acceptance", "residual", "leaf")
TREE_ROW_BUDGET = 1 << 24  # rounds x vocabulary a stage pass holds as residual rows at once


def tree_rule(scheme: Scheme) -> Optional[tuple]:
    """``(rule, branching)`` of a static table tree round, or None.

    A scheme claims it with ``Scheme.rule = "tree:RULE[:B1,B2,...]"`` (RULE one of rrs, rrs-wor, topk;
    the branching defaults to :func:`~specsample.schemes.tree.default_branching` of its k), or it is
    read from the step: a :class:`~specsample.schemes.base.UniformStep` whose round is a
    ``functools.partial`` with ``branching`` and ``rule`` keywords (every registered tree and its
    controls). The round must report its nodes as :func:`~specsample.schemes.tree.verify_tree` does (either layout).
    """
    from ..schemes import StatefulStep
    from ..schemes.tree import TREE_RULES, default_branching

    if isinstance(scheme.step, StatefulStep):  # trees over KV caches: the transformer cases' own stage test
        return None
    claim = getattr(scheme, "rule", None)
    if isinstance(claim, str) and claim.startswith("tree:"):
        parts = claim.split(":")
        if len(parts) not in (2, 3) or parts[1] not in TREE_RULES:
            raise ValueError(f"a tree scheme claims rule 'tree:RULE[:B1,B2,...]' with RULE one of "
                             f"{', '.join(TREE_RULES)}; got {claim!r}")
        br = tuple(int(b) for b in parts[2].split(",")) if len(parts) == 3 else default_branching(scheme.k)
        return parts[1], br
    fn = getattr(scheme.step, "round", None)
    if isinstance(fn, functools.partial) and {"branching", "rule"} <= set(fn.keywords):
        rule = str(fn.keywords["rule"])
        if rule in TREE_RULES:
            return rule, tuple(int(b) for b in fn.keywords["branching"])
    return None


def _keys(ctx: np.ndarray, path: list, order: int, vocab: int) -> np.ndarray:
    """Table row index after each round's context + accepted path (the last ``order`` tokens)."""
    full = np.concatenate([ctx] + [p[:, None] for p in path], axis=1) if path else ctx
    key = np.zeros(full.shape[0], np.int64)
    for j in range(order):
        key = key * vocab + full[:, full.shape[1] - order + j]
    return key


def _norm(w, fallback, s=None):
    """Each row of ``w`` over its sum ``s`` (computed when not given); a row of zero mass is ``fallback``'s row."""
    s = w.sum(axis=1, keepdims=True) if s is None else s
    pos = s[:, 0] > 0
    if pos.all():  # one pass, not three: at V = 32,768 these rows are a quarter of the stage pass
        return w / s
    out = np.array(np.broadcast_to(fallback, w.shape), np.result_type(w, fallback))
    out[pos] = w[pos] / s[pos]
    return out


_PLAY: dict = {}


def _player(scheme: Scheme):
    """A jitted batch of single rounds, kept per step (the step kept too, so its id stays its own); for
    specsample's own schemes loaded whole in a new process: tracing a batch of tree rounds took 0.5-0.8 s
    for each shape, most of a warm tree battery's stage passes."""
    if id(scheme.step) not in _PLAY:
        play = jax.jit(jax.vmap(scheme.step, in_axes=(0, None, None, 0)))
        _PLAY[id(scheme.step)] = (scheme.step, program_cache.bound(play, program_identity(scheme, "tree-stage-rounds")))
    return _PLAY[id(scheme.step)][1]


class TreeRounds(dict):
    """Observations of each stage: a dict of lists (one entry per observation) built by :func:`play_tree`."""


def play_tree(scheme: Scheme, target: TableModel, draft: TableModel, n_rounds: int, seed: int = 0) -> TreeRounds:
    """Single rounds of a static table tree scheme from random contexts, and each stage's observations."""
    rule, branching = tree_rule(scheme)
    P = np.asarray(target.table, np.float64).reshape(-1, target.vocab_size)
    Q = np.asarray(draft.table, np.float64).reshape(-1, target.vocab_size)
    vocab = P.shape[1]
    n_rounds = int(max(64, min(n_rounds, TREE_ROW_BUDGET // (4 * vocab))))
    width = max(target.order, draft.order)
    rng = np.random.default_rng(seed)
    ctx = rng.integers(0, vocab, (n_rounds, width)).astype(np.int64)
    dev_t, dev_d = pair_for_device(TableModel(P.reshape(np.shape(target.table)), target.order),
                                   TableModel(Q.reshape(np.shape(draft.table)), draft.order))
    if scheme.prepare is not None:  # the rounds the engine plays (a tree's tabled residuals)
        dev_t, dev_d = scheme.prepare(dev_t, dev_d)
    keys = jax.random.split(jax.random.key(seed), n_rounds)
    out = jax.device_get(_player(scheme)(keys, dev_t, dev_d, jnp.asarray(ctx, jnp.int32)))  # one compile a scheme
    drafts, tested, accepted = (np.asarray(x) for x in (out.drafts, out.draft_tested, out.draft_accepted))
    walk, cut = report_cuts(branching, drafts.shape[1])
    tokens = np.asarray(out.tokens, np.int64)
    n_acc = np.asarray(out.n_accepted, np.int64)
    final = tokens[np.arange(n_rounds), np.clip(n_acc, 0, len(branching))]
    obs = TreeRounds(children=[], acceptance=[], residual=[], leaf=[])
    rows = np.arange(n_rounds)
    cur = np.zeros(n_rounds, np.int64)
    alive = np.ones(n_rounds, bool)
    path: list = []
    for d, b in enumerate(branching):
        idx = np.broadcast_to(np.arange(b), (n_rounds, b)) if walk else cur[:, None] * b + np.arange(b)
        kids = np.clip(np.take_along_axis(drafts[:, cut[d] : cut[d + 1]], idx, 1), 0, vocab - 1)
        tst = np.take_along_axis(tested[:, cut[d] : cut[d + 1]], idx, 1)
        acc = np.take_along_axis(accepted[:, cut[d] : cut[d + 1]], idx, 1)
        p = P[_keys(ctx, path, target.order, vocab)]
        q = Q[_keys(ctx, path, draft.order, vocab)]
        used = np.zeros_like(q, bool)
        laws = []
        for i in range(b):  # what each child was drafted from
            if rule == "topk":
                top = np.argsort(-q.astype(np.float32), axis=1, kind="stable")[:, i]
                law = np.zeros_like(q)
                law[rows, top] = 1.0
                drawn = law.sum(1) > 0  # a row of no mass drew nothing
            elif rule == "rrs":
                law, drawn = q, q.sum(1) > 0
            else:
                left = q * ~used
                mass = left.sum(axis=1, keepdims=True)
                law, drawn = _norm(left, 0.0, mass), mass[:, 0] > 0
                used[rows[drawn], kids[drawn, i]] = True  # the drawn child is gone for its siblings
            laws.append(law)
            on = alive & drawn
            obs["children"].append((np.full(on.sum(), d), kids[on, i], law[on]))
        r = p.copy()
        any_tested = np.zeros(n_rounds, bool)
        for i in range(b):
            te = alive & tst[:, i]
            c = kids[:, i]
            qi = laws[i]
            rc = r[rows, c]
            if rule == "topk":
                rate = rc
                removed = r.copy()
                removed[rows, c] = 0.0
                reduced = _norm(removed, r)
            else:
                qc = qi[rows, c]
                rate = np.where(qc > 0, np.minimum(1.0, rc / np.where(qc > 0, qc, 1.0)), 0.0)
                left = r - qi
                reduced = _norm(np.maximum(left, 0.0, out=left), r)
            obs["acceptance"].append((np.full(te.sum(), d), np.full(te.sum(), i), rate[te], acc[te, i]))
            rej = te & ~acc[:, i]
            r[rej] = reduced[rej]  # r is this depth's own copy of p's rows
            any_tested |= te
        hit = alive & acc.any(1)
        stop = alive & ~hit
        res, lf = stop & any_tested, stop & ~any_tested
        obs["residual"].append((np.full(res.sum(), d), final[res], r[res]))
        obs["leaf"].append((np.full(lf.sum(), d), final[lf], p[lf]))
        child = np.argmax(acc, 1)
        cur = np.where(hit, cur * b + child, cur)
        path.append(np.where(hit, kids[rows, child], 0))
        alive = hit
    p = P[_keys(ctx, path, target.order, vocab)]
    obs["leaf"].append((np.full(alive.sum(), len(branching)), final[alive], p[alive]))
    obs["rounds"] = n_rounds
    return obs


_HASH_CHUNK = 1 << 22  # floats a chunk of rows holds while rows are hashed and checked


def _row_ranks(rows: np.ndarray) -> np.ndarray:
    """Each row's rank among the distinct rows of ``rows`` [M, V] in lexicographic order (equal rows, one rank).

    A stage's M rows hold few distinct laws, so the rows are grouped by a 64-bit hash of their bits
    first (one sort of M numbers) and only the distinct rows are ranked (:func:`_sorted_ranks`). Every
    row is then compared with its group's first row, so a hash collision cannot merge two laws: it
    sends the whole array to the exact ranking instead. ``np.unique(axis=0)`` compares rows field
    by field (a second a quick battery), and one ``np.unique`` per column is V calls (7 s at V = 32,768).
    """
    rows = np.ascontiguousarray(np.asarray(rows, np.float64) + 0.0)  # -0.0 becomes 0.0
    if rows.shape[0] == 0:
        return np.zeros(0, np.int64)
    bits = rows.view(np.uint64)
    mult = _hash_weights(rows.shape[1])
    step = max(1, _HASH_CHUNK // rows.shape[1])
    h = np.concatenate([(bits[i : i + step] * mult).sum(axis=1, dtype=np.uint64)  # wraps mod 2^64
                        for i in range(0, rows.shape[0], step)])
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.ravel()
    if not all(np.array_equal(rows[i : i + step], rows[first[inv[i : i + step]]])
               for i in range(0, rows.shape[0], step)):
        return _sorted_ranks(rows)
    return _sorted_ranks(rows[first])[inv]


def _hash_weights(v: int) -> np.ndarray:
    """A fixed odd 64-bit weight per column: a row's hash is the wrapped sum of its bits times these."""
    return np.random.default_rng(0).integers(1, 1 << 63, v, dtype=np.uint64) | np.uint64(1)


def _sorted_ranks(rows: np.ndarray) -> np.ndarray:
    """:func:`_row_ranks` by sorting every row: narrow rows with one ``np.lexsort``; wide rows (V > 64)
    of non-negative floats compare as their big-endian bytes do, so a sort of the rows' bytes ranks
    them, each comparison stopping at the first byte that differs (a lexsort there is V passes, and
    ``np.unique`` over the rows as raw bytes took 16 x longer at V = 32,768)."""
    rank = np.empty(rows.shape[0], np.int64)
    if rows.shape[1] > 64 and np.all(rows >= 0):
        be = np.ascontiguousarray(rows, ">f8")
        keys = [row.tobytes() for row in be]
        order = sorted(range(len(keys)), key=keys.__getitem__)
        rank[order] = np.cumsum([False] + [keys[a] != keys[b] for a, b in zip(order, order[1:])])
        return rank
    order = np.lexsort(rows.T[::-1])  # lexsort's last key is its first: column 0 leads
    s = rows[order]
    rank[order] = np.cumsum(np.concatenate([[False], np.any(s[1:] != s[:-1], axis=1)]))
    return rank


def _law(stage: str, parts: list, vocab: int, rng) -> Optional[StageResult]:
    slot = np.concatenate([x[0] for x in parts]).astype(np.int64)
    if slot.size == 0:
        return None
    token = np.concatenate([x[1] for x in parts]).astype(np.int64)
    laws = np.concatenate([x[2] for x in parts])
    # group equal (slot, law) rows, numbered in lexicographic order as np.unique(axis=0) would (which
    # sorts void rows: a second a quick battery); one lexsort, not an np.unique per column (V of them:
    # 98,000 calls and 7 s for the 32k-vocabulary case)
    group, first = _groups(slot, _row_ranks(np.round(laws, 12)))
    return _law_stage(stage, slot, group, token, laws[first], vocab, rng)


def _acceptance(parts: list) -> Optional[StageResult]:
    depth = np.concatenate([x[0] for x in parts]).astype(np.int64)
    if depth.size == 0:
        return None
    sib = np.concatenate([x[1] for x in parts]).astype(np.int64)
    rate = np.concatenate([x[2] for x in parts])
    took = np.concatenate([x[3] for x in parts]).astype(bool)
    certain = int(np.sum((rate <= 0) & took) + np.sum((rate >= 1) & ~took))  # an outcome of probability 0
    stat, dof = 0.0, 0
    best = (-1.0, None, float("nan"), float("nan"), None, None)
    for d in np.unique(depth):
        for i in np.unique(sib[depth == d]):
            sel = (depth == d) & (sib == i)
            var = float(np.sum(rate[sel] * (1 - rate[sel])))
            obs, exp = float(took[sel].mean()), float(rate[sel].mean())
            if var >= MIN_EXPECTED:
                z = stats.bernoulli_sum_test(took[sel].astype(np.int64), np.ones(sel.sum(), np.int64),
                                             rate[sel]).statistic
                stat, dof = stat + z * z, dof + 1
                err = np.sqrt(var) / sel.sum()
                if abs(obs - exp) / err > best[0]:
                    best = (abs(obs - exp) / err, int(d) + 1, obs - exp, float(err), np.array([obs]), np.array([exp]))
    pvalue = 0.0 if certain else (float(sps.chi2.sf(stat, dof)) if dof else 1.0)
    _, worst, est, err, o, e = best
    detail = (f"{depth.size} children tested over {dof} (depth, sibling) slots; " +
              (f"{certain} outcomes of probability 0; " if certain else "") + f"chi-square {stat:.1f} on {dof} dof")
    return StageResult("sibling-acceptance", float("inf") if certain else stat, pvalue, dof, int(depth.size), worst,
                       est, err, o, e, detail)


def tree_stage_tests(obs: TreeRounds, vocab: int, seed: int = 0) -> list:
    """Each tree stage's :class:`~specsample.battery.diagnosis.StageResult`; ``slot`` is the depth
    (1 for the root's children; the depth of the node a residual or leaf token was emitted at, + 1)."""
    rng = np.random.default_rng(seed)
    out = [_law("children", obs["children"], vocab, rng), _acceptance(obs["acceptance"]),
           _law("residual", obs["residual"], vocab, rng), _law("leaf", obs["leaf"], vocab, rng)]
    out = [s for s in out if s is not None]
    # depths counted from 1 for the reader: the children of the root are at depth 1
    return [s._replace(slot=s.slot + 1) if s.stage != "sibling-acceptance" and s.slot is not None else s
            for s in out]


def tree_stage_results(scheme: Scheme, target: TableModel, draft: TableModel, n_rounds: int,
                       seed: int) -> tuple[list, list]:
    """(TestResults ``stage:<tree stage>``, StageResults) of a table tree case; empty for other schemes."""
    if tree_rule(scheme) is None:
        return [], []
    res = tree_stage_tests(play_tree(scheme, target, draft, n_rounds, seed), target.vocab_size, seed)
    return [TestResult(f"stage:{s.stage}", s.statistic, s.pvalue, s.dof, detail=s.detail) for s in res], res


__all__ = ["TREE_STAGES", "play_tree", "tree_rule", "tree_stage_results", "tree_stage_tests"]
