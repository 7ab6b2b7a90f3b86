"""Measure the suite itself: false alarms, power against theory, peers' criteria.

* :func:`calibrate` runs the battery ``runs`` times with independent seeds. For a lossless
  scheme it reports the false-alarm rate (Clopper-Pearson interval, binomial test against
  alpha) and a KS test of the pooled first-position p-values; for a negative control the
  detection rate next to a prediction from the control's exact deviation.
* :func:`peer_comparison` applies the acceptance criteria other projects use in their own
  tests, re-derived from their published descriptions, to the same samples as specsample's
  chi-square test, and reports each criterion's detection rate.
* :func:`min_detectable_deviation` finds by bisection the smallest perturbation of p that
  the chi-square test detects 99% of the time at a given sample size, next to the power
  function's prediction.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Callable, Optional

import numpy as np

import stats

from .engine import lanes as engine
from .battery.suite import _case_seed, _draft_lengths, verify
from .laws.exact import EXACT, exact_output
from .models.pairs import make_pair, replicate
from .schemes import get_factory, make_scheme


@dataclasses.dataclass
class CalibrationResult:
    scheme: str
    lossless: bool
    runs: int
    rejections: int
    rate: float
    low: float
    high: float
    alpha: float
    binomial_pvalue: float  # lossless: H0 rate <= alpha
    uniformity_pvalue: float  # lossless: KS of pooled position[0] p-values
    predicted_detection: float  # controls: lower bound from exact first-token deviations
    seconds: float

    def summary(self) -> str:
        if self.lossless:
            return (f"{self.scheme}: false alarms {self.rejections}/{self.runs} = {self.rate:.3f} "
                    f"(95% CI {self.low:.3f}-{self.high:.3f}) at alpha = {self.alpha:g}; "
                    f"binomial p (rate <= alpha) = {self.binomial_pvalue:.3g}; "
                    f"KS uniformity of position[0] p-values p = {self.uniformity_pvalue:.3g}")
        pred = "n/a" if np.isnan(self.predicted_detection) else f"{self.predicted_detection:.3f}"
        return (f"{self.scheme}: detected {self.rejections}/{self.runs} = {self.rate:.3f} "
                f"(95% CI {self.low:.3f}-{self.high:.3f}); predicted >= {pred} from the exact first-token "
                f"deviation (chi-square power at the Holm level)")


def _predicted_detection(report, scheme_name: str) -> float:
    """Lower bound on P(battery rejects): some case's position[0] test rejects at alpha/m."""
    if scheme_name not in EXACT:
        return float("nan")
    m = sum(1 for c in report.cases for t in c.tests if not t.hard)
    level = report.alpha / m
    miss = 1.0
    for c in report.cases:
        if c.model != "context-free" or c.vocab > 64:
            continue
        pair = make_pair(c.family, _case_seed(report.seed, c.name), c.vocab)
        law = exact_output(scheme_name, pair.target, pair.draft, c.k, 1)
        p = np.asarray(pair.target.table[0])
        if np.count_nonzero(p) < 2:
            continue  # a point-mass target: only the support check applies
        if np.any(law[p == 0] > 0):
            # emits a zero-probability token: the hard support check fails w.p. 1 - (1 - mass)^N
            miss *= (1 - law[p == 0].sum()) ** c.sequences
            continue
        miss *= 1.0 - stats.chisquare_power(p, law, c.sequences, level).power
    return 1.0 - miss


def calibrate(scheme="standard", runs: int = 100, *, budget="quick", seed: int = 1000, alpha: float = 0.01,
              cases: Optional[str] = None, k=(4,), progress: Optional[Callable[[int, int, str], None]] = None
              ) -> CalibrationResult:
    """Run the battery ``runs`` times with seeds ``seed, seed + 1, ...`` and measure its error rates.

    ``k`` takes draft lengths as :func:`specsample.verify` does; ``progress(done, total, label)``
    is called after each run (the command line prints it with an ETA).
    """
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    t0 = time.perf_counter()
    factory = get_factory(scheme)
    probe = make_scheme(factory, _draft_lengths(k)[0])
    fails, pos0 = 0, []
    predicted = float("nan")
    for r in range(runs):
        rep = verify(factory, budget=budget, seed=seed + r, alpha=alpha, cases=cases, k=k)
        fails += not rep.passed
        # continuous p-values only: point masses (one-hot p) and Monte Carlo p-values are discrete
        pos0 += [t.pvalue for c in rep.cases for t in c.tests
                 if t.name == "position[0]" and t.dof > 0 and "asymptotic" in t.detail]
        if r == 0 and not probe.lossless and isinstance(scheme, str):
            predicted = _predicted_detection(rep, scheme)
        if progress:
            progress(r + 1, runs, f"seed {seed + r}: {'pass' if rep.passed else 'FAIL'}")
    ci = stats.rejection_rate(fails, runs, alpha)
    uni = stats.uniformity_test(pos0).pvalue if probe.lossless and pos0 else float("nan")
    return CalibrationResult(probe.name, probe.lossless, runs, fails, ci.rate, ci.low, ci.high, alpha,
                             ci.pvalue if probe.lossless else float("nan"), uni, predicted,
                             time.perf_counter() - t0)


# --- peers' criteria ----------------------------------------------------------------------

VLLM_SIZES = (10, 100, 1000, 10000, 100000)


def criterion_l2_convergence(counts_by_size: list, p: np.ndarray, rng, n_refs: int = 10) -> bool:
    """Pass if the L2 distance to p shrinks over the sample sizes more than 20x faster than the
    distance to random reference distributions (vLLM's rejection-sampler test, as described)."""
    emp = [c / c.sum() for c in counts_by_size]
    d_target = np.array([np.linalg.norm(e - p) for e in emp])
    refs = rng.dirichlet(np.ones(p.size), size=n_refs)
    d_ref = np.array([np.mean([np.linalg.norm(e - r) for r in refs]) for e in emp])
    return bool(d_target[0] / max(d_target[-1], 1e-300) > 20 * d_ref[0] / d_ref[-1])


def criterion_six_sigma(counts: np.ndarray, p: np.ndarray) -> bool:
    """Pass if every bin is within 6 standard errors + 5 of its expectation (TileOPs, as described)."""
    n = counts.sum()
    return bool(np.all(np.abs(counts - n * p) <= 6 * np.sqrt(n * p * (1 - p)) + 5))


def criterion_kl_gap(counts: np.ndarray, p: np.ndarray, rng) -> bool:
    """Pass if |KL(p || spec) - KL(p || plain sampling)| < 0.01 on equal samples (TensorRT-LLM, as described)."""
    n = counts.sum()
    plain = rng.multinomial(n, p)
    eps = 1e-10  # empirical zeros: KL(p || .) is infinite without smoothing

    def kl(c):
        e = np.maximum(c / n, eps)
        return float(np.sum(np.where(p > 0, p * np.log(p / e), 0.0)))

    return bool(abs(kl(counts) - kl(plain)) < 0.01)


def criterion_specsample(counts: np.ndarray, p: np.ndarray, alpha: float = 0.01) -> bool:
    """specsample's test on the same counts: support check and pooled chi-square at ``alpha``."""
    return bool(stats.goodness_of_fit(counts, p).pvalue >= alpha)


def peer_comparison(schemes_: list, *, reps: int = 20, vocab: int = 10, k: int = 4, seed: int = 0,
                    sizes=VLLM_SIZES) -> list:
    """Detection rate of each criterion (fraction of repetitions failing it) per scheme.

    Every criterion sees the first-token counts of the same runs: ``reps`` independent runs
    at each sample size of ``sizes`` (the last one, 100k by default, for the single-size
    criteria), on one Dirichlet pair.
    """
    pair = make_pair("dirichlet", seed, vocab)
    p = np.asarray(pair.target.table[0])
    batch = replicate(pair, reps)
    target, draft = batch.target, batch.draft
    rows = []
    for name in schemes_:
        scheme = make_scheme(name, k)
        by_size = []
        for i, n in enumerate(sizes):
            lanes = min(n, 1000)  # n is a multiple of it: exactly n samples per run
            c = engine.run(scheme, target, draft, sequences=n, length=1, seed=seed + 7 * i, lanes=lanes, per_lane=1)
            by_size.append(c.position[:, 0])
        rng = np.random.default_rng(seed)
        last = by_size[-1]
        detect = {
            "l2-convergence (vLLM)": np.mean([not criterion_l2_convergence([b[r] for b in by_size], p, rng)
                                              for r in range(reps)]),
            "6 SE + 5 per bin (TileOPs)": np.mean([not criterion_six_sigma(last[r], p) for r in range(reps)]),
            "KL gap < 0.01 (TensorRT-LLM)": np.mean([not criterion_kl_gap(last[r], p, rng) for r in range(reps)]),
            "specsample chi-square": np.mean([not criterion_specsample(last[r], p) for r in range(reps)]),
        }
        law = exact_output(name, pair.target, pair.draft, k, 1) if name in EXACT else None
        tv = 0.5 * float(np.abs(law - p).sum()) if law is not None else float("nan")
        rows.append(dict(scheme=name, first_token_tv=tv, samples=int(last[0].sum()), reps=reps,
                         detection={key: float(v) for key, v in detect.items()}))
    return rows


def _smallest_in_unit(holds, steps: int) -> float:
    """Bisection on [0, 1] for the smallest e where the monotone predicate ``holds(e)`` is true
    (the upper end of the last bracket)."""
    lo, hi = 0.0, 1.0
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if holds(mid) else (mid, hi)
    return hi


def min_detectable_deviation(n: int, *, vocab: int = 8, alpha: float = 0.01, power: float = 0.99,
                             reps: int = 400, seed: int = 0) -> dict:
    """Smallest TV of a mixture perturbation ``(1 - e) p + e r`` that the pooled chi-square
    detects with rate >= ``power`` at ``n`` samples, by bisection on ``e`` (numpy
    simulation), next to the power function's prediction for the same alternative and
    its worst case over all alternatives (:func:`stats.min_detectable_tv`)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(vocab))
    r = rng.dirichlet(np.ones(vocab))

    def rate(e):
        alt = (1 - e) * p + e * r
        sims = rng.multinomial(n, alt, size=reps)
        return np.mean([stats.goodness_of_fit(s, p).pvalue < alpha for s in sims])

    def predicted(e):
        return stats.chisquare_power(p, (1 - e) * p + e * r, n, alpha).power

    tv_per_e = 0.5 * float(np.abs(r - p).sum())
    observed_e = _smallest_in_unit(lambda e: rate(e) >= power, 14)
    predicted_e = _smallest_in_unit(lambda e: predicted(e) >= power, 50)
    return dict(n=n, vocab=vocab, alpha=alpha, power=power, observed_tv=observed_e * tv_per_e,
                predicted_tv=predicted_e * tv_per_e,
                worst_case_tv=stats.min_detectable_tv(n, vocab - 1, alpha, power).tv)


def to_json(obj) -> str:
    return json.dumps(obj, indent=2, default=lambda o: dataclasses.asdict(o) if dataclasses.is_dataclass(o) else str(o))
