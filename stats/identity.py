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

:func:`token_chi2_test` and :func:`token_chi2_min_detectable`: the collision form of Pearson's
  statistic over every token with at least one expected draw (the rest in one cell), whose power needs
  about ``sqrt(V) / eps^2`` draws: at V = 32,768 and 2^20 draws it claims TV 0.021 where the plug-in
  TV test claims 0.18 (level 1e-5, power 0.99). Its null law is asymptotic (a three-moment gamma, its
  size checked by simulation) and its claim is the normal approximation at the least favourable law
  (checked against deviations of exactly that TV).

:func:`token_min_tv` gives the best of the claims for a law and a sample size.

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
from scipy.special import gammainccinv, gammaincc, gammaln, ndtr, ndtri  # not scipy.stats: 0.4 s to import

from ._validate import as_probs, check_level
from .gof import pool_cells
from .power import min_detectable_tv


class TVIdentityResult(NamedTuple):
    """``statistic``: TV(empirical, p); ``pvalue``: McDiarmid's bound; ``null_mean``: E_p of the statistic."""

    statistic: float
    pvalue: float
    null_mean: float
    n: int


class TokenChi2Result(NamedTuple):
    """``statistic``: the centred collision statistic Z; ``pvalue``: its upper tail under p (three-moment
    gamma); ``cells``: tokens tested alone plus the rest cell; ``rest_mass``: p's mass in cells of two
    or more tokens (what the test cannot see inside); ``null_mean``, ``null_sd``: Z's exact null moments."""

    statistic: float
    pvalue: float
    cells: int
    rest_mass: float
    null_mean: float
    null_sd: float
    n: int


class TokenClaim(NamedTuple):
    """The smallest token-law TV detected with the stated power, and which test backs it."""

    tv: float
    test: str  # "pooled" (the pooled chi-square's claim plus the merged mass), "tv" (the plug-in TV test) or
    #            "chi2" (the token chi-square, token_chi2_test)
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


TOKEN_MIN_EXPECTED = 1.0  # a token with fewer expected draws joins the rest cell (its outliers make the tail heavy)


def _token_cells(p: np.ndarray, n: int, min_expected: float) -> tuple[np.ndarray, np.ndarray, float]:
    """The token chi-square's cells: (index of each token's cell or -1 for p = 0, cell probabilities, the
    mass in cells of two or more tokens). Tokens with ``n p >= min_expected`` are cells alone; the rest
    (0 < n p < min_expected) share one cell, joined by the smallest lone token while its expected
    count is short. Fixed by p and n alone, before the counts are read."""
    live = p > 0
    alone = live & (n * p >= min_expected)
    rest = live & ~alone
    if rest.any() and n * p[rest].sum() < min_expected and alone.any():
        smallest = np.flatnonzero(alone)[np.argmin(p[alone])]
        alone[smallest], rest[smallest] = False, True
    cell = np.full(p.size, -1, np.int64)
    cell[alone] = np.arange(int(alone.sum()))
    probs = p[alone]
    if rest.any():
        cell[rest] = probs.size
        probs = np.append(probs, p[rest].sum())
    return cell, probs, float(p[rest].sum()) if rest.sum() >= 2 else 0.0


def _token_null(probs: np.ndarray, n: int) -> tuple[float, float, float]:
    """Z's null mean and variance (exact for the multinomial) and third cumulant (Poissonised cells)."""
    m = probs.size
    lam = n * probs
    return -1.0, 2.0 * (m - 1) * (n - 1) / n, float(np.sum(8.0 + 4.0 / lam))


def _gamma_tail(x, mean: float, var: float, k3: float, upper: bool = True):
    """P(X > x) (or the quantile at upper-tail level x when ``upper`` is False) for the shifted gamma with
    the given mean, variance and third cumulant (Pearson type III); the normal when the skew vanishes."""
    sd = np.sqrt(var)
    skew = k3 / sd**3
    if skew < 1e-6:
        return ndtr(-(x - mean) / sd) if upper else mean - sd * ndtri(x)
    shape, scale = 4.0 / skew**2, sd * skew / 2.0
    loc = mean - shape * scale
    if upper:
        return gammaincc(shape, max(0.0, (x - loc) / scale))
    return loc + scale * gammainccinv(shape, x)


def token_chi2_test(counts, probs, min_expected: float = TOKEN_MIN_EXPECTED) -> TokenChi2Result:
    """Test that ``counts`` are a multinomial sample from ``probs`` with a chi-square statistic that sees
    every token with at least ``min_expected`` expected draws, whatever the vocabulary.

    The statistic is the collision form of Pearson's (Acharya, Daskalakis and Kamath 2015; Valiant and
    Valiant 2017): over cells j of probability pi_j and expected count lambda_j = n pi_j,

        Z = sum_j ((N_j - lambda_j)^2 - N_j) / lambda_j = sum_j N_j (N_j - 1) / lambda_j - n.

    Subtracting N_j removes the 1 / lambda_j terms that make Pearson's statistic noisy in sparse cells:
    under p, E Z = -1 and Var Z = 2 (m - 1)(n - 1) / n exactly (m cells), and under a law q of the cells
    E Z = (n - 1) chi2(q || p) - 1, so its power needs about sqrt(m) / eps^2 draws, not the m / eps^2 of
    a plug-in TV test. Tokens below ``min_expected`` share one rest cell (a token seen twice where it
    expects 0.001 draws would add 2,000 to Z alone).

    The p-value is the upper tail of the shifted gamma matching Z's null mean, variance and third cumulant
    (sum_j 8 + 4 / lambda_j, Poissonised): asymptotic in the number of cells (valid as m grows with every
    cell at ``min_expected`` or more; ``tests/test_stats_identity.py`` checks its size by simulation at
    V = 32,768 down to level 1e-4). Counts at tokens of probability 0 are left out; the support check
    settles them exactly.

    References
    ----------
    Acharya, J., Daskalakis, C. and Kamath, G. (2015). Optimal testing for properties of distributions.
    NeurIPS. Valiant, G. and Valiant, P. (2017). SIAM J. Comput. 46, 429-455.

    Examples
    --------
    >>> p = np.full(4096, 1 / 4096)
    >>> r = token_chi2_test(np.random.default_rng(0).multinomial(100_000, p), p)
    >>> r.pvalue > 0.01, r.cells
    (True, 4096)
    """
    p = as_probs(probs)
    c = np.asarray(counts, np.float64)
    if c.shape != p.shape or np.any(c < 0):
        raise ValueError(f"counts must be {p.size} non-negative numbers, got shape {c.shape}")
    live = p > 0
    n = int(round(c[live].sum()))
    if n <= 1:
        return TokenChi2Result(0.0, 1.0, 0, 0.0, -1.0, 0.0, n)
    cell, cp, rest = _token_cells(p, n, min_expected)
    if cp.size < 2:
        return TokenChi2Result(0.0, 1.0, int(cp.size), rest, -1.0, 0.0, n)
    obs = np.bincount(cell[live], weights=c[live], minlength=cp.size)
    z = float(np.sum(obs * (obs - 1.0) / (n * cp)) - n)
    mean, var, k3 = _token_null(cp, n)
    return TokenChi2Result(z, float(min(1.0, _gamma_tail(z, mean, var, k3))), int(cp.size), rest, mean,
                           float(np.sqrt(var)), n)


def token_chi2_min_detectable(probs, n: int, alpha: float = 0.01, power: float = 0.99,
                              min_expected: float = TOKEN_MIN_EXPECTED) -> float:
    """The smallest token-law TV at which :func:`token_chi2_test` at level ``alpha`` rejects with
    probability ``power``: ``eps_cells + M``, with M the mass in the rest cell (``TV_token <= TV_cells +
    M``, as for pooled cells) and eps_cells the cell-law TV at which the least favourable law is caught.

    For a cell-law TV eps, chi2(q || p) >= 4 eps^2 (Cauchy-Schwarz), with equality only at q = p (1 +
    2 eps s), s = +-1 splitting p's mass in halves: that law moves Z's mean least. Its variance is bounded
    in closed form (exactly, up to ``sum_j (1 + 2 eps s_j)^2 <= m (1 + 2 eps)^2``); the claim asks that
    the mean shift reach the critical value plus z_power of those standard deviations (the normal
    approximation under the alternative). ``tests/test_token_law_power.py`` checks it against
    deviations of exactly the claimed TV in several shapes. Inf when no eps below 1/2 suffices.
    """
    p = as_probs(probs)
    alpha = check_level(alpha)
    z_power = -ndtri(1.0 - check_level(power, "power"))
    n = int(n)
    if n <= 1:
        raise ValueError(f"n must be at least 2, got {n}")
    _, cp, rest = _token_cells(p, n, min_expected)
    if cp.size < 2:
        return float("inf")
    m = cp.size
    mean, var, k3 = _token_null(cp, n)
    crit = _gamma_tail(alpha, mean, var, k3, upper=False)
    f2, f3, f4 = n * (n - 1.0), n * (n - 1.0) * (n - 2.0), n * (n - 1.0) * (n - 2.0) * (n - 3.0)

    def short(eps):  # > 0 while the least favourable law at eps is caught less often than `power`
        a = 1.0 + 4.0 * eps * eps
        v = (f4 - f2 * f2) * a * a / n**2 + 4.0 * f3 * (1.0 + 12.0 * eps * eps) / n**2 \
            + 2.0 * f2 * m * (1.0 + 2.0 * eps) ** 2 / n**2
        return crit + z_power * np.sqrt(max(v, 0.0)) - ((n - 1.0) * 4.0 * eps * eps - 1.0)

    lo, hi = 0.0, 0.5
    if short(hi) > 0:
        return float("inf")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if short(mid) > 0 else (lo, mid)
    return float(hi + rest)


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


def token_min_tv(probs, n: int, alpha: float, power: float, min_expected: float, *, tv_test: bool = False,
                 token_test: bool = False) -> TokenClaim:
    """The smallest token-law TV a run of ``n`` draws detects with probability ``power`` at level ``alpha``:
    the pooled chi-square's claim (:func:`pooled_token_min_tv`), or the best of it and the claims of the
    other tests the run makes of the same law: the plug-in TV test (``tv_test``,
    :func:`tv_min_detectable`) and the token chi-square (``token_test``, :func:`token_chi2_min_detectable`).
    NaN (with the test "none") when no claim reaches below 1."""
    pooled, m = pooled_token_min_tv(probs, n, alpha, power, min_expected)
    best = TokenClaim(pooled, "pooled", m) if np.isfinite(pooled) and pooled < 1 else \
        TokenClaim(float("nan"), "none", m)
    others = []
    if tv_test:
        others.append((tv_min_detectable(probs, n, alpha, power), "tv"))
    if token_test and n > 1:
        others.append((token_chi2_min_detectable(probs, n, alpha, power), "chi2"))
    for tv, name in others:
        if tv < 1 and not (best.tv <= tv):
            best = TokenClaim(tv, name, m)
    return best
