"""Power of chi-square goodness-of-fit tests, and what a finished run could detect.

Under an alternative p1 the Pearson statistic against p0 on m cells is approximately
noncentral chi-square with m - 1 degrees of freedom and noncentrality
``lambda = N * sum((p1 - p0)**2 / p0)``. By Cauchy-Schwarz
``sum((p1 - p0)**2 / p0) >= (sum |p1 - p0|)**2 = 4 TV**2``, so any alternative at total
variation at least eps has ``lambda >= 4 N eps**2``: sizing N for that lambda guarantees the
power against every such alternative (on the cells the test sees).

References
----------
Cochran, W. G. (1952). The chi-square test of goodness of fit. Ann. Math. Statist. 23.
Guenther, W. C. (1977). Power and sample size determination when the alternative
hypotheses are given in terms of chi-square. Biometrics 33.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from scipy import special  # the chi-square laws from scipy.special alone: scipy.stats costs 0.4 s to import

from ._validate import as_probs, check_level, same_shape


class PowerResult(NamedTuple):
    power: float
    noncentrality: float
    critical_value: float


class SampleSizeResult(NamedTuple):
    """``n`` samples (0 with a ``reason`` when no chi-square test exists)."""

    n: int
    noncentrality: float
    reason: str = ""


class DetectableResult(NamedTuple):
    """The smallest detectable TV (NaN with a ``reason`` when no chi-square test exists)."""

    tv: float
    noncentrality: float
    reason: str = ""


NO_TEST = ("fewer than two pooled cells (dof = {dof}): there is no chi-square test of this law, "
           "and a point mass is settled by the support check alone")


def _check_dof(dof) -> int:
    dof = int(dof)
    if dof < 1:
        raise ValueError(f"dof must be >= 1 (cells - 1), got {dof}")
    return dof


def noncentrality(p0, p1, n: float) -> float:
    """``N * sum((p1 - p0)**2 / p0)`` over cells with p0 > 0 (p1 must vanish where p0 does)."""
    a = as_probs(p0, "p0")
    b = as_probs(p1, "p1")
    same_shape(a, b, ("p0", "p1"))
    pos = a > 0
    if np.any(b[~pos] > 0):
        return float("inf")  # mass outside the support: caught by the support check
    return float(n * np.sum((b[pos] - a[pos]) ** 2 / a[pos]))


def chisquare_power(p0, p1, n: int, alpha: float = 0.01, dof: int | None = None) -> PowerResult:
    """Approximate power of Pearson's test of p0 at level ``alpha`` when data follow p1.

    Valid when expected counts are large (>= 5) and the alternative is near p0
    (the local-alternative limit).

    Examples
    --------
    >>> r = chisquare_power([0.5, 0.5], [0.55, 0.45], n=2000, alpha=0.01)
    >>> round(r.power, 2)
    0.97
    """
    alpha = check_level(alpha)
    lam = noncentrality(p0, p1, n)
    dof = _check_dof(np.count_nonzero(np.asarray(p0)) - 1 if dof is None else dof)
    crit = float(special.chdtri(dof, alpha))  # chi2.isf(alpha, dof)
    power = 1.0 if not np.isfinite(lam) else float(1.0 - special.chndtr(crit, dof, lam))  # ncx2.sf
    if np.isnan(power):  # scipy's ncx2 fails for enormous lambda, where the power is 1
        power = 1.0 if lam > crit else 0.0
    return PowerResult(power, lam, crit)


def required_noncentrality(dof: int, alpha: float = 0.01, power: float = 0.99) -> float:
    """Smallest lambda with ``P(ncx2(dof, lambda) > chi2.isf(alpha, dof)) >= power``."""
    return _required_noncentrality(_check_dof(dof), check_level(alpha), check_level(power, "power"))


@functools.lru_cache(maxsize=4096)
def _required_noncentrality(dof: int, alpha: float, power: float) -> float:
    # the lambda whose noncentral chi-square leaves 1 - power below the critical value (scipy.special's
    # inverse of the noncentral CDF in lambda; equal to a root search on ncx2.sf to 1e-13)
    crit = special.chdtri(dof, alpha)
    return float(special.chndtrinc(crit, dof, 1.0 - power))


def samples_for_tv(eps: float, dof: int, alpha: float = 0.01, power: float = 0.99) -> SampleSizeResult:
    """Samples needed to detect any deviation of total variation >= ``eps``.

    Examples
    --------
    >>> samples_for_tv(0.01, dof=9, alpha=0.01, power=0.99).n
    97228
    """
    if not 0 < eps <= 1:
        raise ValueError(f"eps must lie in (0, 1], got {eps}")
    if int(dof) < 1:
        return SampleSizeResult(0, float("nan"), NO_TEST.format(dof=int(dof)))
    lam = required_noncentrality(dof, alpha, power)
    return SampleSizeResult(int(np.ceil(lam / (4.0 * eps**2))), lam)


def min_detectable_tv(n: int, dof: int, alpha: float = 0.01, power: float = 0.99) -> DetectableResult:
    """Smallest total variation that ``n`` samples detect with the given power.

    With ``dof < 1`` (fewer than two pooled cells) there is no test: ``tv`` is NaN and
    ``reason`` says why, rather than an exception in the middle of a report.

    Examples
    --------
    >>> round(min_detectable_tv(97228, dof=9).tv, 4)
    0.01
    """
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    if int(dof) < 1:
        return DetectableResult(float("nan"), float("nan"), NO_TEST.format(dof=int(dof)))
    lam = required_noncentrality(dof, alpha, power)
    return DetectableResult(float(np.sqrt(lam / (4.0 * n))), lam)
