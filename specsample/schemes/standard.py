"""Standard speculative sampling (token-level verification).

Rule (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2): draft
x_1..x_k autoregressively from q; evaluate p at all k + 1 positions in one pass; accept
x_i while ``u_i < p_i(x_i) / q_i(x_i)`` (strict: u can be 0 in float32, and p(x) = 0
must never be accepted); at the first rejection i emit a token from the residual
``norm(max(0, p_i - q_i))``; if all k are accepted emit a bonus token from p_{k+1}.

The output stream is distributed exactly as sampling from p. On a context-free pair each
draft is accepted with probability ``alpha = sum_x min(p(x), q(x))``, independently, so
the accepted count per round is a geometric law truncated at k
(:func:`stats.accepted_drafts_law`) and a drafted token x is accepted with probability
``min(1, p(x) / q(x))``.

References
----------
Leviathan, Y., Kalman, M. and Matias, Y. (2023). Fast inference from transformers via
speculative decoding. ICML. arXiv:2211.17192.
Chen, C., Borgeaud, S., Irving, G., Lespiau, J.-B., Sifre, L. and Jumper, J. (2023).
Accelerating large language model decoding with speculative sampling. arXiv:2302.01318.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

import stats

from ..models.tables import read_by_selects, take, window_index
from .base import Scheme, UniformStep, draft_tokens, emit, leading_true, residual, sample_weights


def split_uniforms(u, k: int):
    """The 2k + 1 uniforms of a round, split: drafting, acceptance, final token."""
    return u[:k], u[k : 2 * k], u[2 * k]


class Verification(NamedTuple):
    """A round after drafting: what the target's parallel pass can tell about the drafts.

    Accessors compute only what a rule asks for: the probabilities of the drafted tokens
    (k scalars from each model) and single rows for the residual or bonus token. Row i of
    either model is the distribution after the context and x_1..x_i; row k is the bonus.
    """

    target: object
    draft: object
    context: jax.Array
    drafts: jax.Array
    u_accept: jax.Array
    u_final: jax.Array

    @property
    def k(self) -> int:
        return self.drafts.shape[0]

    def windows(self, model, rows: int, shift: int = 0) -> jax.Array:
        """Tokens whose windows give ``rows`` rows of ``model`` starting at row ``shift``."""
        return self._windows(model.order, rows, shift)

    def _windows(self, order: int, rows: int, shift: int = 0) -> jax.Array:
        w = self.context.shape[-1]
        full = jnp.concatenate([self.context, self.drafts])
        return full[w - order + shift : w + rows - 1 + shift]

    @property
    def paired(self) -> bool:
        """Whether the two models are the pair :func:`specsample.models.pair_for_device` prepared (its
        tables of residuals and acceptance thresholds are then the rule's own)."""
        t, d = self.target, self.draft
        return getattr(t, "paired", False) and getattr(d, "paired", False) and t.residuals is not None

    def last_token(self, j, u) -> jax.Array:
        """The round's last token with uniform ``u``: from the residual at a rejection j < k,
        from p's row k (the bonus) when all k drafts were accepted (j = k).

        When the engine paired the two models (:func:`specsample.models.pair_for_device`) it is one
        O(1) alias lookup in a precomputed table holding every window's residual and then the
        target's own rows; otherwise the residual is built from the two rows and sampled by inverse
        CDF. Both give the same law.
        """
        t = self.target
        if self.paired:
            res = t.residuals
            vocab = t.vocab_size
            rows = window_index(self._windows(res.order, self.k), res.order, vocab, jnp)
            bonus = vocab**res.order + window_index(self.windows(t, 1, shift=self.k), t.order, vocab, jnp)[0]
            return t.sample_residual(jnp.where(j < self.k, rows[jnp.minimum(j, self.k - 1)], bonus), u)
        return sample_weights(residual_at(self, j), u)

    def thresholds(self) -> jax.Array:
        """For each draft, the uniform below which the rule accepts it (a paired pair only): ``u < t``
        exactly when ``u q(x) < p(x)`` (:func:`specsample.models.tables.acceptance_thresholds`). One table
        read per draft, as :meth:`p_draft` reads p's (position by position; one chain where it is selects)."""
        t = self.target
        res = t.residuals
        table, m, vocab = res.thresholds, res.order, t.vocab_size
        if m == 0:
            row = t._row(jnp.zeros((), jnp.int32), 1)
            if read_by_selects(table):
                return take(table, row, self.drafts)
            return jnp.stack([take(table, row, self.drafts[i]) for i in range(self.k)])
        return jnp.stack([take(table, t._row(window_index(window, m, vocab, jnp)[0], vocab**m), self.drafts[i])
                          for i, window in enumerate(self._draft_windows(m))])

    def _draft_windows(self, m: int) -> list:
        """The m tokens before each draft, as static picks of the context and the drafts (one [m] array a
        draft): from one concatenated token array, XLA on CPU laid the batch of lanes out lane-major and ran
        the lookups unvectorised (an order-1 pair at k = 8 ran at 0.6 x)."""
        w = self.context.shape[-1]

        def token(t):
            return self.context[t] if t < w else self.drafts[t - w]

        return [jnp.stack([token(w - m + i + j) for j in range(m)]) for i in range(self.k)]

    def p_draft(self) -> jax.Array:
        """p_i(x_i) for i = 1..k (the target's probability of each drafted token)."""
        return self._draft_probs(self.target)

    def q_draft(self) -> jax.Array:
        """q_i(x_i) for i = 1..k."""
        return self._draft_probs(self.draft)

    def _draft_probs(self, model) -> jax.Array:
        """``model``'s probability of each draft. With context, window by window (:meth:`_draft_windows`).
        A context-free model's lookups are one gather per position too, but one chain for all k when
        its table is read by selects (``take``; at V = 8, k = 8 position by position ran at 0.9 x)."""
        m = model.order
        if m == 0:
            table = getattr(model, "table", None)  # optional: a model without one (a user's wrapper) gathers
            if table is not None and read_by_selects(table):
                return model.prob_of(self.windows(model, self.k), self.drafts)
            # one gather of all k under the engine's vmap over lanes took a lane-major copy of its index, read
            # element by element; k gathers of a lane vector each vectorise (V = 64, k = 4: 1.28-1.46 x)
            return jnp.stack([model.prob_of(self.windows(model, 1), self.drafts[i : i + 1])[0] for i in range(self.k)])
        return jnp.stack([model.prob_of(window, self.drafts[i : i + 1])[0]
                          for i, window in enumerate(self._draft_windows(m))])

    def p_row(self, i) -> jax.Array:
        """p's distribution at position i (0..k; may be traced)."""
        return self.target.row(self.windows(self.target, self.k + 1), i)

    def q_row(self, i) -> jax.Array:
        """q's distribution at position i (0..k; may be traced)."""
        return self.draft.row(self.windows(self.draft, self.k + 1), i)


def accept_ratio(v: Verification) -> jax.Array:
    """``u < p(x) / q(x)`` written as ``u * q(x) < p(x)``: no division, strict, and false at p(x) = 0.
    On a paired pair the same test to the bit, read as a threshold on u (:meth:`Verification.thresholds`)."""
    if v.paired:
        return v.u_accept < v.thresholds()
    return v.u_accept * v.q_draft() < v.p_draft()


def residual_at(v: Verification, j) -> jax.Array:
    """Weights of the last token: the residual at a rejection j < k, p's row k when j = k."""
    q = jnp.where(j < v.k, v.q_row(j), 0.0)  # row k: max(p - 0, 0) = p, the bonus token
    return residual(v.p_row(j), q)


def final_token(v: Verification, j) -> jax.Array:
    """Residual at the first rejection j < k, or the bonus token from p's row k."""
    return v.last_token(j, v.u_final)


def speculative_round(u, target, draft, context, *, k: int, uniforms=split_uniforms,
                      drafting=draft_tokens, accept=accept_ratio, final=final_token):
    """One round of draft-then-verify from its 2k + 1 uniforms ``u``; each stage is a replaceable function.

    The defaults are the correct rule. Negative controls (``specsample.schemes.controls``)
    swap exactly one stage for a known bug, so every control differs from this in one place.
    """
    u_draft, u_accept, u_final = uniforms(u, k)
    drafts = drafting(u_draft, draft, context, k)
    v = Verification(target, draft, context, drafts, u_accept, u_final)
    anchor = getattr(target, "table", None)  # the table: one trip count for all lanes
    j = leading_true(accept(v), anchor)
    return emit(drafts, j, final(v, j), anchor=anchor)


def standard_law(k: int):
    """Theory for context-free pairs: accepted drafts per round ~ truncated geometric."""
    return lambda p, q: stats.accepted_drafts_law(stats.acceptance_probability(p, q), k)


def standard(k: int = 4) -> Scheme:
    """Standard speculative sampling with draft length ``k``."""
    k = int(k)
    return Scheme(
        name="standard",
        k=k,
        max_tokens=k + 1,
        step=UniformStep(functools.partial(speculative_round, k=k), 2 * k + 1),
        accepted_law=standard_law(k),
        token_acceptance=stats.per_token_acceptance,
        description="token-level speculative sampling (Leviathan et al. 2023; Chen et al. 2023)",
        rule="standard",
    )
