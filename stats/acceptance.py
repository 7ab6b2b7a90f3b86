"""Acceptance theory of standard speculative sampling on context-free pairs.

With target p and draft q, a drafted token x ~ q is accepted with probability
``min(1, p(x) / q(x))``, so a draft is accepted with probability
``alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q)``, independently across the k drafts of a
round. The number of accepted drafts J is a truncated geometric law and a round emits
J + 1 tokens.

References
----------
Leviathan, Y., Kalman, M. and Matias, Y. (2023). Fast inference from transformers via
speculative decoding. ICML. (Section 3 and Theorem 3.8; arXiv:2211.17192, 2022.)
Chen, C. et al. (2023). Accelerating large language model decoding with speculative
sampling. arXiv:2302.01318.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats as sps

from ._validate import as_counts, as_probs, same_shape
from .gof import GofResult, goodness_of_fit


class AcceptanceTestResult(NamedTuple):
    """Result of :func:`per_token_acceptance_test`."""

    statistic: float
    pvalue: float
    dof: int
    violations: np.ndarray  # tokens whose acceptance must be 0 or 1 but was not


def _check_k(k) -> int:
    if int(k) != k or k < 1:
        raise ValueError(f"k (draft length) must be an integer >= 1, got {k}")
    return int(k)


def _check_alpha(alpha) -> float:
    alpha = float(alpha)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"acceptance probability must lie in [0, 1], got {alpha}")
    return alpha


def acceptance_probability(p, q) -> float:
    """``alpha = sum min(p, q) = 1 - TV(p, q)``: the chance a single draft is accepted.

    Examples
    --------
    >>> acceptance_probability([0.5, 0.5], [0.8, 0.2])
    0.7
    """
    a, b = as_probs(p, "p"), as_probs(q, "q")
    same_shape(a, b, ("p", "q"))
    alpha = np.clip(np.minimum(a, b).sum(axis=-1), 0.0, 1.0)  # rounding can give 1 + 2e-16
    return float(alpha) if a.ndim == 1 else alpha


def accepted_drafts_law(alpha: float, k: int) -> np.ndarray:
    """Law of the number J of accepted drafts in a round.

    ``P(J = j) = alpha**j (1 - alpha)`` for j < k and ``P(J = k) = alpha**k``.

    Examples
    --------
    >>> accepted_drafts_law(0.5, 2)
    array([0.5 , 0.25, 0.25])
    """
    alpha, k = _check_alpha(alpha), _check_k(k)
    j = np.arange(k + 1)
    law = alpha**j * (1.0 - alpha)
    law[k] = alpha**k
    return law


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """``E[J + 1] = (1 - alpha**(k+1)) / (1 - alpha)`` (k + 1 when alpha = 1).

    Examples
    --------
    >>> expected_tokens_per_round(0.5, 2)
    1.75
    """
    alpha, k = _check_alpha(alpha), _check_k(k)
    if alpha == 1.0:
        return float(k + 1)
    return float((1.0 - alpha ** (k + 1)) / (1.0 - alpha))


def walltime_improvement(alpha: float, k: int, c: float) -> float:
    """Expected speed-up over plain decoding, ``(1 - alpha**(k+1)) / ((1 - alpha)(k c + 1))``.

    ``c`` is the cost of one draft step relative to one target step (Leviathan et al.
    2023, Theorem 3.8).
    """
    if c < 0:
        raise ValueError(f"cost ratio c must be >= 0, got {c}")
    return expected_tokens_per_round(alpha, k) / (k * c + 1.0)


def optimal_draft_length(alpha: float, c: float, k_max: int = 64) -> int:
    """The k in 1..k_max that maximises :func:`walltime_improvement`."""
    ks = np.arange(1, _check_k(k_max) + 1)
    return int(ks[np.argmax([walltime_improvement(alpha, int(k), c) for k in ks])])


def per_token_acceptance(p, q) -> np.ndarray:
    """``min(1, p(x) / q(x))`` per token; NaN where q(x) = 0 (never drafted)."""
    a, b = as_probs(p, "p"), as_probs(q, "q")
    same_shape(a, b, ("p", "q"))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b > 0, np.minimum(1.0, a / np.where(b > 0, b, 1.0)), np.nan)


def accepted_drafts_test(counts, law, **kwargs) -> GofResult:
    """Goodness of fit of a histogram of accepted drafts per round to ``law``.

    ``law`` is :func:`accepted_drafts_law` for the standard scheme, or any scheme's own
    theory. Keyword arguments go to :func:`stats.gof.goodness_of_fit`.
    """
    return goodness_of_fit(counts, law, **kwargs)


def per_token_acceptance_test(drafted, accepted, rates, *, min_expected: float = 5.0) -> AcceptanceTestResult:
    """Test observed per-token acceptance against theoretical rates.

    For each token x drafted n_x times, the accepted count is Binomial(n_x, r_x) given
    n_x (each drafted token is accepted independently with probability r_x). Tokens
    with ``n r >= min_expected`` and ``n (1 - r) >= min_expected`` contribute
    ``(a - n r)**2 / (n r (1 - r))`` to a chi-square statistic with one degree of
    freedom each. Tokens with r = 1 must always be accepted and tokens with r = 0 never:
    any exception is a hard violation (p-value 0).

    Parameters
    ----------
    drafted, accepted : array_like of int, shape (V,)
        Times each token was drafted (and its acceptance tested), and accepted.
    rates : array_like, shape (V,)
        Theoretical acceptance probabilities (NaN allowed where nothing is drafted).
    """
    n = as_counts(drafted, "drafted").ravel()
    a = as_counts(accepted, "accepted").ravel()
    r = np.asarray(rates, dtype=np.float64).ravel()
    if not (n.shape == a.shape == r.shape):
        raise ValueError(f"drafted, accepted and rates must have one shape, got {n.shape}, {a.shape}, {r.shape}")
    if np.any(a > n):
        raise ValueError("accepted exceeds drafted for some token")
    drafted_tok = n > 0
    if np.any(drafted_tok & np.isnan(r)):
        bad = np.flatnonzero(drafted_tok & np.isnan(r))
        return AcceptanceTestResult(float("inf"), 0.0, 0, bad)
    r = np.where(np.isnan(r), 0.0, r)
    viol = drafted_tok & (((r >= 1.0) & (a != n)) | ((r <= 0.0) & (a != 0)))
    if viol.any():
        return AcceptanceTestResult(float("inf"), 0.0, 0, np.flatnonzero(viol))
    use = (n * r >= min_expected) & (n * (1 - r) >= min_expected)
    if not use.any():
        return AcceptanceTestResult(0.0, 1.0, 0, np.array([], dtype=np.int64))
    nu, au, ru = n[use], a[use], r[use]
    stat = float(np.sum((au - nu * ru) ** 2 / (nu * ru * (1 - ru))))
    dof = int(use.sum())
    return AcceptanceTestResult(stat, float(sps.chi2.sf(stat, dof)), dof, np.array([], dtype=np.int64))


class ZTestResult(NamedTuple):
    statistic: float  # z
    pvalue: float  # two-sided
    observed: float
    expected: float


def bernoulli_sum_test(successes, trials, probs) -> ZTestResult:
    """Total successes of independent groups of Bernoulli trials against their probabilities.

    Group i has ``trials[i]`` trials of success probability ``probs[i]`` (a round start's chance
    that its first draft is accepted, say), independent under the null. Their total is Poisson
    binomial, with mean ``sum n p`` and variance ``sum n p (1 - p)``; the two-sided normal test
    of the total is valid once the variance is large (tens or more). Pooling many small groups
    this way keeps power where no group alone has enough trials for its own test.

    Examples
    --------
    >>> r = bernoulli_sum_test([30, 55], [100, 100], [0.3, 0.5])
    >>> round(r.statistic, 2)
    0.74
    """
    s = as_counts(successes, "successes").ravel()
    n = as_counts(trials, "trials").ravel()
    p = np.asarray(probs, np.float64).ravel()
    if not (s.shape == n.shape == p.shape):
        raise ValueError(f"successes, trials and probs must have one shape, got {s.shape}, {n.shape}, {p.shape}")
    if np.any(s > n) or np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("need successes <= trials and probabilities in [0, 1]")
    observed, expected = float(s.sum()), float((n * p).sum())
    var = float((n * p * (1 - p)).sum())
    if var > 0:
        z = (observed - expected) / np.sqrt(var)
    else:  # every trial certain: any difference is impossible under the null
        z = 0.0 if observed == expected else float(np.copysign(np.inf, observed - expected))
    return ZTestResult(float(z), float(2 * sps.norm.sf(abs(z))), observed, expected)
