"""Identity tests whose power speaks of the token law at any vocabulary size.

A chi-square test pools cells until each has a large enough expected count; its power calculation
(:mod:`stats.power`) then covers the *pooled* law. Mass moved among the tokens of one pooled cell
is invisible to it at any sample size, so at serving vocabularies (32k-256k tokens), where most
tokens are pooled, its minimum detectable TV says nothing of the token law. This module gives two
claims that do hold for the token law:

* :func:`pooled_token_min_tv`: the pooled test's own claim, made true for tokens. For any two laws
  ``TV_token <= TV_pooled + M`` where ``M`` is the target's mass in pooled cells of two or more
  tokens (within a cell, ``sum |q_i - p_i| <= |q_c - p_c| + 2 min(q_c, p_c)``). So a token-law
  deviation of TV at least ``eps_pooled + M`` moves the pooled law by at least ``eps_pooled``.
* :func:`tv_identity_test` and :func:`tv_min_detectable`: the plug-in total variation
  ``T = TV(empirical, p)`` against its exact null mean, with McDiarmid's bounded-difference
  inequality (one draw moves T by at most 1/n): ``P(T - E T >= t) <= exp(-2 n t^2)`` under any law.
  The p-value ``exp(-2 n (T - E_p T)_+^2)`` is valid at every n and V (conservative; no
  asymptotics), and the power against *every* law q at ``TV(q, p) >= eps`` is at least 1 - beta once
  ``eps >= E_p T + s_alpha + A + s_beta`` with ``s_x = sqrt(log(1/x) / (2n))`` and
  ``A = sup E TV(emp_q, q) <= (sum_i sqrt(p_i) + sqrt(V eps)) / (2 sqrt(n))``. It needs about
  ``V / eps^2`` draws against the ``sqrt(V) / eps^2`` of the optimal testers (Valiant and Valiant
  2017; Acharya, Daskalakis and Kamath 2015), but its guarantee is exact and its null law needs no
  simulation, which at V = 131,072 and Holm levels of 1e-5 matters.

:func:`token_min_tv` gives the better of the two claims for a law and a sample size.

References
----------
McDiarmid, C. (1989). On the method of bounded differences. Surveys in Combinatorics 141, 148-188.
De Moivre, A. (1730); Diaconis, P. and Zabell, S. (1991). Closed form summation for classical
distributions: variations on a theme of De Moivre. Statist. Sci. 6, 284-302 (the binomial mean
absolute deviation).
Valiant, G. and Valiant, P. (2017). An automatic inequality prover and instance optimal identity
testing. SIAM J. Comput. 46, 429-455.
Acharya, J., Daskalakis, C. and Kamath, G. (2015). Optimal testing for properties of
distributions. NeurIPS.

Examples
--------
>>> import numpy as np
>>> p = np.full(1000, 1e-3)
>>> r = tv_identity_test(np.random.default_rng(0).multinomial(200_000, p), p)
>>> r.pvalue > 0.01
True
>>> round(tv_min_detectable(p, 200_000, 0.01, 0.99), 3)
0.08
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.special import gammaln

from ._validate import as_probs, check_level
from .gof import pool_cells
from .power import min_detectable_tv


class TVIdentityResult(NamedTuple):
    """``statistic``: TV(empirical, p); ``pvalue``: McDiarmid's bound; ``null_mean``: E_p of the statistic."""

    statistic: float
    pvalue: float
    null_mean: float
    n: int


class TokenClaim(NamedTuple):
    """The smallest token-law TV detected with the stated power, and which test backs it."""

    tv: float
    test: str  # "pooled" (the chi-square, its pooled claim plus the merged mass) or "tv" (the plug-in TV test)
    merged_mass: float  # the target's mass in pooled cells of two or more tokens


def binomial_mad(n: int, p) -> np.ndarray:
    """``E |X - n p|`` for ``X ~ Binomial(n, p)``, exactly (De Moivre): ``2 m C(n, m) p^m (1 - p)^(n - m + 1)``
    with ``m = floor(n p) + 1``.

    >>> round(float(binomial_mad(2, 0.5)), 12)  # |0 - 1|, |1 - 1|, |2 - 1| with weights 1/4, 1/2, 1/4
    0.5
    """
    p = np.asarray(p, np.float64)
    out = np.zeros(p.shape)
    inner = (p > 0) & (p < 1)
    if n <= 0 or not inner.any():
        return out
    q = p[inner]
    m = np.floor(n * q) + 1
    ok = m <= n
    logv = (np.log(2 * m) + gammaln(n + 1) - gammaln(m + 1) - gammaln(n - m + 1) + m * np.log(q)
            + (n - m + 1) * np.log1p(-q))
    out[inner] = np.where(ok, np.exp(np.where(ok, logv, 0.0)), 0.0)
    return out


def tv_null_mean(probs, n: int) -> float:
    """``E TV(empirical, p)`` for n draws from p, exactly: half the sum of the binomial mean deviations over n."""
    p = as_probs(probs)
    return float(binomial_mad(int(n), p).sum() / (2.0 * n))


def tv_identity_test(counts, probs) -> TVIdentityResult:
    """Test that ``counts`` are a multinomial sample from ``probs`` by their total variation from it.

    Valid for any number of cells and any n (the p-value is McDiarmid's bound, conservative). Counts
    in cells of probability 0 add to the statistic too; the support check settles them exactly.
    """
    p = as_probs(probs)
    c = np.asarray(counts, np.float64)
    if c.shape != p.shape or np.any(c < 0):
        raise ValueError(f"counts must be {p.size} non-negative numbers, got shape {c.shape}")
    n = int(round(c.sum()))
    if n <= 0:
        return TVIdentityResult(0.0, 1.0, 0.0, 0)
    t = 0.5 * float(np.abs(c / n - p).sum())
    mu = tv_null_mean(p, n)
    return TVIdentityResult(t, float(np.exp(-2.0 * n * max(0.0, t - mu) ** 2)), mu, n)


def tv_min_detectable(probs, n: int, alpha: float = 0.01, power: float = 0.99) -> float:
    """The smallest TV(q, p) at which :func:`tv_identity_test` at level ``alpha`` rejects with probability
    at least ``power``, for *every* law q on the same cells (a proven bound, not an approximation).

    Solves ``eps = C + b sqrt(eps)`` with ``C = E_p T + s_alpha + s_beta + sum_i sqrt(p_i) / (2 sqrt n)``
    and ``b = sqrt(V / n) / 2``. May exceed 1: then no law is far enough for this n.
    """
    p = as_probs(probs)
    alpha = check_level(alpha)
    beta = 1.0 - check_level(power, "power")
    n = int(n)
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    s = lambda x: np.sqrt(np.log(1.0 / x) / (2.0 * n))  # noqa: E731
    c = tv_null_mean(p, n) + s(alpha) + s(beta) + np.sqrt(p).sum() / (2.0 * np.sqrt(n))
    b = np.sqrt(p.size / n) / 2.0
    root = (b + np.sqrt(b * b + 4.0 * c)) / 2.0
    return float(root * root)


def merged_mass(probs, n: int, min_expected: float) -> float:
    """The mass of ``probs`` in pooled cells of two or more tokens (:func:`stats.pool_cells`' plan)."""
    p = as_probs(probs)
    plan = pool_cells(p, n, min_expected)
    g = plan.groups[plan.groups >= 0]
    sizes = np.bincount(g, minlength=plan.n_groups)
    return float(plan.probs[sizes >= 2].sum())


def pooled_token_min_tv(probs, n: int, alpha: float, power: float, min_expected: float) -> tuple[float, float]:
    """The pooled chi-square's claim for the token law: ``(eps_pooled + merged mass, merged mass)``;
    NaN where the pooled law has fewer than two cells."""
    p = as_probs(probs)
    plan = pool_cells(p, n, min_expected)
    eps = min_detectable_tv(n, plan.n_groups - 1, alpha, power).tv
    m = merged_mass(p, n, min_expected)
    return float(eps + m), m


def token_min_tv(probs, n: int, alpha: float, power: float, min_expected: float, *, tv_test: bool) -> TokenClaim:
    """The smallest token-law TV a run of ``n`` draws detects with probability ``power`` at level ``alpha``:
    the pooled chi-square's claim (:func:`pooled_token_min_tv`), or, where ``tv_test`` (the run also
    makes :func:`tv_identity_test`), the better of it and that test's. NaN (with the test "none") when
    neither claim reaches below 1."""
    pooled, m = pooled_token_min_tv(probs, n, alpha, power, min_expected)
    best = TokenClaim(pooled, "pooled", m) if np.isfinite(pooled) and pooled < 1 else \
        TokenClaim(float("nan"), "none", m)
    if tv_test:
        tv = tv_min_detectable(probs, n, alpha, power)
        if tv < 1 and not (best.tv <= tv):
            best = TokenClaim(tv, "tv", m)
    return best
