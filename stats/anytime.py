"""Anytime-valid tests: e-processes whose false-alarm bound holds however often one looks.

A test repeated on a growing sample spends its level at every look: over enough looks a correct
sampler is rejected for sure. An *e-process* E_n is a non-negative process with E_0 = 1 that, under
the null, is a supermartingale; Ville's inequality then gives

    P(sup_n E_n >= 1 / alpha) <= alpha,

so "alarm when E_n >= 1 / alpha" keeps its false-alarm probability at most alpha over an unbounded
stream, whenever and however often E_n is read (and ``min(1, 1 / sup E)`` is an anytime-valid
p-value). Two e-processes, both functions of running sums (constant memory):

* :func:`dirichlet_mixture_log_e`: identity of a categorical law with known cell probabilities pi
  (binned PIT values: pi uniform). The likelihood ratio of a Dirichlet(a)-mixture of alternatives
  against pi is a martingale under pi, and depends on the counts alone, so reading it at file
  boundaries instead of after each observation keeps the bound. Its log grows like
  ``n KL(f || pi) - (c - 1)/2 log n`` under an alternative f: it detects any fixed deviation.
  :func:`multiscale_log_e` averages it over views of the cells (2, 4, 10 and 20 ordered bins, and
  each bin against the rest), so that neither a broad shift nor a spike waits out the finest view's
  ``(c - 1)/2 log n``.
* :func:`betting_log_e`: observations X_i in [0, 1] whose null conditional means mu_i vary
  (an accepted draft, with its own acceptance probability). Each fixed bet lambda gives the
  martingale ``prod_i (1 + lambda (X_i - mu_i))`` (non-negative for ``|lambda| <= 1``); their
  average over a fixed grid of positive and negative bets is a martingale too, and near-optimal
  for any drift (testing by betting, Waudby-Smith and Ramdas 2023).

Several e-processes watched together keep a family-wise bound by splitting alpha (Bonferroni
holds for e-processes through the union bound over Ville's inequality); :func:`alpha_share`
splits it over a number of streams that need not be known in advance.

References
----------
Ville, J. (1939). Etude critique de la notion de collectif. Gauthier-Villars.
Robbins, H. (1970). Statistical methods related to the law of the iterated logarithm. Ann. Math.
Statist. 41, 1397-1409 (mixture martingales).
Howard, S. R., Ramdas, A., McAuliffe, J. and Sekhon, J. (2021). Time-uniform, nonparametric,
nonasymptotic confidence sequences. Ann. Statist. 49, 1055-1080.
Waudby-Smith, I. and Ramdas, A. (2023). Estimating means of bounded random variables by betting.
J. R. Stat. Soc. B 86, 1-27.
Ramdas, A., Grunwald, P., Vovk, V. and Shafer, G. (2023). Game-theoretic statistics and safe
anytime-valid inference. Statist. Sci. 38, 576-601.

Examples
--------
>>> import numpy as np
>>> from stats.anytime import dirichlet_mixture_log_e
>>> counts = np.array([30, 25, 20, 25])       # 100 draws of a 4-cell law
>>> float(np.exp(dirichlet_mixture_log_e(counts, np.full(4, 0.25)))) < 1   # no evidence against pi
True
>>> counts = np.array([70, 10, 10, 10])
>>> float(np.exp(dirichlet_mixture_log_e(counts, np.full(4, 0.25)))) > 1e6
True
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.special import gammaln, logsumexp

# bets of the default betting e-process: +-2^-1 ... +-2^-12 (a drift of d per observation with
# variance v is best met by lambda = d / v: 2^-12 reaches drifts of about 6e-5 at v = 0.25)
BETS = np.concatenate([2.0 ** -np.arange(1, 13), -(2.0 ** -np.arange(1, 13))])


class AnytimeResult(NamedTuple):
    """An e-process read now: its e-value, the anytime-valid p-value ``min(1, 1 / max e so far)``."""

    statistic: float  # the e-value now
    pvalue: float


def _as_probs(null) -> np.ndarray:
    pi = np.asarray(null, np.float64)
    if pi.ndim != 1 or pi.size < 2 or np.any(~np.isfinite(pi)) or np.any(pi <= 0) or abs(pi.sum() - 1) > 1e-9:
        raise ValueError("null must be a vector of at least 2 positive probabilities summing to 1 "
                         "(cells of probability 0 are a support check, not a cell of this test)")
    return pi


def dirichlet_mixture_log_e(counts, null, concentration: float = 1.0) -> float:
    """Log e-value of the Dirichlet-mixture likelihood ratio for categorical counts against ``null``.

    ``E = [B(a + n) / B(a)] / prod_j pi_j^n_j`` with ``a = concentration`` in every cell: the
    marginal likelihood of the counts under a Dirichlet(a) prior on the cell probabilities, over
    their likelihood under ``null``. Valid at any sample size and under optional stopping.

    Parameters
    ----------
    counts : array of int, shape (c,)
        Observations per cell so far.
    null : array, shape (c,)
        The null cell probabilities, all positive.
    concentration : float
        The prior's weight per cell (1: uniform on the simplex).
    """
    pi = _as_probs(null)
    n = np.asarray(counts, np.float64)
    if n.shape != pi.shape or np.any(n < 0):
        raise ValueError(f"counts must be {pi.size} non-negative numbers, got shape {n.shape}")
    a = np.full(pi.size, float(concentration))
    total = n.sum()
    log_mix = gammaln(a.sum()) - gammaln(a.sum() + total) + np.sum(gammaln(a + n) - gammaln(a))
    return float(log_mix - np.sum(n * np.log(pi)))


def dirichlet_mixture_path(cells, counts_before, null, concentration: float = 1.0) -> np.ndarray:
    """Log e-values after each of a run of observations ``cells`` (cell indices in arrival order),
    starting from ``counts_before``: where, within a batch, the evidence first crossed a line."""
    pi = _as_probs(null)
    cells = np.asarray(cells, np.int64)
    before = np.asarray(counts_before, np.float64)
    start = dirichlet_mixture_log_e(before, pi, concentration)
    if cells.size == 0:
        return np.zeros(0)
    onehot = np.zeros((cells.size, pi.size))
    onehot[np.arange(cells.size), cells] = 1.0
    seen = np.cumsum(onehot, axis=0) - onehot  # this batch's counts before each observation
    n_j = before[cells] + seen[np.arange(cells.size), cells]
    n = before.sum() + np.arange(cells.size)
    a = float(concentration)
    # adding one draw to cell j multiplies the mixture by (a + n_j) / (c a + n) and the null by pi_j
    step = np.log(a + n_j) - np.log(pi.size * a + n) - np.log(pi[cells])
    return start + np.cumsum(step)


def _merged(counts, null, groups):
    g = np.asarray(groups, np.int64)
    m = int(g.max()) + 1
    return (np.bincount(g, weights=np.asarray(counts, np.float64), minlength=m),
            np.bincount(g, weights=np.asarray(null, np.float64), minlength=m), g)


def coarsenings(cells: int, resolutions=(2, 4, 10, 20), singles: bool = True) -> list:
    """The views :func:`multiscale_log_e` averages: ``cells`` ordered cells grouped into runs of equal
    width, one grouping per resolution that divides ``cells`` (a resolution of ``cells`` is the
    identity), and with ``singles`` each cell against all the others (a spike on one cell is then
    met by a two-cell mixture, which pays ``1/2 log n``, not ``(cells - 1)/2 log n``)."""
    views = [np.arange(cells) * r // cells for r in resolutions if r <= cells and cells % r == 0]
    if singles:
        views += [(np.arange(cells) == j).astype(np.int64) for j in range(cells)]
    return views


def multiscale_log_e(counts, null, groups, concentration: float = 1.0) -> float:
    """Log e-value of the average of Dirichlet-mixture e-processes over several coarsenings of the cells.

    An average of e-processes is an e-process. A mixture over c cells pays about ``(c - 1)/2 log n``
    before it can grow, so a coarse view (2 or 4 wide cells) catches a broad shift of mass several
    times sooner, and the finest view catches what only fine cells see; the average costs only
    ``log(len(groups))`` against the best of them.

    Parameters
    ----------
    groups : list of int arrays
        Each maps every cell to its group in one view (:func:`coarsenings`).
    """
    logs = [dirichlet_mixture_log_e(*_merged(counts, null, g)[:2], concentration) for g in groups]
    return float(logsumexp(logs) - np.log(len(logs)))


def multiscale_path(cells, counts_before, null, groups, concentration: float = 1.0) -> np.ndarray:
    """:func:`multiscale_log_e` after each observation of ``cells`` (cell indices in arrival order)."""
    paths = []
    for g in groups:
        before, pi, g = _merged(counts_before, null, g)
        paths.append(dirichlet_mixture_path(g[np.asarray(cells, np.int64)], before, pi, concentration))
    return logsumexp(np.stack(paths), axis=0) - np.log(len(paths)) if len(cells) else np.zeros(0)


def betting_log_wealth(x, mu, bets=BETS) -> np.ndarray:
    """Log wealth of each fixed bet after the observations ``x`` with null means ``mu``:
    ``sum_i log(1 + lambda (x_i - mu_i))`` per lambda (add these across batches: a running sum)."""
    x, mu, bets = np.asarray(x, np.float64), np.asarray(mu, np.float64), np.asarray(bets, np.float64)
    if np.any(np.abs(bets) > 1):
        raise ValueError("bets must lie in [-1, 1]: a larger one can lose more than the wealth")
    if x.size == 0:
        return np.zeros(bets.size)
    return np.log1p(bets[:, None] * (x - mu)[None, :]).sum(axis=1)


def betting_log_e(log_wealth) -> float:
    """Log e-value of the betting e-process: the average wealth of the bets (given as logs)."""
    w = np.asarray(log_wealth, np.float64)
    return float(logsumexp(w) - np.log(w.size))


def betting_path(x, mu, log_wealth_before, bets=BETS) -> np.ndarray:
    """Log e-values of the betting e-process after each observation of ``x``, from ``log_wealth_before``."""
    x, mu, bets = np.asarray(x, np.float64), np.asarray(mu, np.float64), np.asarray(bets, np.float64)
    if x.size == 0:
        return np.zeros(0)
    w = np.asarray(log_wealth_before, np.float64)[:, None] + np.cumsum(
        np.log1p(bets[:, None] * (x - mu)[None, :]), axis=1)
    return logsumexp(w, axis=0) - np.log(bets.size)


def alpha_share(alpha: float, index: int) -> float:
    """The share of ``alpha`` for the ``index``-th stream (1-based) of a family whose size is not known
    in advance: ``alpha / (index (index + 1))``, which sums to ``alpha`` over every index.

    >>> round(sum(alpha_share(0.01, i) for i in range(1, 100_000)), 6)
    0.01
    """
    if index < 1:
        raise ValueError("index counts from 1")
    return alpha / (index * (index + 1))


def anytime_pvalue(max_log_e: float) -> float:
    """``min(1, 1 / sup E)``: a p-value valid at any stopping time (from the largest log e-value seen)."""
    return float(min(1.0, np.exp(-max_log_e)))
