"""Residual chains of a table pair: what a token tree's verification reads at a node, as tables.

At a node of a static tree, a rule tests its children one by one against a residual r that starts
at the target's row p and moves at each rejection. For the rules whose moves do not depend on which
token was rejected, r after i rejections is a function of the window alone, so it can be tabled
once per pair, like the standard rule's residual (:class:`~specsample.models.tables.Residuals`):

- ``rrs`` (children i.i.d. from q): r_0 = p, r_{i+1} = norm(max(0, r_i - q)) (r_i where that is 0);
- ``topk`` (the children are q's b most likely tokens t_1, t_2, ...): r_{i+1} = r_i with t_{i+1}
  removed, renormalised (r_i where nothing is left); the tree controls' ``renormalise=False``
  leaves it unnormalised.

Then a child's test costs two gathers and a comparison, and the token a round ends with one alias draw,
where the on-the-fly walk builds and normalises a V-wide row per child.

Children drafted without replacement (``rrs-wor``) move r by a law that depends on the earlier
siblings: child i + 1 is drawn from q_h, q renormalised over the tokens outside the history h of
the i siblings rejected before it, and a rejection moves r to norm(max(0, r - q_h)). Both are tabled
per window and history (:class:`WorChains`): 1 + V + ... + V^(B-1) histories for a node of at most
B children, so the tables are built where they fit (B <= 3 at a small vocabulary, the default trees).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import threading

import jax
import numpy as np

from .tables import PackedAlias, TableModel, acceptance_thresholds, take

CHAIN_MAX_CELLS = 1 << 24  # tables above this many cells are not built: the walk builds rows on the fly


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TreeChains:
    """The residuals r_0..r_B of every window of ``order`` tokens, their alias tables and (``topk``)
    the candidates.

    ``values`` [windows * (B + 1), V] holds r_i of window w in row ``w * (B + 1) + i`` (float32, the
    value a child is tested against); ``tables`` draws from the same rows; ``top`` [windows, B] are
    the draft's B most likely tokens per window (``topk`` only; else zeros [windows, 1]). Leaves
    may carry a leading pair axis, as the models' tables do.

    ``accept`` (``rrs`` only; else None) has the rows of ``values``: child i + 1 of window w is accepted
    with uniform u exactly when ``u < accept[row(w, i), c]``, the test ``u * q(c) < r_i(c)`` in float32
    (:func:`~specsample.models.tables.acceptance_thresholds`).
    """

    values: jax.Array | np.ndarray
    tables: PackedAlias
    top: jax.Array | np.ndarray
    order: int = dataclasses.field(metadata=dict(static=True))
    depth: int = dataclasses.field(metadata=dict(static=True))
    rule: str = dataclasses.field(metadata=dict(static=True))
    renormalise: bool = dataclasses.field(metadata=dict(static=True))
    accept: jax.Array | np.ndarray | None = None

    def row(self, window, i):
        """Row of r_i after window ``window`` (a traced int; ``i`` static or traced)."""
        return window * (self.depth + 1) + i

    def target_row(self, window):
        """Row of p (r_0) after window ``window``."""
        return self.row(window, 0)

    def value(self, window, i, token):
        """r_i(token) after window ``window``."""
        return take(self.values, self.row(window, i), token)

    def sample(self, window, i, u):
        """A token from r_i after window ``window``, with one uniform ``u`` (an alias draw)."""
        return self.tables.sample(self.row(window, i), u)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WorChains:
    """Without-replacement siblings (``rrs-wor``), tabled per window and history of rejected siblings.

    A history h is the tokens of the siblings rejected so far, read as a base-V number after the
    shorter histories: ``offset(i) + code`` for i tokens, ``offset(i) = 1 + V + ... + V^(i-1)``;
    ``H = offset(B)`` histories per window. With mass(h) the draft's mass outside h (0 where nothing
    is left: that sibling is not drafted), q_h(c) = q(c) / mass(h), and
    ``law_tables`` draws from q_h (from q where nothing is left: a token to report, never tested);
    q_h depends on the set h only, and the walk reads it at the sorted history. ``values``
    [windows * (H + 1), V] holds the residual a sibling is tested against: row 0 the target's row p,
    row 1 + h the residual after the siblings of h were rejected (norm(max(0, r - q_h)), r the
    residual before the last of them); ``tables`` draws the round's last token from it. Leaves may
    carry a leading pair axis, as the models' tables do.

    ``accept`` [windows * H, V] reads a sibling's test as one lookup: the sibling drawn after the
    rejected siblings h (in their order, row ``law_row`` of the unsorted code) is accepted with uniform
    u exactly when ``u < accept[row, c]``, which is the test ``u * (q(c) / mass(h)) < r(c)`` in float32
    (:func:`~specsample.models.tables.acceptance_thresholds`); -1 where nothing is left to draw.
    """

    law_tables: PackedAlias
    values: jax.Array | np.ndarray
    tables: PackedAlias
    order: int = dataclasses.field(metadata=dict(static=True))
    depth: int = dataclasses.field(metadata=dict(static=True))
    vocab: int = dataclasses.field(metadata=dict(static=True))
    rule: str = dataclasses.field(default="rrs-wor", metadata=dict(static=True))
    renormalise: bool = dataclasses.field(default=True, metadata=dict(static=True))
    accept: jax.Array | np.ndarray | None = None

    @property
    def histories(self) -> int:
        return history_offset(self.vocab, self.depth)

    def law_row(self, window, i: int, code):
        """Row of q_h for the history of ``i`` rejected siblings whose tokens read ``code``."""
        return window * self.histories + history_offset(self.vocab, i) + code

    def residual_row(self, window, after=None):
        """Row of the residual: p (``after`` None), or after rejecting the siblings of ``law_row``'s
        history ``after`` (its offset within the window)."""
        first = window * (self.histories + 1)
        return first if after is None else first + 1 + after

    def target_row(self, window):
        """Row of p after window ``window``."""
        return self.residual_row(window)


def history_offset(vocab: int, i: int) -> int:
    """Histories of fewer than ``i`` siblings: 1 + V + ... + V^(i-1)."""
    return sum(vocab**j for j in range(i))


def wor_rows(p: np.ndarray, q: np.ndarray, depth: int):
    """q_h, the draft's mass outside h and the residuals of :class:`WorChains` for rows ``p``, ``q``
    [..., V] (float64): ``(laws [..., H, V], mass [..., H], residuals [..., H + 1, V])``, H histories."""
    v = p.shape[-1]
    laws, masses, res = [], [], [p[..., None, :]]
    before = p[..., None, :]  # the residual each history of this level is tested against
    for i in range(depth):
        # [V^i, i]: the histories of i siblings, the first token most significant
        hist = np.array(list(itertools.product(range(v), repeat=i)), np.int64).reshape(v**i, i)
        taken = (hist[:, :, None] == np.arange(v)).any(axis=1)  # [V^i, V]
        w = np.where(taken, 0.0, q[..., None, :])
        mass = w.sum(axis=-1, keepdims=True)
        law = _normalise(w, np.zeros_like(w))
        after = _normalise(np.maximum(before - law, 0.0), before)
        laws.append(law)
        masses.append(mass[..., 0])
        res.append(after)
        before = np.repeat(after, v, axis=-2)  # history h + (c,) is tested against the residual after h
    return np.concatenate(laws, axis=-2), np.concatenate(masses, axis=-1), np.concatenate(res, axis=-2)


def _normalise(w: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    s = w.sum(axis=-1, keepdims=True)
    return np.where(s > 0, w / np.where(s > 0, s, 1.0), fallback)


def chain_rows(p: np.ndarray, q: np.ndarray, rule: str, depth: int, renormalise: bool = True):
    """r_0..r_depth for rows ``p``, ``q`` [..., V] (float64): ``(residuals [..., depth + 1, V], top [..., depth])``."""
    r = p
    out = [r]
    if rule == "topk":
        # the device's candidates: a stable sort of the float32 row, as the walk sorts it
        top = np.argsort(-q.astype(np.float32), axis=-1, kind="stable")[..., :depth]
        for i in range(depth):
            removed = r.copy()
            np.put_along_axis(removed, top[..., i : i + 1], 0.0, axis=-1)
            r = _normalise(removed, r) if renormalise else removed
            out.append(r)
    elif rule == "rrs":
        top = np.zeros(p.shape[:-1] + (1,), np.int64)  # unused (a zero-width axis would not reshape)
        for _ in range(depth):
            r = _normalise(np.maximum(r - q, 0.0), r)
            out.append(r)
    else:
        raise ValueError(f"no residual chain for tree rule {rule!r}; tabled rules: rrs, topk")
    return np.stack(out, axis=-2), top


def with_chains(target: TableModel, draft: TableModel, *, rule: str, depth: int, renormalise: bool = True,
                max_cells: int = CHAIN_MAX_CELLS) -> tuple[TableModel, TableModel]:
    """The device pair with the target carrying :class:`TreeChains` (:class:`WorChains` for ``rrs-wor``;
    the models unchanged when too big).

    ``target`` and ``draft`` are device models (:func:`~specsample.models.tables.pair_for_device`):
    the chains are built from their float32 tables, the values the walk compares.
    """
    v = target.vocab_size
    width = max(target.order, draft.order)
    p32, q32 = np.asarray(target.table), np.asarray(draft.table)
    lead = p32.shape[:-2]
    n_pairs = int(np.prod(lead, dtype=np.int64))
    # the alias tables' rows; the threshold tables (``accept``) add half as many cells again for rrs-wor and
    # as many for rrs, left out of the bound so that the pairs that get chains (hence their counts) stay the same
    rows = 2 * history_offset(v, depth) + 1 if rule == "rrs-wor" else depth + 1
    cells = n_pairs * v**width * rows * (1 << (v - 1).bit_length())
    if cells > max_cells:
        return target, draft
    if cells > _RECENT_MAX_CELLS:  # too big to keep: built for this run only
        return dataclasses.replace(target, chains=_build(p32, q32, target.order, draft.order, rule, depth,
                                                         renormalise)), draft
    # every run of the engine prepares its pair again: a run on a pair seen lately reuses its chains
    key = (rule, depth, renormalise, target.order, draft.order, p32.shape, q32.shape, p32.dtype.str,
           hashlib.sha1(np.ascontiguousarray(p32)).hexdigest(), hashlib.sha1(np.ascontiguousarray(q32)).hexdigest())
    with _RECENT_LOCK:  # the battery warms its engines from several threads
        chains = _RECENT.pop(key, None)
    if chains is None:
        chains = _build(p32, q32, target.order, draft.order, rule, depth, renormalise)
    with _RECENT_LOCK:
        _RECENT[key] = chains  # the most recently used last
        while len(_RECENT) > _RECENT_SIZE:
            _RECENT.pop(next(iter(_RECENT)))
    return dataclasses.replace(target, chains=chains), draft


_RECENT: dict = {}  # key -> chains, least recently used first
_RECENT_LOCK = threading.Lock()
_RECENT_SIZE, _RECENT_MAX_CELLS = 8, 1 << 20  # at most about 100 MB held


def _build(p32, q32, target_order: int, draft_order: int, rule: str, depth: int, renormalise: bool):
    v = p32.shape[-1]
    width = max(target_order, draft_order)
    lead = p32.shape[:-2]
    windows = np.arange(v**width)
    p = np.asarray(p32, np.float64)[..., windows % v**target_order, :]
    q = np.asarray(q32, np.float64)[..., windows % v**draft_order, :]
    if rule == "rrs-wor":
        laws, mass, res = wor_rows(p, q, depth)
        laws, mass = laws.reshape(lead + (-1, v)), mass.reshape(lead + (-1,))
        # a sibling with nothing left to draw is not tested; its reported token comes from q
        q_h = np.repeat(q, history_offset(v, depth), axis=-2).reshape(laws.shape)
        draw_laws = np.where(mass[..., None] > 0, laws, q_h)
        res32 = _flat32(res, lead, v)
        mass32 = mass.astype(np.float32)
        return WorChains(PackedAlias.build(draw_laws), res32, PackedAlias.build(_drawable(res32)), width, depth,
                         v, accept=_wor_thresholds(res32, mass32, q.astype(np.float32), depth))
    res, top = chain_rows(p, q, rule, depth, renormalise)
    res32 = _flat32(res, lead, v)
    accept = None
    if rule == "rrs":  # every r_i against the window's q row, as the walk reads them (float32)
        q32w = q.astype(np.float32)[..., None, :]
        accept = acceptance_thresholds(res32.reshape(q32w.shape[:-2] + (depth + 1, v)), q32w).reshape(res32.shape)
    return TreeChains(res32, PackedAlias.build(_drawable(res32)), top.astype(np.int32), width, depth, rule,
                      renormalise, accept)


def _wor_thresholds(res32, mass32, q32, depth: int) -> np.ndarray:
    """:attr:`WorChains.accept` from the float32 tables the walk would read: residuals ``res32``
    [..., windows * (H + 1), V], masses ``mass32`` [..., windows * H] and the draft's rows ``q32``
    [..., windows, V]. The sibling after history h (i tokens) is tested against the residual h[:-1]
    left (p when i = 0) with q_h = q / mass(h), divided in float32 (the walk's test before the table)."""
    v = q32.shape[-1]
    lead, n_windows = q32.shape[:-2], q32.shape[-2]
    h = history_offset(v, depth)
    res = res32.reshape(lead + (n_windows, h + 1, v))
    mass = mass32.reshape(lead + (n_windows, h))
    tested = [res[..., :1, :]]  # the residual each history's next sibling is tested against
    for i in range(1, depth):  # after h[:-1]: row 1 + offset(i - 1) + code(h[:-1]), for each last token
        tested.append(np.repeat(res[..., 1 + history_offset(v, i - 1) : 1 + history_offset(v, i), :], v, axis=-2))
    r = np.concatenate(tested, axis=-2)  # [..., windows, H, V]
    with np.errstate(divide="ignore", invalid="ignore"):
        q_h = q32[..., None, :] / np.where(mass > 0, mass, np.float32(1))[..., None]
    t = acceptance_thresholds(r, q_h)
    return np.where(mass[..., None] > 0, t, np.float32(-1)).reshape(lead + (n_windows * h, v))


def _flat32(rows: np.ndarray, lead: tuple, v: int) -> np.ndarray:
    """Rows [..., windows, n, V] as the device's float32 table [..., windows * n, V]."""
    return rows.astype(np.float32).reshape(lead + (-1, v))


def _drawable(rows32: np.ndarray) -> np.ndarray:
    """Rows to build alias tables from: a row left with no mass (the no-renormalisation control's only)
    draws the last token, as an inverse CDF over zero weights does on the device."""
    last = np.zeros(rows32.shape[-1], np.float32)
    last[-1] = 1.0  # the last token, one-hot (not np.eye(v)[-1]: V x V floats at a large vocabulary)
    return np.where(rows32.sum(axis=-1, keepdims=True) > 0, rows32, last)
