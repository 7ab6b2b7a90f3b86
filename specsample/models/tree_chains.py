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
where the on-the-fly walk builds and normalises a V-wide row per child. Children drafted without
replacement (``rrs-wor``) move r by a law that depends on the earlier siblings: not tabled.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from .tables import AliasTable, TableModel, take

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
    """

    values: jax.Array | np.ndarray
    tables: AliasTable
    top: jax.Array | np.ndarray
    order: int = dataclasses.field(metadata=dict(static=True))
    depth: int = dataclasses.field(metadata=dict(static=True))
    rule: str = dataclasses.field(metadata=dict(static=True))
    renormalise: bool = dataclasses.field(metadata=dict(static=True))

    def row(self, window, i):
        """Row of r_i after window ``window`` (a traced int; ``i`` static or traced)."""
        return window * (self.depth + 1) + i

    def value(self, window, i, token):
        """r_i(token) after window ``window``."""
        return take(self.values, self.row(window, i), token)

    def sample(self, window, i, u):
        """A token from r_i after window ``window``, with one uniform ``u`` (an alias draw)."""
        return self.tables.sample(self.row(window, i), u)


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
    """The device pair with the target carrying :class:`TreeChains` (the models unchanged when too big).

    ``target`` and ``draft`` are device models (:func:`~specsample.models.tables.pair_for_device`):
    the chains are built from their float32 tables, the values the walk compares.
    """
    v = target.vocab_size
    width = max(target.order, draft.order)
    lead = np.asarray(target.table).shape[:-2]
    n_pairs = int(np.prod(lead, dtype=np.int64))
    if n_pairs * v**width * (depth + 1) * (1 << (v - 1).bit_length()) > max_cells:
        return target, draft
    windows = np.arange(v**width)
    p = np.asarray(target.table, np.float64)[..., windows % v**target.order, :]
    q = np.asarray(draft.table, np.float64)[..., windows % v**draft.order, :]
    res, top = chain_rows(p, q, rule, depth, renormalise)
    res32 = res.astype(np.float32).reshape(lead + (-1, v))
    # a residual left with no mass (the no-renormalisation control's only) draws the last token, as an
    # inverse CDF over zero weights does on the device
    last = np.zeros(v, np.float32)
    last[-1] = 1.0  # the last token, one-hot (not np.eye(v)[-1]: V x V floats at a large vocabulary)
    draw = np.where(res32.sum(axis=-1, keepdims=True) > 0, res32, last)
    chains = TreeChains(res32, AliasTable.build(draw), top.astype(np.int32), width, depth, rule, renormalise)
    return dataclasses.replace(target, chains=chains), draft
