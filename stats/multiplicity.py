"""Multiple testing and calibration: Holm, Benjamini-Hochberg, uniformity of p-values."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._validate import check_level


class MultipleTestResult(NamedTuple):
    """Adjusted p-values and which hypotheses are rejected at ``alpha``."""

    rejected: np.ndarray
    adjusted: np.ndarray
    alpha: float


class UniformityResult(NamedTuple):
    statistic: float
    pvalue: float
    n: int


class RejectionRateResult(NamedTuple):
    rate: float
    low: float  # Clopper-Pearson interval for the true rate
    high: float
    pvalue: float  # one-sided test of "rate <= alpha" (false alarms) or ">= alpha"


def _pvalues(pvalues) -> np.ndarray:
    p = np.asarray(pvalues, dtype=np.float64).ravel()
    if p.size == 0:
        raise ValueError("no p-values given")
    if np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("p-values must be finite numbers in [0, 1]")
    return p


def holm(pvalues, alpha: float = 0.01) -> MultipleTestResult:
    """Holm's step-down adjustment, controlling the family-wise error rate.

    Valid under any dependence between the tests.

    References
    ----------
    Holm, S. (1979). A simple sequentially rejective multiple test procedure.
    Scandinavian Journal of Statistics 6, 65-70.

    Examples
    --------
    >>> holm([0.01, 0.04, 0.03], alpha=0.05).adjusted
    array([0.03, 0.06, 0.06])
    """
    alpha = check_level(alpha)
    p = _pvalues(pvalues)
    m = p.size
    order = np.argsort(p, kind="stable")
    adj_sorted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    adj = np.empty(m)
    adj[order] = adj_sorted
    return MultipleTestResult(adj <= alpha, adj, alpha)


def benjamini_hochberg(pvalues, alpha: float = 0.01) -> MultipleTestResult:
    """Benjamini-Hochberg step-up adjustment, controlling the false discovery rate.

    Valid for independent or positively dependent tests.

    References
    ----------
    Benjamini, Y. and Hochberg, Y. (1995). Controlling the false discovery rate.
    JRSS B 57, 289-300.
    """
    alpha = check_level(alpha)
    from scipy import stats as sps  # here, not at the top: Holm alone needs no scipy.stats (0.4 s to import)

    adj = sps.false_discovery_control(_pvalues(pvalues), method="bh")
    return MultipleTestResult(adj <= alpha, adj, alpha)


def uniformity_test(pvalues) -> UniformityResult:
    """Kolmogorov-Smirnov test that p-values are Uniform(0, 1).

    For continuous test statistics, p-values of a true null are uniform; a small bias
    spread over many independent tests shows up as too many small p-values even when
    no single test rejects. Discrete statistics make p-values slightly conservative,
    which this test may flag at very large numbers of p-values.

    Examples
    --------
    >>> uniformity_test([0.1, 0.5, 0.9]).pvalue > 0.5
    True
    """
    p = _pvalues(pvalues)
    from scipy import stats as sps

    r = sps.kstest(p, "uniform")
    return UniformityResult(float(r.statistic), float(r.pvalue), int(p.size))


def rejection_rate(rejections: int, trials: int, alpha: float, *, alternative: str = "greater",
                   confidence: float = 0.95) -> RejectionRateResult:
    """Rejection rate with a Clopper-Pearson interval and a binomial test against ``alpha``.

    ``alternative="greater"`` asks whether false alarms exceed ``alpha`` (calibration of a
    correct sampler); ``"less"`` whether a detection rate falls short of ``alpha`` (used
    with ``alpha`` set to a predicted power).

    Examples
    --------
    >>> r = rejection_rate(1, 100, 0.01)
    >>> r.pvalue > 0.3
    True
    """
    if trials <= 0 or not 0 <= rejections <= trials:
        raise ValueError(f"need 0 <= rejections <= trials and trials > 0, got {rejections}/{trials}")
    if alternative not in ("greater", "less"):
        raise ValueError("alternative must be 'greater' or 'less'")
    from scipy import stats as sps

    r = sps.binomtest(int(rejections), int(trials), float(alpha), alternative=alternative)
    # the interval is two-sided whatever the direction of the test
    ci = sps.binomtest(int(rejections), int(trials)).proportion_ci(confidence_level=confidence, method="exact")
    return RejectionRateResult(rejections / trials, float(ci.low), float(ci.high), float(r.pvalue))
