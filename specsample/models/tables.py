"""Autoregressive toy models that play target p and draft q.

A model gives next-token distributions for every position of a token array in one call
(teacher forcing), which is what makes parallel verification possible::

    model.probs(tokens[..., order + T]) -> [..., T + 1, V]

Row t is the distribution of the next token after the window
``tokens[..., t : t + order]``: row 0 follows the context alone, row T follows the last
token. A context-free model (order 0) returns its one distribution T + 1 times.

Models are pytrees (their table is the only leaf), so they pass through ``jit`` and
``vmap``; a batch of models is one model with a leading batch axis on ``table``. The
stream of every lane starts from the context "token 0 repeated", which the exact
enumeration uses too.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PROB_ATOL = 1e-5


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AliasTable:
    """Walker's alias tables, one per row: a categorical draw in O(1) from one uniform.

    Row r has ``n`` columns (``n`` a power of two >= V; the padding columns are tokens of
    probability zero). A uniform u picks column ``c = floor(u n)`` (exact: ``n`` is a power
    of two) and keeps token c when the fractional part ``u n - c`` is below
    ``threshold[r, c]``, else emits ``alias[r, c]``. A token of probability zero has threshold
    0 and a positive alias, so it is never drawn. With float32 uniforms on a grid of
    2^-23, every column's split is realised to within 2^-23, the same resolution as an
    inverse-CDF draw from the same uniform; what it saves is the O(V) scan of a CDF row.

    Build with :meth:`build`; the leaves carry any leading (pair) axes of the weights.

    References
    ----------
    Walker, A. J. (1977). An efficient method for generating discrete random variables with
    general distributions. ACM TOMS 3(3), 253-256.
    Vose, M. D. (1991). A linear algorithm for generating random numbers with a given
    distribution. IEEE TSE 17(9), 972-975.
    """

    threshold: jax.Array | np.ndarray  # float32 [..., rows, n]
    alias: jax.Array | np.ndarray  # int32 [..., rows, n]

    @classmethod
    def build(cls, weights) -> "AliasTable":
        """Tables for every row of non-negative ``weights`` (last axis = tokens; rows need not sum to 1)."""
        thr, ali = _alias_columns(weights)
        return cls(jnp.asarray(thr, jnp.float32), jnp.asarray(ali, jnp.int32))

    def sample(self, row, u):
        """The token drawn from row ``row`` (traced int) with uniform ``u`` in [0, 1)."""
        n = self.threshold.shape[-1]
        x = u * n
        c = jnp.clip(jnp.floor(x).astype(jnp.int32), 0, n - 1)
        keep = (x - c) < take(self.threshold, row, c)
        return jnp.where(keep, c, take(self.alias, row, c)).astype(jnp.int32)


def _alias_columns(weights) -> tuple[np.ndarray, np.ndarray]:
    """Each row's alias columns on the host: thresholds (float32 values, held in float64) and aliases (int64),
    shape ``weights.shape[:-1] + (n,)`` with n the power of two >= V."""
    w = np.asarray(weights, dtype=np.float64)
    flat = w.reshape(-1, w.shape[-1])
    n = 1 << (w.shape[-1] - 1).bit_length()
    if flat.shape[0] >= _LOCKSTEP_ROWS:
        thr, ali = _vose_lockstep(flat, n)
    else:
        thr = np.zeros((flat.shape[0], n))
        ali = np.zeros((flat.shape[0], n), dtype=np.int64)
        for r, row in enumerate(flat):
            thr[r], ali[r] = _vose(row, n)
    shape = w.shape[:-1] + (n,)
    return thr.astype(np.float32).astype(np.float64).reshape(shape), ali.reshape(shape)


UNIFORM_BITS = 23  # the engine's uniforms are multiples of 2^-23 (:func:`specsample.engine.rng.uniform`)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedAlias:
    """Alias tables whose column is one int32 word, ``threshold * n + alias``: the device's sampler.

    A uniform u = j 2^-23 picks column ``j >> s`` (s = 23 - log2 n) and keeps it when the low s bits
    of j fall below the column's threshold, which therefore needs only s + 1 bits: ceil(t 2^s) of the
    float threshold t gives the same comparison as :class:`AliasTable` for every uniform on that grid
    (every uniform the engine draws), so the same draws, from one gather instead of two over half the
    memory, in integer arithmetic. A uniform off the grid (a hand-made one) draws a token of positive
    weight still, with a keep boundary rounded up to the grid. Measured (2026-12-04, AVX2 host): a standard round
    at V = 64, k = 4 2-4 % faster, an n-gram round 10-30 %; the without-replacement tree chains, which
    hold V^2 rows a window at B = 3 and whose draws cost a cache miss, went from 0.32 to 0.45 of
    ``standard``'s rounds/s at V = 64 when they took it up (2026-12-02).
    """

    words: jax.Array | np.ndarray  # int32 [..., rows, n]

    @classmethod
    def build(cls, weights) -> "PackedAlias":
        """Tables for every row of non-negative ``weights``, packed from the float32 columns of
        :meth:`AliasTable.build` (built here on the host, not sent to the device and back). From
        :data:`COMPENSATED_COLUMNS` columns on, each column's keep count is rounded so that every token's
        own mass comes out nearest (:func:`_compensated_keep`) instead of rounded up column by column."""
        thr, ali = _alias_columns(weights)
        n = thr.shape[-1]
        scale = float(1 << (UNIFORM_BITS - (n.bit_length() - 1)))  # 2^s
        keep = np.clip(np.ceil(thr * scale), 0, scale).astype(np.int64)
        if n >= COMPENSATED_COLUMNS:
            w = np.asarray(weights, np.float64).reshape(-1, np.shape(weights)[-1])
            flat_k, flat_t, flat_a = keep.reshape(-1, n), thr.reshape(-1, n), ali.reshape(-1, n)
            for r in range(w.shape[0]):
                units = np.zeros(n)
                units[: w.shape[1]] = w[r] * ((1 << UNIFORM_BITS) / w[r].sum())
                flat_k[r] = _compensated_keep(units, flat_t[r], flat_a[r], int(scale))
            keep = flat_k.reshape(thr.shape)
        return cls(jnp.asarray(keep * n + ali, jnp.int32))

    @property
    def threshold(self):
        """Each column's keep threshold as the draws realise it: ceil(t 2^s) 2^-s (float64, numpy)."""
        words = np.asarray(self.words)
        b = words.shape[-1].bit_length() - 1
        return (words >> b) * 2.0 ** -(UNIFORM_BITS - b)

    @property
    def alias(self):
        """Each column's alias (int32, numpy)."""
        words = np.asarray(self.words)
        return words & (words.shape[-1] - 1)

    def law(self, vocab: int) -> np.ndarray:
        """The law the draws realise over every uniform on the engine's 2^-23 grid, exactly (float64,
        numpy; the last axis cut to ``vocab`` tokens): column c keeps c with probability ``threshold``
        and emits its alias otherwise, each column 1/n of the mass. It differs from the row built from
        by at most ``n 2^-24`` in total variation (:func:`draw_resolution_tv`)."""
        thr, ali = self.threshold, np.asarray(self.alias, np.int64)
        n = thr.shape[-1]
        flat_t, flat_a = thr.reshape(-1, n), ali.reshape(-1, n)
        out = np.zeros((flat_t.shape[0], n))
        rows = np.arange(flat_t.shape[0])[:, None]
        np.add.at(out, (rows, np.broadcast_to(np.arange(n), flat_t.shape)), flat_t / n)
        np.add.at(out, (rows, flat_a), (1.0 - flat_t) / n)
        return out.reshape(thr.shape)[..., :vocab]

    def sample(self, row, u):
        """The token drawn from row ``row`` (traced int) with uniform ``u`` in [0, 1)."""
        n = self.words.shape[-1]
        b = n.bit_length() - 1  # alias bits; the threshold sits above them
        s = UNIFORM_BITS - b
        j = jnp.clip((u * (1 << UNIFORM_BITS)).astype(jnp.int32), 0, (1 << UNIFORM_BITS) - 1)
        c = j >> s
        w = take(self.words, row, c)
        return jnp.where((j & ((1 << s) - 1)) < (w >> b), c, w & (n - 1)).astype(jnp.int32)


COMPENSATED_COLUMNS = 1 << 13  # from this many alias columns (V > 4,096) the keep counts are compensated


def _compensated_keep(units: np.ndarray, thr: np.ndarray, alias: np.ndarray, full: int) -> np.ndarray:
    """Each column's keep count (of ``full`` equally likely uniforms a column) for one row whose token c
    should get ``units[c]`` of the row's 2^23 uniforms, chosen along the alias forest so that every token's
    own total is within half a uniform of it.

    Rounding each column's threshold up (as the float test does on the uniforms' grid) gives each column's
    own token up to a uniform too many, always in the same direction: at V = 131,072 that moved the
    standard rule's acceptance rate by about 1e-3, which the accepted-drafts test saw at a million rounds.
    Here a column passes ``full - keep`` uniforms to its alias, so a token's total is its own keep count
    plus what the columns that alias to it pass on. Columns are settled leaves first: each keeps the
    nearest whole count to its token's units less what its children already pass it, so a child's rounding
    is made good by its parent and does not accumulate: a token lands within half a uniform of its share.
    Where that count would fall below 0 (a token whose own column is nearly all alias, given more than its
    share by its children's roundings) it keeps nothing and the surplus moves on to the next column up
    that can take it; a full column (no alias) keeps everything and takes its children's roundings. At V
    = 131,072 (Dirichlet(1)) 99.6 % of tokens are within half a uniform and none is off by more than 11;
    the realised law's TV halves and the acceptance rate's drift falls from 1e-3 to 6e-6. A token of weight
    zero keeps nothing. The realised law (:meth:`PackedAlias.law`) is exact, whichever counts are chosen.
    """
    n = units.size
    parent = np.where((thr < 1.0) & (alias != np.arange(n)), alias, -1).tolist()
    pending = [0] * n
    for c in range(n):
        if parent[c] >= 0:
            pending[parent[c]] += 1
    inflow = [0] * n
    keep = [0] * n
    u = units.tolist()
    stack = [c for c in range(n) if pending[c] == 0]
    done = 0
    while stack:
        c = stack.pop()
        done += 1
        up = parent[c]
        if up < 0:
            keep[c] = full if u[c] > 0 or inflow[c] > 0 else 0
            continue
        keep[c] = min(full, max(0, math.floor(u[c] - inflow[c] + 0.5))) if u[c] > 0 else 0
        inflow[up] += full - keep[c]
        pending[up] -= 1
        if pending[up] == 0:
            stack.append(up)
    if done != n:  # a cycle: never from Vose's construction, whose aliases point at tokens settled later
        raise AssertionError("alias columns do not form a forest")
    return np.asarray(keep, np.int64)


def draw_resolution_tv(vocab: int) -> float:
    """The most that one draw from float32 uniforms (2^23 equally likely values) can realise a law of
    ``vocab`` tokens off, in total variation: ``n 2^-24`` for the alias tables' n = 2^ceil(log2 V)
    columns (each column's split is rounded to 2^-23 of the total mass). 1.2e-7 at V = 2,
    6.1e-5 at V = 1,024, 0.002 at V = 32,768, 0.0078 at V = 131,072: a floor under the deviations any
    sampler fed such uniforms can be held to, specsample's engine included.

    >>> draw_resolution_tv(32768)
    0.001953125
    """
    n = 1 << (max(int(vocab), 2) - 1).bit_length()
    return n * 2.0 ** -(UNIFORM_BITS + 1)


SELECT_MAX = 16  # a table of at most this many entries is read by selects, not a gather (see take)


def take(table, row, col):
    """``table[row, col]`` of a 2-D table, as a gather with a flat index while that fits in int32.

    Under ``vmap`` a 2-D index becomes an index array with a minor axis of 2, which XLA
    on CPU fills and reads element by element; a flat index vectorises. A table of at most
    :data:`SELECT_MAX` entries (a context-free row of V <= 8, a residual pair of rows) is read by
    a chain of selects instead, the same value to the bit: XLA on CPU reads a gather one lane at a
    time (about 0.9 ns each, measured) where 16 selects run vectorised across the lanes in 0.4 ns.
    """
    t = jnp.asarray(table)
    if read_by_selects(t):
        return _select(t.reshape(-1), row * t.shape[1] + col)
    if t.ndim == 2 and t.size < 2**31:
        return t.reshape(-1)[row * t.shape[1] + col]
    return t[row, col]


def read_by_selects(table) -> bool:
    """Whether :func:`take` reads ``table`` with a chain of selects (else with a gather)."""
    return jnp.ndim(table) == 2 and jnp.size(table) <= SELECT_MAX


def _select(flat, idx):
    """``flat[idx]`` as jnp indexes it (a negative index counts from the end, then indices are clamped),
    written as one select per entry: entry j wins where the index is at least j."""
    idx = jnp.asarray(idx)
    idx = jnp.where(idx < 0, idx + flat.shape[0], idx)
    out = jnp.broadcast_to(flat[0], idx.shape)
    for j in range(1, flat.shape[0]):
        out = jnp.where(idx >= j, flat[j], out)
    return out


_LOCKSTEP_ROWS = 8  # from this many rows, all rows step together (numpy over rows; a Python loop per row below)


def _vose_lockstep(w: np.ndarray, n: int):
    """:func:`_vose` for every row of ``w`` at once: the same stack moves and float64 arithmetic,
    so the same tables, with each step a numpy operation over the rows still working.

    A Python loop per row cost 0.26 s for a 512 x 512 table, 0.08 s here (the edge rows build eight).
    """
    rows, v = w.shape
    total = np.array([row.sum() for row in w])  # the per-row sum of _vose (a 2-D sum may round otherwise)
    if not np.all(total > 0):
        raise ValueError("cannot build an alias table for a row of zero weights")
    scaled = np.zeros((rows, n))
    scaled[:, :v] = w * (n / total)[:, None]
    s = scaled.copy()
    thr = np.zeros((rows, n))
    alias = np.broadcast_to(np.arange(n), (rows, n)).copy()
    is_small = scaled < 1.0
    # each row's two stacks, bottom first in ascending index (the order _vose lists them)
    small = np.argsort(~is_small, axis=1, kind="stable")
    large = np.argsort(is_small, axis=1, kind="stable")
    n_small = is_small.sum(axis=1)
    n_large = n - n_small
    sf, tf, af, smf, lgf = s.reshape(-1), thr.reshape(-1), alias.reshape(-1), small.reshape(-1), large.reshape(-1)
    base = np.arange(rows) * n  # flat indices: 2-D fancy indexing costs several times more per step
    while True:
        r = np.nonzero((n_small > 0) & (n_large > 0))[0]
        if r.size == 0:
            break
        n_small[r] -= 1
        ra = base[r] + smf[base[r] + n_small[r]]
        b = lgf[base[r] + n_large[r] - 1]
        rb = base[r] + b
        sa = sf[ra]
        tf[ra], af[ra] = sa, b
        sf[rb] -= 1.0 - sa
        moved = sf[rb] < 1.0
        rm = r[moved]
        smf[base[rm] + n_small[rm]] = b[moved]
        n_small[rm] += 1
        n_large[rm] -= 1
    cols = np.arange(n)
    for stack, count in ((small, n_small), (large, n_large)):  # left over only by rounding: full columns
        rr, jj = np.nonzero(cols[None, :] < count[:, None])
        thr[rr, stack[rr, jj]] = 1.0
    zero = np.ones((rows, n), dtype=bool)
    zero[:, :v] = w <= 0
    fill = zero & (thr >= 1.0)
    alias[fill] = np.broadcast_to(np.argmax(w, axis=1)[:, None], (rows, n))[fill]
    thr[zero] = 0.0
    picked = np.take_along_axis(scaled, alias, axis=1)
    assert np.all(picked[thr < 1.0] > 0), "alias table points at a zero-weight token"
    return thr, alias


def _vose(row: np.ndarray, n: int):
    """Vose's construction for one row of weights, padded to ``n`` columns (float64)."""
    total = row.sum()
    if not total > 0:
        raise ValueError("cannot build an alias table for a row of zero weights")
    scaled = np.zeros(n)
    scaled[: row.size] = row * (n / total)
    thr = np.zeros(n)
    alias = np.arange(n)
    small = [i for i in range(n) if scaled[i] < 1.0]
    large = [i for i in range(n) if scaled[i] >= 1.0]
    s = scaled.tolist()
    while small and large:
        a, b = small.pop(), large[-1]
        thr[a], alias[a] = s[a], b
        s[b] -= 1.0 - s[a]
        if s[b] < 1.0:
            small.append(large.pop())
    for i in large + small:  # left over only by rounding: each is (nearly) a full column
        thr[i] = 1.0
    # a token of weight zero must never be its own column's pick, even after rounding
    zero = np.ones(n, dtype=bool)
    zero[: row.size] = row <= 0
    alias[zero & (thr >= 1.0)] = int(np.argmax(row))
    thr[zero] = 0.0
    assert np.all(scaled[alias[thr < 1.0]] > 0), "alias table points at a zero-weight token"
    return thr, alias


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Residuals:
    """Alias tables of the residual ``norm(max(0, p - q))`` for every window of ``order`` tokens, then
    of the target's own rows: a round's last token, a residual's or the bonus token, is one alias draw.

    Built by :func:`pair_for_device` for one target and the draft it is paired with (the
    rows are the float32 tables the device uses, so the residual matches the acceptance
    test ``u q(x) < p(x)`` exactly). Where ``max(0, p - q)`` vanishes (p == q, where no
    rejection can happen) the row is p itself, as in :func:`specsample.schemes.base.residual`.
    Each pair's block has V**order residual rows, then the target's V**m rows (m its order), the
    same tables as the target's own sampler.

    ``thresholds`` [V**order, V] (float32) read the acceptance test as one lookup: the draft x of
    window c is accepted with uniform u exactly when ``u < thresholds[c, x]``, which holds for every
    float32 u exactly when ``u * q(x) < p(x)`` does in float32 (:func:`acceptance_thresholds`).
    """

    tables: PackedAlias
    order: int = dataclasses.field(metadata=dict(static=True))
    thresholds: jax.Array | np.ndarray


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TableModel:
    """An order-m n-gram model: a table of next-token distributions per context window.

    Attributes
    ----------
    table : array, shape (V**order, V)
        Row ``c`` is the next-token distribution after the window whose tokens, read as
        a base-V number (oldest digit first), equal ``c``. Order 0 has one row.
    order : int
        Number of preceding tokens the distribution depends on (static under jit).
    sampler : PackedAlias or AliasTable, optional
        Alias tables of the rows, for O(1) draws (:meth:`with_sampler` makes :class:`PackedAlias`). Without them
        :meth:`sample` builds a cumulative row on the fly.
    residuals : Residuals, optional
        On a target paired with its draft by :func:`pair_for_device`: the residual of every
        window, so a rejection draws in O(1) instead of building ``max(0, p - q)``.
    paired : bool
        True on both models of a pair made by :func:`pair_for_device` (static). A model
        built anew inside a scheme (a warped draft, say) is not paired, so the residual
        fast path, which is only right for the original pair, switches itself off. (A copy
        made with ``dataclasses.replace`` keeps the flag: build a new ``TableModel``.)
    pair : int array, optional
        Set by the engine on a model made by :meth:`flat_pairs`, whose tables hold the rows
        of several pairs one after another: the pair this lane reads (:meth:`at_pair`).
        None for an ordinary, single-pair model.
    chains : TreeChains, optional
        On a paired target prepared for a token tree
        (:func:`specsample.models.tree_chains.with_chains`): the residual after each number of
        rejected children, for every window, so a tree walk reads its nodes as gathers.
    """

    table: jax.Array | np.ndarray
    order: int = dataclasses.field(metadata=dict(static=True))
    sampler: PackedAlias | AliasTable | None = None
    residuals: Residuals | None = None
    paired: bool = dataclasses.field(default=False, metadata=dict(static=True))
    pair: jax.Array | None = None
    chains: Any = None

    @property
    def vocab_size(self) -> int:
        return int(self.table.shape[-1])

    def _row(self, idx, rows: int | None = None):
        """Table row of window ``idx`` for this lane's pair (rows per pair: V**order unless given)."""
        if self.pair is None:
            return idx
        return idx + self.pair * (self.vocab_size**self.order if rows is None else rows)

    def probs(self, tokens):
        """Next-token distributions for every window of ``tokens`` (jnp; jit/vmap friendly)."""
        idx = window_index(tokens, self.order, self.vocab_size, jnp)
        return jnp.asarray(self.table)[self._row(idx)]

    def prob_of(self, tokens, nxt):
        """``p(nxt[t] | window t)`` for each t < len(nxt), without building full rows."""
        idx = self._row(window_index(tokens, self.order, self.vocab_size, jnp)[..., : nxt.shape[-1]])
        return take(self.table, idx, nxt)

    def row(self, tokens, t):
        """The distribution after window ``t`` (``t`` may be traced): ``probs(tokens)[t]``."""
        idx = window_index(tokens, self.order, self.vocab_size, jnp)
        return jnp.asarray(self.table)[self._row(idx[t])]

    def sample(self, tokens, u):
        """Draw the token that follows the last window of ``tokens``, from a uniform ``u``."""
        return self.sample_row(window_index(tokens, self.order, self.vocab_size, jnp)[-1], u)

    def sample_row(self, row, u):
        """Draw from table row ``row`` (traced int) with a uniform ``u``.

        Alias tables when the model has them (O(1)); otherwise an inverse CDF on a
        cumulative row built here (under ``vmap`` over lanes the table is not batched, so
        that cumulative table is computed once per batch, not per lane).
        """
        row = self._row(row)
        if self.sampler is not None:
            return self.sampler.sample(row, u)
        table = jnp.asarray(self.table)
        return inverse_cdf(jnp.cumsum(table, axis=-1)[row], u, table[row])

    def sample_residual(self, row, u):
        """Draw row ``row`` of the paired :class:`Residuals` with a uniform ``u``: the residual of window
        ``row`` below V**residuals.order, the target's row ``row - V**residuals.order`` from there."""
        res = self.residuals
        return res.tables.sample(self._row(row, self.vocab_size**res.order + self.vocab_size**self.order), u)

    def flat_pairs(self) -> "TableModel":
        """This batch of pairs (leaves with a leading pair axis) as one model whose tables hold
        every pair's rows one after another; :meth:`at_pair` picks a lane's pair.

        Lets the engine run the lanes of all pairs as one batch over unbatched tables, where
        every table lookup is a gather with a plain index.
        """
        def merge(x):
            return x.reshape((-1,) + x.shape[2:])

        sampler = None if self.sampler is None else jax.tree.map(merge, self.sampler)
        residuals = None if self.residuals is None else jax.tree.map(merge, self.residuals)
        chains = None if self.chains is None else jax.tree.map(merge, self.chains)
        return TableModel(merge(jnp.asarray(self.table)), self.order, sampler, residuals, self.paired, chains=chains)

    def at_pair(self, pair) -> "TableModel":
        """The same flat model, reading the rows of pair ``pair`` (see :meth:`flat_pairs`)."""
        return dataclasses.replace(self, pair=pair)

    def with_sampler(self) -> "TableModel":
        """This model in float32 with alias tables, ready for the device (not paired)."""
        t32 = np.asarray(self.table, dtype=np.float64).astype(np.float32)
        return TableModel(jnp.asarray(t32), self.order, PackedAlias.build(t32))

    def probs_np(self, tokens) -> np.ndarray:
        """The same as :meth:`probs`, in numpy float64, for references and exact laws."""
        idx = window_index(np.asarray(tokens), self.order, self.vocab_size, np)
        return np.asarray(self.table, dtype=np.float64)[idx]


RESIDUAL_MAX_CELLS = 1 << 24  # residual alias tables above this many cells are built on the fly instead


def pair_for_device(target: TableModel, draft: TableModel, *,
                    max_cells: int = RESIDUAL_MAX_CELLS) -> tuple[TableModel, TableModel]:
    """Both models in float32 with alias tables, the target carrying the pair's residuals.

    The residual of window c (``W = max(orders)`` tokens) is built from the float32 rows
    the device compares in the acceptance test, so it is exactly the residual the rule
    asks for. Tables may carry a leading pair axis. When the residual tables would exceed
    ``max_cells`` cells the models are returned unpaired and rejections build the residual
    on the fly.
    """
    t, d = target.with_sampler(), draft.with_sampler()
    v = t.vocab_size
    width = max(t.order, d.order)
    lead = np.asarray(t.table).shape[:-2]
    n = 1 << (v - 1).bit_length()
    # the bonus rows and the acceptance thresholds (V**W rows of V) at most triple it
    if int(np.prod(lead, dtype=np.int64)) * v**width * n > max_cells:
        return t, d
    windows = np.arange(v**width)
    p32 = np.asarray(t.table)[..., windows % v**t.order, :]  # the float32 rows the device compares
    q32 = np.asarray(d.table)[..., windows % v**d.order, :]
    p, q = p32.astype(np.float64), q32.astype(np.float64)
    res = np.maximum(p - q, 0.0)
    res = np.where(res.sum(axis=-1, keepdims=True) > 0, res, p)
    # the target's rows after the residuals: the same tables as its own sampler's (built row by row
    # from the same float32 values), so the last token of a round is one alias draw
    rows = np.concatenate([res, np.asarray(t.table, dtype=np.float64)], axis=-2)
    residuals = Residuals(PackedAlias.build(rows), width, jnp.asarray(acceptance_thresholds(p32, q32)))
    return (TableModel(t.table, t.order, t.sampler, residuals, paired=True),
            TableModel(d.table, d.order, d.sampler, paired=True))


def acceptance_thresholds(p, q) -> np.ndarray:
    """The acceptance test ``u * q < p`` (float32, elementwise) as a threshold on u alone.

    For each entry, the smallest float32 ``t`` with ``float32(t * q) >= p`` (0 where p = 0, inf
    where q = 0 < p), so that ``u < t`` exactly when ``u * q < p`` for every float32 u >= 0:
    rounding is monotone, so the u that pass form a prefix of the float32 numbers. A round then
    reads one table instead of two and multiplies nothing (the standard rule at V = 64, k = 4:
    1.04-1.08 x the rounds/s), with the same acceptances to the bit.

    Subnormal p and q count as zero, as XLA on CPU computes (it flushes them: ``0 < 1e-40`` is false
    there). A product below the smallest normal number is below any normal p, flushed or not, so the
    table is the CPU's test, and the same test on every device (t is 0, normal or inf, never subnormal).
    """
    tiny = np.finfo(np.float32).tiny
    p, q = (np.asarray(x, np.float32) for x in (p, q))
    p, q = (np.where(x < tiny, np.float32(0), x) for x in (p, q))
    live = (q > 0) & (p > 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = np.where(live, p.astype(np.float64) / np.where(live, q, 1.0), 0.0).astype(np.float32)
    down, up = np.float32(-1.0), np.float32(np.inf)
    for _ in range(64):  # the float64 quotient rounded to float32 is within an ulp or two of the answer
        lower = np.nextafter(t, down)
        step_down = live & (t > 0) & (lower * q >= p)
        step_up = live & (t * q < p)
        if not (step_down.any() or step_up.any()):
            break
        t = np.where(step_down, lower, np.where(step_up, np.nextafter(t, up), t))
    else:
        raise AssertionError("acceptance thresholds did not settle")
    return np.where((q <= 0) & (p > 0), np.float32(np.inf), t).astype(np.float32)


def last_positive(weights):
    """Index of the last positive entry along the last axis."""
    v = weights.shape[-1]
    return (v - 1 - jnp.argmax(weights[..., ::-1] > 0, axis=-1)).astype(jnp.int32)


def inverse_cdf(cdf, u, weights):
    """Inverse-CDF draw: the first token of positive weight whose cumulative exceeds ``u * total``.

    ``cdf`` may come from a parallel prefix sum (XLA's cumsum is not sequential: it can
    step down, or step up across a zero weight, by an ulp), so candidates are restricted
    to positive weights; a rounding of ``u * total`` to ``total`` falls back to the last
    positive weight. A token of weight zero is never returned (when any weight is > 0).
    """
    return _first_past(cdf, u * cdf[..., -1], weights)


def _first_past(cdf, t, weights):
    """The first index of positive weight whose cumulative exceeds ``t``; none (a rounding of ``t`` up to
    the total): the last of positive weight."""
    hit = (weights > 0) & (cdf > t[..., None])
    idx = jnp.argmax(hit, axis=-1)
    return jnp.where(jnp.any(hit, axis=-1), idx, last_positive(weights)).astype(jnp.int32)


# XLA's CPU cumsum is a parallel prefix sum: at V = 32768 it costs 4 ns a token, 60 x a plain sum, and
# a row drawn that way cost multidraft, kseq and the tree walks seconds per 4,096 sequences
CUMSUM_MAX_VOCAB = 1024  # up to here one prefix sum is as fast as blocks (3 us a row), and its streams stay
DRAW_BLOCK = 256  # tokens per block: the fastest of 64-1024 at V = 4,097, 32,768 and 152,064


def draw_weights(weights, u):
    """Inverse-CDF draw from non-negative, unnormalised ``weights`` [..., V] with uniforms ``u`` [...].

    The first token of positive weight whose cumulative weight exceeds ``u * total``; a token of weight
    zero is never returned when any weight is positive (:func:`inverse_cdf`), and an all-zero row gives
    V - 1. Rows of at most :data:`CUMSUM_MAX_VOCAB` tokens take one prefix sum. Longer rows are cut into
    blocks of :data:`DRAW_BLOCK` tokens: the block totals' prefix sum finds the block, and a prefix sum
    inside it the token, so a draw reads the row once instead of scanning it (same law; on a rounding
    boundary the token can differ from the one-sum draw's by an ulp of the cumulative).
    """
    v = weights.shape[-1]
    if v <= CUMSUM_MAX_VOCAB:
        return inverse_cdf(jnp.cumsum(weights, axis=-1), u, weights)
    nb = -(-v // DRAW_BLOCK)
    pad = [(0, 0)] * (weights.ndim - 1) + [(0, nb * DRAW_BLOCK - v)]
    blocks = jnp.pad(weights, pad).reshape(weights.shape[:-1] + (nb, DRAW_BLOCK))
    totals = jnp.sum(blocks, axis=-1)
    cum = jnp.cumsum(totals, axis=-1)
    t = u * cum[..., -1]
    b = _first_past(cum, t, totals)
    before = jnp.where(b > 0, jnp.take_along_axis(cum, jnp.maximum(b - 1, 0)[..., None], axis=-1)[..., 0], 0.0)
    local = jnp.take_along_axis(blocks, b[..., None, None], axis=-2)[..., 0, :]
    # none past t (a rounding between the two sums): the block's last token of positive weight
    i = _first_past(before[..., None] + jnp.cumsum(local, axis=-1), t, local)
    return jnp.minimum(b * DRAW_BLOCK + i, v - 1)


def window_index(tokens, order: int, vocab: int, xp):
    """Row index of the table for each window of ``order`` tokens; shape (..., T + 1)."""
    n = tokens.shape[-1] - order
    if n < 0:
        raise ValueError(f"need at least {order} context tokens, got {tokens.shape[-1]}")
    idx = xp.zeros(tokens.shape[:-1] + (n + 1,), dtype=xp.int32)
    for j in range(order):  # static, small
        idx = idx * vocab + tokens[..., j : j + n + 1].astype(xp.int32)
    return idx


def validate_table(table, name: str, *, atol: float = PROB_ATOL) -> np.ndarray:
    """Check a probability table (last axis = tokens); return it as float64, renormalised."""
    t = np.asarray(table, dtype=np.float64)
    if t.ndim < 1 or t.shape[-1] < 2:
        raise ValueError(f"{name} must have at least 2 tokens on its last axis, got shape {t.shape}")
    if not np.all(np.isfinite(t)):
        raise ValueError(f"{name} contains NaN or inf; every probability must be finite")
    if np.any(t < 0):
        raise ValueError(f"{name} has a negative probability ({t.min():.3g}); probabilities must be >= 0")
    s = t.sum(axis=-1, keepdims=True)
    if np.any(np.abs(s - 1) > atol):
        raise ValueError(
            f"{name} is not normalised: a row sums to {float(s.ravel()[np.argmax(np.abs(s - 1).ravel())]):.6g} "
            f"(tolerance {atol:g}); divide each row by its sum"
        )
    return t / s


def context_free(probs) -> TableModel:
    """A model whose next-token distribution ignores the context."""
    p = validate_table(probs, "probs")
    if p.ndim != 1:
        raise ValueError(f"probs must be a vector of V probabilities, got shape {p.shape}")
    return TableModel(p[None, :], 0)


def ngram(table, order: int) -> TableModel:
    """A model of the given order from a table of shape (V**order, V)."""
    t = validate_table(table, "table")
    v = t.shape[-1]
    if t.ndim != 2 or t.shape[0] != v**order:
        raise ValueError(f"an order-{order} table over V={v} must have shape ({v**order}, {v}), got {t.shape}")
    return TableModel(t, int(order))


def random_ngram(seed: int, vocab: int, order: int, concentration: float = 1.0) -> TableModel:
    """A seeded random order-m model: each context row ~ Dirichlet(concentration)."""
    rng = np.random.default_rng(seed)
    table = rng.dirichlet(np.full(vocab, concentration), size=vocab**order)
    return ngram(table, order)


# --- warping -------------------------------------------------------------------------


def warp_probs(probs, *, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None) -> np.ndarray:
    """Temperature, then top-k, then top-p on each row of a probability table (float64).

    Temperature T maps p to p**(1/T) renormalised (logits divided by T); zeros stay zero.
    Top-k keeps the k most probable tokens (ties: the lower token id wins). Top-p keeps
    the smallest set of most probable tokens whose mass reaches ``top_p``.
    """
    p = np.asarray(probs, dtype=np.float64)
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature} (use the greedy scheme for T = 0)")
    if temperature != 1.0:
        with np.errstate(divide="ignore"):
            logp = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), -np.inf) / temperature
        logp -= logp.max(axis=-1, keepdims=True)
        p = np.exp(logp)
        p /= p.sum(axis=-1, keepdims=True)
    order = np.argsort(-p, axis=-1, kind="stable")  # descending, ties by token id
    ranked = np.take_along_axis(p, order, axis=-1)
    keep_ranked = np.ones_like(ranked, dtype=bool)
    if top_k is not None:
        if int(top_k) < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        keep_ranked[..., int(top_k):] = False
    if top_p is not None:
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
        before = np.cumsum(ranked, axis=-1) - ranked  # mass strictly before each token
        keep_ranked &= before < top_p
    keep = np.zeros_like(keep_ranked)
    np.put_along_axis(keep, order, keep_ranked, axis=-1)
    p = np.where(keep, p, 0.0)
    return p / p.sum(axis=-1, keepdims=True)


def warp(model: TableModel, *, temperature: float = 1.0, top_k: int | None = None,
         top_p: float | None = None) -> TableModel:
    """A new model whose every distribution is warped (see :func:`warp_probs`)."""
    t = warp_probs(np.asarray(model.table, dtype=np.float64), temperature=temperature,
                   top_k=top_k, top_p=top_p)
    return TableModel(t, model.order)


# --- exact laws ----------------------------------------------------------------------


def initial_context(order: int) -> np.ndarray:
    """The context every stream starts from: token 0 repeated."""
    return np.zeros(order, dtype=np.int32)


def exact_joint(model: TableModel, length: int, max_cells: int = 1 << 22) -> np.ndarray:
    """Exact probability of each of the V**L first-L-token sequences (float64).

    Returns an array of shape (V,) * L. Enumerates sequences, so V**L must be small.
    """
    v, m = model.vocab_size, model.order
    if v**length > max_cells:
        raise ValueError(f"V**L = {v}**{length} cells is too many to enumerate (max {max_cells})")
    table = np.asarray(model.table, dtype=np.float64)
    joint = np.ones(1)
    seqs = np.zeros((1, m), dtype=np.int64)  # the last m tokens of each prefix
    for _ in range(length):
        rows = table[window_index(seqs, m, v, np)[:, 0]]
        joint = (joint[:, None] * rows).ravel()
        ext = np.concatenate([np.repeat(seqs, v, axis=0), np.tile(np.arange(v), len(seqs))[:, None]], axis=1)
        seqs = ext[:, ext.shape[1] - m:]
    return joint.reshape((v,) * length)


def all_sequences(vocab: int, length: int) -> np.ndarray:
    """Every sequence of the given length, in the row-major order of :func:`exact_joint`."""
    if length == 0:  # the one empty sequence (numpy cannot infer -1 rows of 0 columns)
        return np.zeros((1, 0), np.int64)
    return np.array(list(itertools.product(range(vocab), repeat=length)), dtype=np.int64).reshape(-1, length)


def exact_marginals(model: TableModel, length: int) -> np.ndarray:
    """Exact law of each of the first L stream tokens, shape (L, V) (float64).

    A forward pass over the V**order context windows, so it works where the joint is too
    large to enumerate.
    """
    v, m = model.vocab_size, model.order
    table = np.asarray(model.table, dtype=np.float64)
    state = np.zeros(v**m)
    state[0] = 1.0  # the initial window is token 0 repeated: row 0
    out = np.empty((length, v))
    for t in range(length):
        out[t] = state @ table
        if m:
            flow = state[:, None] * table  # [window, next token]
            nxt = (np.arange(v**m)[:, None] * v + np.arange(v)[None, :]) % (v**m)
            state = np.bincount(nxt.ravel(), weights=flow.ravel(), minlength=v**m)
    return out


def lift(model: TableModel, order: int) -> TableModel:
    """The same model written as an order-``order`` table (it ignores the extra, older tokens).

    Lets models of different orders share one batched engine call.
    """
    if order < model.order:
        raise ValueError(f"cannot lift an order-{model.order} model to order {order}")
    v = model.vocab_size
    table = np.asarray(model.table)
    extra = order - model.order
    return TableModel(np.tile(table, (v**extra, 1)), order)
