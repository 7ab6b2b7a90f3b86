"""Negative controls: schemes that are *not* lossless and that the battery must reject.

Each control is the standard round (:func:`speculative_round`) with exactly one stage
replaced by a bug seen in real implementations, or a lossy rule from the literature.
They claim the standard scheme's acceptance theory, which is what the code they imitate
believes of itself. They are registered under the ``control:`` prefix, apart from real
schemes.

Public bug patterns (DESIGN section 7) and further ones that show in other places:

========================  =====================================================  ============
name                      bug                                                    visible on
========================  =====================================================  ============
softmax-residual          residual normalised with softmax(relu(p - q))          any pair
resample-from-p           on rejection, resample from p instead of the residual  any pair
accept-all                uniform stuck at 0: every draft with p(x) > 0 passes   any pair
epsilon-residual          residual clamped at eps = 1e-3 instead of 0            any pair
bonus-from-q              the bonus token is drawn from q instead of p           any pair
shared-uniform            one uniform reused for every acceptance test           any pair
reused-uniform            the residual is sampled with the rejecting uniform     any pair
draft-temperature         drafts sampled at temperature 0.7, ratio uses raw q    any pair
off-by-one                draft i is scored with target row i + 1                n-gram only
le-acceptance             accept with u <= p / q (u = 0 passes p(x) = 0)         boundary pass
no-residual-fallback      residual without its fallback for an all-zero row      edge-row pass
lenient                   accept with min(1, p / (l q)), l = 2 (lossy rule)      any pair
typical                   Medusa typical acceptance (Cai et al. 2024), lossy     any pair
========================  =====================================================  ============
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import jax.numpy as jnp

import stats

from . import lossy
from .base import Scheme, UniformStep, draft_tokens, sample_weights
from .standard import Verification, residual_at, speculative_round, split_uniforms, standard_law

EPSILON = 1e-3
DRAFT_TEMPERATURE = 0.7
LENIENCY = 2.0
TYPICAL_EPSILON, TYPICAL_DELTA = 0.09, 0.3  # Medusa's posterior threshold and alpha


def typical_threshold(p_row):
    """Medusa's typical acceptance threshold min(eps, delta * exp(-H(p))) at the control's constants (numpy or
    jnp): :func:`specsample.schemes.lossy.typical_threshold`'s."""
    return lossy.typical_threshold(p_row, TYPICAL_EPSILON, TYPICAL_DELTA)


def _last_weights(v: Verification, j, rejected_weights):
    # a rejection (j < k) draws from ``rejected_weights``; the bonus (j = k) from p's row k
    return jnp.where(j < v.k, rejected_weights, v.p_row(j))


def _final_softmax(v: Verification, j):
    r = jnp.maximum(v.p_row(j) - v.q_row(j), 0.0)
    return sample_weights(_last_weights(v, j, jnp.exp(r) / jnp.sum(jnp.exp(r))), v.u_final)


def _final_from_p(v: Verification, j):
    return sample_weights(v.p_row(j), v.u_final)


def _final_epsilon(v: Verification, j):
    return sample_weights(_last_weights(v, j, jnp.maximum(v.p_row(j) - v.q_row(j), EPSILON)), v.u_final)


def _final_no_fallback(v: Verification, j):
    # max(0, p - q) straight from the float32 rows, without the fallback for a row that vanishes
    # (q = p but for a 1e-8 mass on a token p forbids: the draft of that token must be rejected)
    return sample_weights(_last_weights(v, j, jnp.maximum(v.p_row(j) - v.q_row(j), 0.0)), v.u_final)


def _final_bonus_from_q(v: Verification, j):
    return sample_weights(jnp.where(j < v.k, residual_at(v, j), v.q_row(v.k)), v.u_final)


def _final_reused_uniform(v: Verification, j):
    u = jnp.concatenate([v.u_accept, v.u_final[None]])[j]  # the uniform that just failed
    return v.last_token(j, u)


def _accept_all(v: Verification):
    return v.p_draft() > 0  # u = 0 < p / q whenever p(x) > 0


def _accept_le(v: Verification):
    return v.u_accept * v.q_draft() <= v.p_draft()  # `<=`: at u = 0 a draft with p(x) = 0 passes


def _accept_lenient(v: Verification):
    return v.u_accept * LENIENCY * v.q_draft() < v.p_draft()


def _accept_off_by_one(v: Verification):
    p_next = v.target.prob_of(v.windows(v.target, v.k, shift=1), v.drafts)  # rows 1..k
    return v.u_accept * v.q_draft() < p_next


def _accept_typical(v: Verification):
    thr = jnp.stack([typical_threshold(v.p_row(i)) for i in range(v.k)])
    return v.p_draft() > thr


def _shared_uniforms(u, k):
    u_draft, u_accept, u_final = split_uniforms(u, k)
    return u_draft, jnp.broadcast_to(u_accept[0], u_accept.shape), u_final


def _drafting_hot(u, draft, context, k):
    # drafts come from q ** (1 / T), but the ratio test is told q itself
    def sample(tokens, ui):
        return sample_weights(draft.probs(tokens)[-1] ** (1.0 / DRAFT_TEMPERATURE), ui)

    return draft_tokens(u, SimpleNamespace(order=draft.order, sample=sample), context, k)


_CONTROLS = {
    "softmax-residual": (dict(final=_final_softmax), "residual normalised with softmax(relu(p - q))"),
    "resample-from-p": (dict(final=_final_from_p), "on rejection, resample from p instead of the residual"),
    "accept-all": (dict(accept=_accept_all), "uniform stuck at 0: every draft with p(x) > 0 accepted"),
    "epsilon-residual": (dict(final=_final_epsilon), f"residual clamped at {EPSILON:g} instead of 0"),
    "bonus-from-q": (dict(final=_final_bonus_from_q), "bonus token drawn from q instead of p"),
    "no-residual-fallback": (dict(final=_final_no_fallback), "residual max(0, p - q) without the fallback for a row "
                             "that vanishes in float32 (edge-row pass only)"),
    "shared-uniform": (dict(uniforms=_shared_uniforms), "one uniform reused for all k acceptance tests"),
    "reused-uniform": (dict(final=_final_reused_uniform), "residual sampled with the rejecting uniform"),
    "draft-temperature": (dict(drafting=_drafting_hot),
                          f"drafts sampled at temperature {DRAFT_TEMPERATURE}, ratio uses untempered q"),
    "off-by-one": (dict(accept=_accept_off_by_one), "draft i scored with target row i + 1 (n-gram only)"),
    "le-acceptance": (dict(accept=_accept_le), "accept with u <= p / q: at u = 0 a token with p = 0 passes "
                      "(boundary pass only)"),
    "lenient": (dict(accept=_accept_lenient), f"lossy rule: accept with min(1, p / ({LENIENCY:g} q))"),
    "typical": (dict(accept=_accept_typical, final=_final_from_p),
                "lossy rule: Medusa typical acceptance p(x) > min(0.09, 0.3 exp(-H(p))), else sample p"),
}
CONTROL_NAMES = tuple(_CONTROLS)


def _factory(name: str):
    hooks, description = _CONTROLS[name]

    def make(k: int = 4) -> Scheme:
        k = int(k)
        return Scheme(
            name=f"control:{name}",
            k=k,
            max_tokens=k + 1,
            step=UniformStep(functools.partial(speculative_round, k=k, **hooks), 2 * k + 1),
            accepted_law=standard_law(k),
            token_acceptance=stats.per_token_acceptance,
            lossless=False,
            description=description,
            rule="standard",  # what the code it imitates claims of itself
        )

    make.__name__ = name.replace("-", "_")
    make.__doc__ = f"Negative control: {description}."
    return make


CONTROLS = {f"control:{name}": _factory(name) for name in _CONTROLS}
