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

import jax
import jax.numpy as jnp
import numpy as np

PROB_ATOL = 1e-5
SEARCH_FROM = 256  # vocabularies above this sample by binary search instead of compare-all  # float32 tables sum to 1 only up to ~V * 6e-8


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
    cdf, last : array, optional
        Cumulative rows computed in float64 (so exactly monotone, flat across zero
        probabilities) and each row's last positive token; :meth:`with_cdf` fills them.
        Without them :meth:`sample` builds cumulative rows on the fly.
    """

    table: jax.Array | np.ndarray
    order: int = dataclasses.field(metadata=dict(static=True))
    cdf: jax.Array | np.ndarray | None = None  # see with_cdf: exact cumulative rows, for fast sampling
    last: jax.Array | np.ndarray | None = None  # last token of positive probability per row

    @property
    def vocab_size(self) -> int:
        return int(self.table.shape[-1])

    def probs(self, tokens):
        """Next-token distributions for every window of ``tokens`` (jnp; jit/vmap friendly)."""
        idx = window_index(tokens, self.order, self.vocab_size, jnp)
        return jnp.asarray(self.table)[idx]

    def prob_of(self, tokens, nxt):
        """``p(nxt[t] | window t)`` for each t < len(nxt), without building full rows."""
        idx = window_index(tokens, self.order, self.vocab_size, jnp)[..., : nxt.shape[-1]]
        return jnp.asarray(self.table)[idx, nxt]

    def row(self, tokens, t):
        """The distribution after window ``t`` (``t`` may be traced): ``probs(tokens)[t]``."""
        idx = window_index(tokens, self.order, self.vocab_size, jnp)
        return jnp.asarray(self.table)[idx[t]]

    def sample(self, tokens, u):
        """Draw the token that follows the last window of ``tokens``, from a uniform ``u``.

        Inverse CDF on the table's cumulative rows. Under ``vmap`` over lanes the table is
        not batched, so the cumulative table is computed once per batch, not per lane.
        """
        idx = window_index(tokens, self.order, self.vocab_size, jnp)[-1]
        if self.cdf is None:
            table = jnp.asarray(self.table)
            return inverse_cdf(jnp.cumsum(table, axis=-1)[idx], u, table[idx])
        return search_cdf(jnp.asarray(self.cdf)[idx], u, jnp.asarray(self.last)[idx])

    def with_cdf(self) -> "TableModel":
        """This model in float32 with exact cumulative rows, ready for the device."""
        t64 = np.asarray(self.table, dtype=np.float64)
        cdf = np.cumsum(t64, axis=-1)  # float64 and sequential: monotone, flat over zeros
        last = (t64.shape[-1] - 1 - np.argmax(t64[..., ::-1] > 0, axis=-1)).astype(np.int32)
        return TableModel(jnp.asarray(t64, jnp.float32), self.order, jnp.asarray(cdf, jnp.float32),
                          jnp.asarray(last))

    def probs_np(self, tokens) -> np.ndarray:
        """The same as :meth:`probs`, in numpy float64, for references and exact laws."""
        idx = window_index(np.asarray(tokens), self.order, self.vocab_size, np)
        return np.asarray(self.table, dtype=np.float64)[idx]


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
    t = u * cdf[..., -1]
    hit = (weights > 0) & (cdf > t[..., None])
    idx = jnp.argmax(hit, axis=-1)
    return jnp.where(jnp.any(hit, axis=-1), idx, last_positive(weights)).astype(jnp.int32)


def search_cdf(cdf, u, last):
    """Inverse-CDF draw on an exactly monotone cumulative row that is flat across zeros.

    The first index whose cumulative exceeds ``u * total`` then has positive weight;
    binary search above ``SEARCH_FROM`` tokens, compare-all (which vectorises) below.
    """
    t = u * cdf[..., -1]
    if cdf.shape[-1] <= SEARCH_FROM:
        idx = jnp.sum(cdf <= t[..., None], axis=-1)
    else:
        idx = jnp.searchsorted(cdf, t, side="right")
    return jnp.minimum(idx, last).astype(jnp.int32)


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
