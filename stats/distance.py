"""How far a sampler's law is from its target: total variation with intervals that hold, and certificates.

A test says whether counts are consistent with ``p``. This module answers the two questions after it:
*how far* is the sampled law ``r`` from ``p`` (an estimate of ``TV(r, p)`` and of ``KL(r || p)``),
and *is it within epsilon* (an equivalence statement at confidence ``1 - alpha``).

Estimates
    The plug-in ``T = TV(empirical, p)`` is biased upward by about ``sum_i sqrt(p_i / n) / 2``
    (``sqrt(V / n)`` order at a flat law): at ``V = 32,768`` and ``n = 2^18`` that is 0.14 for a law
    equal to ``p``. :func:`tv_interval`'s ``estimate`` corrects it token by token. A token seen often
    (``n p_i >= 10``) whose deviation exceeds three standard deviations ``s = sqrt(p (1 - p) / n)``
    inverts the mean absolute deviation of a Gaussian, ``E |X - p| = s sqrt(2 / pi) exp(-d^2 / 2 s^2)
    + d erf(d / s sqrt 2)``, for its own ``d = |r_i - p_i|``; the tokens within the noise together
    subtract the null mean of a deviation that stayed within it, and the rarely seen tokens together
    subtract their exact null mean deviation (De Moivre's binomial mean absolute deviation), each
    group clipped at zero. In the tests (V = 8 to 32,768; deviations absent, concentrated on a few
    tokens, or spread within each token's noise) it errs by less than the plug-in's null bias ``E_p T``,
    and by a third of it or less for a correct sampler. A deviation spread thinly over many tokens stays
    partly hidden in their noise at any estimator's rate (Jiao, Han and Weissman 2018). The estimate is
    not a bound; the interval is.
Intervals
    Both ends hold at any ``n`` (no asymptotics), with the method fixed by the vocabulary before any
    count is read:

    * ``"sets"`` (at most :data:`MAX_SET_CELLS` cells). ``TV(r, p) = max_A r(A) - p(A)`` over sets of
      tokens. Every set's probability gets a Clopper-Pearson interval at level ``alpha / S`` (S the
      ``2^(V-1) - 1`` sets up to complement, Bonferroni), so with probability ``1 - alpha`` all hold at
      once and ``max_A L(A) - p(A) <= TV <= max_A U(A) - p(A)``.
    * ``"mcdiarmid"`` (any vocabulary). Upper: ``E T >= TV(r, p)`` (Jensen) and one draw moves T by
      at most ``1 / n``, so ``TV <= T + sqrt(log(1 / a) / 2 n)`` with probability ``1 - a``
      (McDiarmid). It carries the plug-in's noise, so it needs about ``V / eps^2`` draws to
      certify ``eps``. Lower: the counts are split at random into two halves (given the counts, a
      uniformly random half of i.i.d. draws is itself i.i.d.: a multivariate hypergeometric draw);
      the first half picks ``A = {i: r1_i > p_i}``, the second gives a Clopper-Pearson lower bound on
      ``r(A)``, and ``TV >= r(A) - p(A)``.
KL
    ``KL(empirical || p)`` less its null bias ``(cells - 1) / 2n`` (Miller 1955), where the counts
    stay inside p's support and ``n`` is at least ten times the cells; otherwise NaN (or inf outside
    the support). Pinsker's inequality turns the TV interval's lower end into a lower bound on KL:
    ``KL >= 2 TV^2``.

:func:`certify` reads a family of intervals against a tolerance; :func:`sequences_to_certify` sizes a
run so that a law equal to ``p`` is expected to be certified within a tolerance.

References
----------
Clopper, C. J. and Pearson, E. S. (1934). The use of confidence or fiducial limits illustrated in the
case of the binomial. Biometrika 26, 404-413.
McDiarmid, C. (1989). On the method of bounded differences. Surveys in Combinatorics 141, 148-188.
Miller, G. (1955). Note on the bias of information estimates.
Wellek, S. (2010). Testing Statistical Hypotheses of Equivalence and Noninferiority, 2nd ed. CRC.
Jiao, J., Han, Y. and Weissman, T. (2018). Minimax estimation of the L1 distance. IEEE Trans. Inf.
Theory 64, 6672-6706 (why no estimator does much better than ``sqrt(V / (n log n))`` at large V).

Examples
--------
>>> import numpy as np
>>> p = np.array([0.5, 0.3, 0.2])
>>> counts = np.random.default_rng(0).multinomial(100_000, p)
>>> r = tv_interval(counts, p, alpha=0.01)
>>> r.method, r.lower == 0.0, r.upper < 0.01
('sets', True, True)
>>> certify([r], tolerance=0.01).verdict
'within'
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple, Sequence

import numpy as np
from scipy import special

from ._validate import as_counts, as_probs, check_level, same_shape
from .identity import binomial_mad

MAX_SET_CELLS = 12  # "sets" enumerates 2^(V-1) - 1 sets: 2,047 at V = 12
GAUSSIAN_COUNT = 10.0  # n p_i at or above which a token's own bias is corrected (Gaussian deviation)
SELECT_Z = 3.0  # a token's deviation beyond this many standard deviations is taken as its own
# E |Z| given |Z| <= SELECT_Z for a standard normal Z: what a token within the noise deviates by under the null
_NEAR_MEAN = float(np.sqrt(2 / np.pi) * (1 - np.exp(-SELECT_Z**2 / 2)) / special.erf(SELECT_Z / np.sqrt(2)))
SPLIT_SEED = 0x5EED  # the random halves of the "mcdiarmid" lower bound: fixed, so a result reproduces


class TVInterval(NamedTuple):
    """``TV(r, p)`` of the sampled law ``r``: a bias-corrected estimate and an interval at ``confidence``.

    ``plugin`` is ``TV(empirical, p)``; ``method`` says how the interval was made (module docstring).
    """

    estimate: float
    lower: float
    upper: float
    plugin: float
    n: int
    method: str
    confidence: float


class KLEstimate(NamedTuple):
    """``KL(r || p)`` in nats: bias-corrected estimate (NaN where not estimable) and Pinsker's lower bound."""

    estimate: float
    lower: float


class Certificate(NamedTuple):
    """A family of intervals read against a tolerance.

    ``verdict``: ``"within"`` (every upper end below the tolerance), ``"beyond"`` (some lower end above
    it) or ``"undecided"``. ``growth``: for an undecided family, about how many times the sample size
    would have to grow for every estimate's interval to clear the tolerance (inf where an estimate is
    itself at or above it); 1.0 otherwise. ``worst``: index of the interval that decided (or blocks).
    """

    verdict: str
    tolerance: float
    growth: float
    worst: int


def _clopper_pearson(x, n: int, a: float):
    """Two-sided Clopper-Pearson interval for binomial counts ``x`` of ``n`` at level ``a`` (exact)."""
    x = np.asarray(x, np.float64)
    lo = np.where(x > 0, special.betaincinv(np.maximum(x, 1e-300), n - x + 1, a / 2), 0.0)
    hi = np.where(x < n, special.betaincinv(x + 1, np.maximum(n - x, 1e-300), 1 - a / 2), 1.0)
    return lo, hi


@functools.lru_cache(maxsize=None)
def _set_masks(v: int) -> np.ndarray:
    """Every set of ``v`` cells up to complement (those without the last cell), as a bool matrix (read-only:
    one per V, shared by every interval of a run)."""
    rows = np.array(list(itertools.product((False, True), repeat=v - 1))[1:], dtype=bool)
    masks = np.concatenate([rows, np.zeros((rows.shape[0], 1), bool)], axis=1)
    masks.flags.writeable = False
    return masks


def _gaussian_mad(d, s):
    """``E |X - p|`` for ``X ~ N(p + d, s^2)``."""
    z = d / s
    return s * np.sqrt(2 / np.pi) * np.exp(-0.5 * z * z) + d * special.erf(z / np.sqrt(2))


def _invert_mad(a, s):
    """The ``d >= 0`` whose :func:`_gaussian_mad` is ``a`` (0 where ``a`` is below the null value)."""
    lo, hi = np.zeros_like(a), np.maximum(a, 0.0)  # mad(d) >= d, so d <= a
    for _ in range(60):  # bisection: monotone in d, vectorised over tokens
        mid = 0.5 * (lo + hi)
        below = _gaussian_mad(mid, s) < a
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def tv_estimate(counts, probs) -> float:
    """The bias-corrected estimate of ``TV(r, p)`` from multinomial ``counts`` (module docstring)."""
    c = as_counts(counts)
    p = as_probs(probs)
    same_shape(c, p, ("counts", "probs"))
    n = int(c.sum())
    if n == 0:
        return float("nan")
    emp = c / n
    dev = np.abs(emp - p)
    outside = p == 0  # no noise from p: their empirical mass is unbiased for r's
    seen = (n * p >= GAUSSIAN_COUNT) & ~outside
    s = np.sqrt(p * (1 - p) / n)
    far = seen & (dev > SELECT_Z * s)  # deviations beyond the noise: each corrected for its own bias
    near = seen & ~far  # within the noise: as a group, less the null mean of a deviation that stayed near
    rare = ~seen & ~outside  # seldom seen: as a group, less the exact null mean deviation
    d_far = _invert_mad(dev[far], s[far]).sum()
    d_near = max(0.0, float((dev[near] - _NEAR_MEAN * s[near]).sum()))
    d_rare = max(0.0, dev[rare].sum() - binomial_mad(n, p[rare]).sum() / n)
    return float(min(1.0, 0.5 * (d_far + d_near + d_rare + emp[outside].sum())))


def tv_interval(counts, probs, alpha: float = 0.01, method: str = "auto", seed: int = SPLIT_SEED) -> TVInterval:
    """Estimate ``TV(r, p)`` of the law behind ``counts`` with an interval at confidence ``1 - alpha``.

    Parameters
    ----------
    counts : array of int
        Multinomial counts of n independent draws from the sampled law r.
    probs : array of float
        The target law p, same shape.
    alpha : float
        The interval misses with probability at most alpha (both ends together). For a family of m
        intervals that must hold at once, pass ``alpha / m`` (Bonferroni).
    method : {"auto", "sets", "mcdiarmid"}
        "auto": "sets" up to :data:`MAX_SET_CELLS` cells, else "mcdiarmid" (module docstring).
    seed : int
        Seed of the random halves of the "mcdiarmid" lower bound.

    Returns
    -------
    TVInterval
        Valid at every n and V: exact binomial tails and a bounded-difference inequality, no
        asymptotics. The upper end is also a certificate: ``TV(r, p) <= upper`` at confidence 1 - alpha.
    """
    c = as_counts(counts)
    p = as_probs(probs)
    same_shape(c, p, ("counts", "probs"))
    alpha = check_level(alpha)
    if c.ndim != 1:
        raise ValueError(f"counts must be one law's cells (1-d), got shape {c.shape}")
    if method == "auto":
        method = "sets" if c.size <= MAX_SET_CELLS else "mcdiarmid"
    if method not in ("sets", "mcdiarmid"):
        raise ValueError(f"unknown method {method!r}; use 'auto', 'sets' or 'mcdiarmid'")
    if method == "sets" and c.size > MAX_SET_CELLS:
        raise ValueError(f"method 'sets' enumerates 2^(V-1) sets; V = {c.size} > {MAX_SET_CELLS}: use 'mcdiarmid'")
    n = int(c.sum())
    if n == 0:
        return TVInterval(float("nan"), 0.0, 1.0, float("nan"), 0, method, 1 - alpha)
    plugin = 0.5 * float(np.abs(c / n - p).sum())
    estimate = tv_estimate(c, p)
    if method == "sets":
        if c.size == 1:
            return TVInterval(0.0, 0.0, 0.0, 0.0, n, method, 1 - alpha)
        masks = _set_masks(c.size)
        x, pa = masks @ c, masks @ p
        lo, hi = _clopper_pearson(x, n, alpha / masks.shape[0])
        # each set and its complement: r(A) - p(A) and (1 - r(A)) - (1 - p(A)) = p(A) - r(A)
        upper = max(float(np.max(hi - pa)), float(np.max(pa - lo)))
        lower = max(0.0, float(np.max(lo - pa)), float(np.max(pa - hi)))
    else:
        upper = plugin + float(np.sqrt(np.log(2.0 / alpha) / (2.0 * n)))
        lower = 0.0
        if n >= 2:
            rng = np.random.default_rng(seed)
            first = rng.multivariate_hypergeometric(c, n // 2)
            second = c - first
            chosen = first / (n // 2) > p
            n2 = n - n // 2
            lo2, _ = _clopper_pearson(second[chosen].sum(), n2, alpha)  # one-sided at alpha / 2
            lower = max(0.0, float(lo2) - float(p[chosen].sum()))
    upper = min(1.0, upper)
    return TVInterval(estimate, min(lower, upper), upper, plugin, n, method, 1 - alpha)


def kl_estimate(counts, probs, tv: TVInterval | None = None) -> KLEstimate:
    """``KL(r || p)``: the plug-in less its null bias, where estimable, and Pinsker's lower bound from ``tv``.

    The estimate is NaN where fewer than ten draws a cell of p's support were made (the bias
    correction needs ``n >> cells``) and inf where a count falls outside p's support.
    """
    c = as_counts(counts)
    p = as_probs(probs)
    same_shape(c, p, ("counts", "probs"))
    n = int(c.sum())
    lower = 2.0 * tv.lower**2 if tv is not None else 0.0
    if n == 0:
        return KLEstimate(float("nan"), lower)
    if np.any(c[p == 0] > 0):
        return KLEstimate(float("inf"), lower)
    cells = int(np.count_nonzero(p))
    if n < 10 * cells:
        return KLEstimate(float("nan"), lower)
    emp = c / n
    nz = c > 0
    kl = float(np.sum(emp[nz] * np.log(emp[nz] / p[nz]))) - (cells - 1) / (2.0 * n)
    return KLEstimate(kl, lower)


def certify(intervals: Sequence[TVInterval], tolerance: float) -> Certificate:
    """Read a family of intervals (made to hold at once) against ``tolerance``: an equivalence verdict.

    "within" when every upper end is at or below the tolerance: with the family's confidence, every law
    is within TV ``tolerance`` of its target (the two one-sided tests of Wellek 2010, read on
    simultaneous intervals). "beyond" when some lower end is above it. Otherwise "undecided", with
    ``growth``: an interval's half-width above its estimate shrinks as ``1 / sqrt(n)`` (both the
    plug-in's noise and the concentration term do), so ``((upper - estimate) / (tolerance -
    estimate))^2`` times the draws would bring its upper end to the tolerance, if the estimate held.
    """
    tolerance = float(tolerance)
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must lie strictly between 0 and 1 (a total variation), got {tolerance}")
    if not intervals:
        raise ValueError("nothing to certify: no intervals were made (no position law was counted)")
    lowers = np.array([i.lower for i in intervals])
    uppers = np.array([i.upper for i in intervals])
    if np.any(lowers > tolerance):
        return Certificate("beyond", tolerance, 1.0, int(np.argmax(lowers)))
    if np.all(uppers <= tolerance):
        return Certificate("within", tolerance, 1.0, int(np.argmax(uppers)))
    growth, worst = 1.0, int(np.argmax(uppers))
    for i, r in enumerate(intervals):
        if r.upper <= tolerance:
            continue
        est = r.estimate if np.isfinite(r.estimate) else r.plugin
        g = float("inf") if est >= tolerance else ((r.upper - est) / (tolerance - est)) ** 2
        if g > growth:
            growth, worst = g, i
    return Certificate("undecided", tolerance, growth, worst)


def sequences_to_certify(probs, tolerance: float, alpha: float = 0.01, power: float = 0.8, method: str = "auto",
                         n_max: int = 1 << 34, seed: int = 0) -> int:
    """The draws at which a law equal to ``probs`` is certified within ``tolerance`` with probability at least
    ``power``, its intervals made at level ``alpha`` (already divided among a family): a power calculation
    for the certificate.

    "mcdiarmid": the upper end ``T + s(alpha / 2)`` stays at or below ``E_p T + s(1 - power) + s(alpha / 2)``
    with probability ``power`` (McDiarmid again; ``s(x) = sqrt(log(1 / x) / 2n)`` and ``E_p T`` exact), a
    proven bound. "sets": the ``power`` quantile of the upper end over 400 simulated samples (seeded), as
    the upper end has no closed form there. Returns ``n_max + 1`` when even ``n_max`` draws would not do.
    """
    p = as_probs(probs)
    alpha = check_level(alpha)
    power = check_level(power, "power")
    if method == "auto":
        method = "sets" if p.size <= MAX_SET_CELLS else "mcdiarmid"
    if method == "sets":
        masks = _set_masks(p.size)
        pa = masks @ p

    def upper(n: int) -> float:
        if method == "sets":
            x = np.random.default_rng(seed).multinomial(n, p, size=400) @ masks.T
            lo, hi = _clopper_pearson(x, n, alpha / masks.shape[0])
            ups = np.maximum(np.max(hi - pa, axis=1), np.max(pa - lo, axis=1))
            return float(np.quantile(ups, power))
        s = lambda a: np.sqrt(np.log(1.0 / a) / (2.0 * n))  # noqa: E731
        return float(binomial_mad(n, p).sum() / (2.0 * n)) + s(1.0 - power) + s(alpha / 2.0)

    n = 16
    while upper(n) > tolerance:
        n *= 2
        if n > n_max:
            return n_max + 1
    lo, hi = n // 2, n
    while hi - lo > max(1, lo // 100):  # within 1 %
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if upper(mid) <= tolerance else (mid, hi)
    return int(hi)
