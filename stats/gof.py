"""Goodness of fit of observed counts to a known distribution.

Everything here takes plain count arrays and probability tables, so it applies to
counts from any sampler (JAX, torch, C++).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import special

from ._validate import as_counts, as_probs, same_shape

MIN_EXPECTED = 5.0
_LAMBDAS = {"pearson": 1.0, "g": 0.0}
MAX_MC_SAMPLES = 10_000_000  # the most simulations ``min_pvalue`` may ask for (a floor of 1e-7)
_MC_CHUNK = 1 << 22  # table cells simulated at a time: memory stays bounded, the draws are one call's


class PoolingPlan(NamedTuple):
    """How cells are merged before a chi-square test.

    Attributes
    ----------
    groups : ndarray of int
        Group index of every cell, ``-1`` for cells of probability zero.
    probs : ndarray of float
        Probability of each group.
    """

    groups: np.ndarray
    probs: np.ndarray

    @property
    def n_groups(self) -> int:
        return int(self.probs.size)

    def apply(self, counts: np.ndarray) -> np.ndarray:
        """Sum ``counts`` (last axis = cells) into the groups of this plan."""
        counts = np.asarray(counts)
        keep = self.groups >= 0
        out = np.zeros(counts.shape[:-1] + (self.n_groups,), dtype=counts.dtype)
        np.add.at(out, (..., self.groups[keep]), counts[..., keep])
        return out


class SupportResult(NamedTuple):
    """Result of :func:`support_check`."""

    passed: bool
    violations: np.ndarray  # indices of cells with p == 0 and a positive count
    count: int  # total observations in those cells


class GofResult(NamedTuple):
    """Result of :func:`goodness_of_fit`."""

    statistic: float
    pvalue: float
    dof: int
    cells: int  # cells (after pooling) the statistic is computed on
    n: int
    method: str  # "asymptotic", "exact", "monte-carlo" or "support"
    floor: float = 0.0  # the smallest p-value this test could have given with these n and probabilities


class KLResult(NamedTuple):
    """Result of :func:`kl_divergence`."""

    statistic: float  # plug-in KL(empirical || p), nats
    corrected: float  # statistic minus its null bias (cells - 1) / (2 N)
    bias: float
    g_statistic: float  # 2 N KL, the G statistic on the unpooled cells
    pvalue: float  # from the pooled G-test


class TVResult(NamedTuple):
    """Result of :func:`total_variation`."""

    statistic: float  # TV(empirical, p)
    upper: float  # upper confidence bound on TV(sampler, p)
    confidence: float


def pool_cells(probs, n: int, min_expected: float = MIN_EXPECTED) -> PoolingPlan:
    """Merge cells so that every group has expected count at least ``min_expected``.

    The plan depends on ``probs`` and ``n`` only, never on observed counts, so the test
    that uses it keeps its nominal level. Cells of probability zero are left out (they
    belong to :func:`support_check`). Cells are taken in increasing order of probability
    and merged greedily; a short last group joins the one before it.

    Parameters
    ----------
    probs : array_like, shape (cells,)
        Expected distribution.
    n : int
        Number of observations the test will see.
    min_expected : float
        Smallest expected count allowed in a group (Cochran's rule of 5 by default).

    Returns
    -------
    PoolingPlan

    Examples
    --------
    >>> plan = pool_cells([0.5, 0.3, 0.1, 0.06, 0.04], n=100)
    >>> plan.n_groups  # 0.04 and 0.06 merge
    4
    """
    p = as_probs(probs)
    if p.ndim != 1:
        raise ValueError(f"probs must be one-dimensional, got shape {p.shape}")
    if n <= 0:
        raise ValueError(f"n must be a positive number of observations, got {n}")
    groups = np.full(p.size, -1, dtype=np.int64)
    order = np.argsort(p, kind="stable")
    order = order[p[order] > 0]
    threshold = min_expected / n
    n_small = int(np.searchsorted(p[order], threshold, side="left"))
    g, acc = _greedy_groups(p, order[:n_small], threshold, groups)
    big = order[n_small:]
    if acc > 0 and big.size:  # an open group takes the smallest large cell
        groups[big[0]] = g
        g, big = g + 1, big[1:]
    elif acc > 0:  # all cells small: the open group joins the previous one
        if g > 0:
            groups[groups == g] = g - 1
        else:
            g = 1
    groups[big] = g + np.arange(big.size)
    n_groups = int(groups.max()) + 1
    gp = np.zeros(n_groups)
    np.add.at(gp, groups[groups >= 0], p[groups >= 0])
    return PoolingPlan(groups, gp)


def _greedy_groups(p, small, threshold: float, groups) -> tuple[int, float]:
    """Number ``small`` (cells in increasing order of probability, each below ``threshold``) into
    consecutive groups, each closed as soon as its running sum reaches ``threshold``; returns the next
    group number and the open group's sum (0.0 if none is open).

    The running sums are ``np.cumsum`` from each group's first cell, the very float64 additions of a
    loop over the cells, so the groups are the loop's to the bit; while a group spans many cells
    (a joint of V**L cells, most of them tiny) a window of sums replaces thousands of Python steps,
    and where groups come down to a few cells each, one step per cell is cheaper again."""
    g, acc, start, n = 0, 0.0, 0, small.size
    ps = p[small]
    while start < n and threshold > 8 * ps[start]:  # groups of more than 8 cells: sums by the window
        width = 64
        while True:
            cs = np.cumsum(ps[start : start + width])
            e = int(np.searchsorted(cs, threshold, side="left"))  # the first sum that reaches it
            if e < cs.size or start + width >= n:
                break
            width *= 2
        if e < cs.size:
            groups[small[start : start + e + 1]] = g
            g, start = g + 1, start + e + 1
        else:
            groups[small[start:]] = g
            return g, float(cs[-1])
    for c in small[start:]:  # one step per cell
        groups[c] = g
        acc += p[c]
        if acc >= threshold:
            g, acc = g + 1, 0.0
    return g, acc


def support_check(counts, probs) -> SupportResult:
    """Hard check that nothing was observed where the target has probability zero.

    A single such observation proves the sampler wrong, whatever the sample size, so
    this is an assertion rather than a chi-square cell.

    Examples
    --------
    >>> support_check([3, 0, 1], [0.5, 0.5, 0.0]).passed
    False
    """
    c = as_counts(counts)
    p = as_probs(probs)
    same_shape(c, p, ("counts", "probs"))
    bad = (p == 0) & (c > 0)
    return SupportResult(bool(not bad.any()), np.flatnonzero(bad.ravel()), int(c[bad].sum()))


def _observed(counts, probs):
    """Validated flat counts, probabilities and the sample size (which must be positive)."""
    c = as_counts(counts).ravel()
    p = as_probs(probs).ravel()
    same_shape(c, p, ("counts", "probs"))
    n = int(c.sum())
    if n == 0:
        raise ValueError("counts are all zero: there is nothing to test")
    return c, p, n


def _divergence_stat(obs, exp, lam):
    # power-divergence statistic, written out so the Monte Carlo loop is vectorised
    obs = np.asarray(obs, dtype=np.float64)
    if lam == 1.0:
        return np.sum((obs - exp) ** 2 / exp, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        term = np.where(obs > 0, obs * np.log(obs / exp), 0.0)
    return 2.0 * np.sum(term, axis=-1)


def _chi2_limit(obs: np.ndarray, exp: np.ndarray, lam: float) -> tuple[float, float]:
    """(statistic, p-value) of ``scipy.stats.power_divergence(obs, exp, lambda_)`` for Pearson (``lam``
    1) or G (0) on 1-D float64 counts whose total ``exp`` shares: the same operations, so the same
    bits (tests/test_stats_gof.py compares them), without the 0.15 ms a call of scipy's array-API and
    NaN-policy wrapper, which a battery's thousands of pooled tests spent most of their time in."""
    terms = (obs - exp) ** 2 / exp if lam == 1.0 else 2.0 * special.xlogy(obs, obs / exp)
    stat = np.sum(terms, axis=0)
    return stat, special.chdtrc(np.float64(terms.shape[0]) - 1, stat)


def _two_cell_stat(x, n: int, exp: np.ndarray, lam: float):
    """The statistic of the two-cell tables (x, n - x) against expected counts ``exp`` [2]."""
    x = np.asarray(x, dtype=np.float64)
    return _divergence_stat(np.stack([x, n - x], axis=-1), exp, lam)


def _two_cell_tail(n: int, exp: np.ndarray, lam: float, threshold: float) -> float:
    """P(statistic >= threshold) when the first cell's count is Binomial(n, exp[0] / n), exactly.

    Both statistics are convex in the first cell's count x with their minimum at its expectation,
    so the tables at least as extreme are x <= a and x >= b; a and b are found by bisection
    (about 2 log2(n) evaluations, whatever n) and the tail is two binomial sums."""
    share = float(exp[0] / (exp[0] + exp[1]))
    mid = int(min(n, max(0.0, np.floor(exp[0]))))

    def extreme(x: int) -> bool:
        return bool(_two_cell_stat(x, n, exp, lam) >= threshold)

    a = -1  # the last extreme count at or below the expectation (the statistic falls towards it)
    if extreme(0):
        lo, hi = 0, mid
        while lo < hi:
            m = (lo + hi + 1) // 2
            lo, hi = (m, hi) if extreme(m) else (lo, m - 1)
        a = lo
    b = n + 1  # the first extreme count above it (the statistic rises from it)
    if mid < n and extreme(n):
        lo, hi = mid + 1, n
        while lo < hi:
            m = (lo + hi) // 2
            lo, hi = (lo, m) if extreme(m) else (m + 1, hi)
        b = lo
    tail = (special.bdtr(a, n, share) if a >= 0 else 0.0) + (special.bdtrc(b - 1, n, share) if b <= n else 0.0)
    return float(min(1.0, tail))


def _at_least(stat: float) -> float:
    """A table's statistic counts as reaching ``stat`` within this tolerance (float ties between tables
    that are the same up to the order of their cells)."""
    return stat - 1e-9 * max(1.0, abs(stat))


def _chi2_floor(probs: np.ndarray, n: int, lam: float) -> float:
    """The chi-square limit's smallest p-value at n observations over pooled ``probs``: every
    observation in the least likely group (the statistic's largest value)."""
    least = float(np.min(probs))
    stat = n * (1.0 - least) / least if lam == 1.0 else 2.0 * n * np.log(1.0 / least)
    return float(special.chdtrc(np.float64(probs.size) - 1, stat))


def goodness_of_fit(
    counts,
    probs,
    *,
    statistic: str = "pearson",
    min_expected: float = MIN_EXPECTED,
    method: str = "auto",
    mc_samples: int = 9999,
    seed=None,
    min_pvalue=None,
) -> GofResult:
    """Test that ``counts`` are a multinomial sample from ``probs``.

    Cells are pooled by :func:`pool_cells` (decided from ``probs`` alone). With at least
    two pooled cells the statistic is referred to its chi-square limit (what scipy's
    ``power_divergence`` computes). Otherwise the p-value is exact where ``probs`` has two
    positive cells (a binomial sum over the tables at least as extreme), and estimated by
    simulating the statistic under the null on the unpooled cells where it has more.
    Observations in cells of probability zero give ``pvalue = 0`` (method "support").

    Parameters
    ----------
    counts, probs : array_like, shape (cells,)
    statistic : {"pearson", "g"}
        Pearson's X^2 or the likelihood-ratio G = 2 N KL(empirical || probs).
    min_expected : float
        Pooling threshold. The chi-square limit is trustworthy when every expected
        count is at least about 5 (Cochran 1954).
    method : {"auto", "asymptotic", "exact", "monte-carlo"}
        "exact" needs exactly two cells of positive probability.
    mc_samples : int
        Null simulations for the Monte Carlo p-value, which is then at least
        ``1 / (mc_samples + 1)``.
    seed : int or numpy Generator, optional
    min_pvalue : float, optional
        The smallest p-value the test must be able to give, such as the level it will be
        compared with: a Monte Carlo test none of whose first ``mc_samples`` simulations reached
        the statistic goes on with the same stream up to ``ceil(1 / min_pvalue) - 1``
        simulations in all (at most :data:`MAX_MC_SAMPLES`). The p-value stays valid: it is
        refined only where it was already at its floor (Besag and Clifford 1991 study
        sequential Monte Carlo p-values of this kind).

    Returns
    -------
    GofResult
        ``floor`` is the smallest p-value the test could have given at these ``n`` and
        ``probs`` (all observations in the least likely cell, or no simulation reaching the
        statistic): a test whose floor is above its level could not have rejected.

    References
    ----------
    Cochran, W. G. (1954). Some methods for strengthening the common chi-square tests.
    Biometrics 10, 417-451.
    Cressie, N. and Read, T. R. C. (1984). Multinomial goodness-of-fit tests. JRSS B 46.
    Besag, J. and Clifford, P. (1991). Sequential Monte Carlo p-values. Biometrika 78, 301-304.

    Examples
    --------
    >>> r = goodness_of_fit([48, 52], [0.5, 0.5])
    >>> round(r.pvalue, 3)
    0.689
    >>> r = goodness_of_fit([97, 3], [0.99, 0.01])  # one expected count under 5: exact
    >>> r.method, round(r.pvalue, 4)
    ('exact', 0.0794)
    """
    if statistic not in _LAMBDAS:
        raise ValueError(f"unknown statistic {statistic!r}; choose one of {sorted(_LAMBDAS)}")
    if method not in ("auto", "asymptotic", "exact", "monte-carlo"):
        raise ValueError(f"unknown method {method!r}; choose 'auto', 'asymptotic', 'exact' or 'monte-carlo'")
    if min_pvalue is not None and not 0.0 < float(min_pvalue) <= 1.0:
        raise ValueError(f"min_pvalue must be in (0, 1], got {min_pvalue!r}")
    c, p, n = _observed(counts, probs)
    sup = support_check(c, p)
    if not sup.passed:
        return GofResult(float("inf"), 0.0, 0, int(p.size), n, "support")
    lam = _LAMBDAS[statistic]
    plan = pool_cells(p, n, min_expected)
    if method == "asymptotic" or (method == "auto" and plan.n_groups >= 2):
        if plan.n_groups < 2:
            raise ValueError(
                f"only {plan.n_groups} cell has expected count >= {min_expected} at n={n}; "
                "collect more samples or use method='exact' (two cells) or 'monte-carlo'"
            )
        obs = plan.apply(c).astype(np.float64)
        exp = plan.probs * n
        exp *= obs.sum() / exp.sum()  # the same totals up to rounding (scipy's power_divergence asked for it)
        stat, pvalue = _chi2_limit(obs, exp, lam)
        return GofResult(float(stat), float(pvalue), plan.n_groups - 1, plan.n_groups, n, "asymptotic",
                         _chi2_floor(plan.probs, n, lam))
    pos = p > 0
    cells = int(pos.sum())
    exp = p[pos] * n
    stat = float(_divergence_stat(c[pos], exp, lam))
    if method == "exact" and cells != 2:
        raise ValueError(f"an exact p-value needs two cells of positive probability, got {cells}; "
                         "use method='monte-carlo'")
    if cells == 1:  # every table is the one observed: nothing can deviate
        return GofResult(stat, 1.0, 0, 1, n, "exact", 1.0)
    if cells == 2 and method != "monte-carlo":
        floor = _two_cell_tail(n, exp, lam, _at_least(float(np.max(_two_cell_stat([0, n], n, exp, lam)))))
        return GofResult(stat, _two_cell_tail(n, exp, lam, _at_least(stat)), 1, 2, n, "exact", floor)
    rng = np.random.default_rng(seed)
    threshold = _at_least(stat)

    def reaching(count: int) -> int:  # how many of ``count`` more null tables reach the statistic, in chunks
        hits, chunk = 0, max(1, _MC_CHUNK // cells)
        for start in range(0, count, chunk):
            sims = rng.multinomial(n, p[pos], size=min(chunk, count - start))
            hits += int(np.sum(_divergence_stat(sims, exp, lam) >= threshold))
        return hits

    drawn = int(mc_samples)
    reached = reaching(drawn)
    most = drawn
    if min_pvalue is not None:
        # 1 / (1 / (B + 1)) can come out a hair above B + 1: B simulations for min_pvalue = 1 / (B + 1)
        most = max(drawn, min(MAX_MC_SAMPLES, int(np.ceil(1.0 / float(min_pvalue) - 1e-6)) - 1))
    if reached == 0:  # at the floor: go on with the same stream (the first draws are the ones already made)
        reached, drawn = reaching(most - drawn), most
    pval = (1.0 + reached) / (drawn + 1.0)
    return GofResult(stat, float(pval), cells - 1, cells, n, "monte-carlo", 1.0 / (most + 1.0))


def kl_divergence(counts, probs, *, min_expected: float = MIN_EXPECTED) -> KLResult:
    """KL(empirical || probs) in nats, its null bias, and the tie G = 2 N KL.

    Under the null the plug-in KL is biased upward by about (cells - 1) / (2 N), where
    cells counts the cells of positive probability, so ``corrected`` is centred at zero
    for a correct sampler. ``g_statistic`` equals ``2 * N * statistic`` exactly; the
    p-value is that of the pooled G-test (:func:`goodness_of_fit` with
    ``statistic="g"``).

    References
    ----------
    Miller, G. (1955). Note on the bias of information estimates.

    Examples
    --------
    >>> r = kl_divergence([50, 50], [0.5, 0.5])
    >>> r.statistic
    0.0
    """
    c, p, n = _observed(counts, probs)
    if not support_check(c, p).passed:
        return KLResult(float("inf"), float("inf"), 0.0, float("inf"), 0.0)
    emp = c / n
    nz = c > 0
    kl = float(np.sum(emp[nz] * np.log(emp[nz] / p[nz])))
    bias = (int(np.count_nonzero(p)) - 1) / (2.0 * n)
    g = goodness_of_fit(c, p, statistic="g", min_expected=min_expected)
    return KLResult(kl, kl - bias, bias, 2.0 * n * kl, g.pvalue)


def total_variation(counts, probs, *, confidence: float = 0.99) -> TVResult:
    """Empirical total variation from ``probs`` with an upper confidence bound.

    The bound uses the Bretagnolle-Huber-Carol inequality
    ``P(||emp - r||_1 >= e) <= 2^m exp(-N e^2 / 2)`` for the sampler's true law r on m
    cells, so with the stated confidence ``TV(r, probs) <= TV(emp, probs) + e / 2``.
    It is distribution-free and conservative; prefer the power statement of
    :mod:`stats.power` for what a test could detect.

    References
    ----------
    van der Vaart, A. W. and Wellner, J. A. (1996). Weak Convergence and Empirical
    Processes, Proposition A.6.6.
    """
    c, p, n = _observed(counts, probs)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    tv = 0.5 * float(np.abs(c / n - p).sum())
    m = p.size
    e = np.sqrt(2.0 * (m * np.log(2.0) + np.log(1.0 / (1.0 - confidence))) / n)
    return TVResult(tv, min(1.0, tv + e / 2.0), confidence)
