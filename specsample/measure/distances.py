"""How far from lossless a run is: every position law a report counted, as a distance from p with an interval.

:func:`measure` reads a :class:`~specsample.battery.report.Report` (any run ``verify`` makes: a JAX
scheme's battery, a host sampler, a whole loop) and turns each position law it kept (the counts of
``position[t]`` against the target's law there) into a :class:`PositionDistance`: the bias-corrected TV
estimate, an interval that holds simultaneously over the run's laws (Bonferroni: each at ``alpha /
m``), KL where the support allows, and the exact distance where :mod:`.exact` can compute the law. A
tolerance turns the family into an equivalence verdict (:func:`stats.distance.certify`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import numpy as np

from stats import distance

VERDICT_EXIT = {"within": 0, "beyond": 1, "undecided": 3}


@dataclasses.dataclass
class PositionDistance:
    """The distance of one position's law from the target's: ``case``, ``position`` (t of ``position[t]``)."""

    case: str
    position: int
    n: int
    vocab: int
    tv: distance.TVInterval
    kl: distance.KLEstimate
    exact: Optional[float] = None  # TV of the exact output law from p, where it can be computed

    def to_dict(self) -> dict:
        out = {"case": self.case, "position": self.position, "n": self.n, "vocab": self.vocab,
               **{f"tv_{k}": v for k, v in self.tv._asdict().items() if k not in ("n",)},
               "kl_estimate": self.kl.estimate, "kl_lower": self.kl.lower, "tv_exact": self.exact}
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


@dataclasses.dataclass
class Measurement:
    """A run's distances: ``rows`` (one per position law), the simultaneous ``confidence`` and, with a
    tolerance, the ``certificate``. ``tokens_per_round``: the run's mean over cases (NaN when unknown)."""

    scheme: str
    budget: str
    seed: int
    alpha: float
    rows: list
    certificate: Optional[distance.Certificate]
    tokens_per_round: float
    report: object = dataclasses.field(repr=False, default=None)

    @property
    def confidence(self) -> float:
        return 1.0 - self.alpha

    @property
    def bound(self) -> float:
        """The certificate the run makes without a tolerance: every position's law within this TV of p."""
        return max((r.tv.upper for r in self.rows), default=float("nan"))

    @property
    def worst(self) -> Optional[PositionDistance]:
        return max(self.rows, key=lambda r: r.tv.upper) if self.rows else None

    @property
    def exit_code(self) -> int:
        """0 within the tolerance (or no tolerance given), 1 beyond it, 3 undecided at this budget."""
        return 0 if self.certificate is None else VERDICT_EXIT[self.certificate.verdict]

    def sequences_needed(self) -> Optional[int]:
        """For an undecided certificate: about how many sequences the blocking law would need (inf: none)."""
        c = self.certificate
        if c is None or c.verdict != "undecided":
            return None
        row = self.rows[c.worst]
        return None if not math.isfinite(c.growth) else int(math.ceil(row.n * c.growth))

    def to_dict(self) -> dict:
        c = self.certificate
        return {
            "scheme": self.scheme, "budget": self.budget, "seed": self.seed, "alpha": self.alpha,
            "simultaneous": f"Bonferroni over {len(self.rows)} position laws, each interval at alpha / {len(self.rows)}",
            "bound": _finite(self.bound), "tokens_per_round": _finite(self.tokens_per_round),
            "certificate": None if c is None else {
                "verdict": c.verdict, "tolerance": c.tolerance, "growth": _finite(c.growth),
                "sequences_needed": self.sequences_needed(),
                "law": f"{self.rows[c.worst].case} position[{self.rows[c.worst].position}]"},
            "exit_code": self.exit_code,
            "laws": [r.to_dict() for r in self.rows],
        }


def _finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def position_laws(report) -> list:
    """``(case, t, counts, probs)`` of every position law the report kept, in report order."""
    out = []
    for c in report.cases:
        for t in c.tests:
            if t.law is not None and t.name.startswith("position["):
                counts, probs = (np.ravel(np.asarray(a)) for a in t.law)
                out.append((c, int(t.name[len("position["):-1]), counts, probs))
    return out


def measure(report, *, alpha: Optional[float] = None, tolerance: Optional[float] = None,
            exact: Optional[Callable] = None, scheme: str = "") -> Measurement:
    """The distance of each position law of ``report`` from its target, with simultaneous intervals.

    Parameters
    ----------
    report : Report
        What ``verify`` returned (its position tests keep their counts and target laws).
    alpha : float, optional
        One minus the family's confidence (default: the report's alpha). Every interval is made at
        ``alpha / m`` for the m laws, so all hold at once with probability at least ``1 - alpha``.
    tolerance : float, optional
        A TV: the certificate reads the family against it (:func:`stats.distance.certify`).
    exact : callable, optional
        ``exact(case_result) -> array [L, V] or None``: the exact output law of the case's positions
        (:func:`specsample.measure.exact.exact_laws`); its distance from the target's law is printed
        beside the estimate.
    """
    alpha = report.alpha if alpha is None else float(alpha)
    laws = position_laws(report)
    m = max(1, len(laws))
    rows, exact_cache = [], {}
    for c, t, counts, probs in laws:
        probs = probs / probs.sum()
        tv = distance.tv_interval(counts, probs, alpha / m)
        ex = None
        if exact is not None:
            if c.name not in exact_cache:
                exact_cache[c.name] = exact(c)
            law = exact_cache[c.name]
            if law is not None and t < len(law):
                ex = 0.5 * float(np.abs(np.asarray(law[t]) - probs).sum())
        rows.append(PositionDistance(c.name, t, int(counts.sum()), int(counts.size), tv,
                                     distance.kl_estimate(counts, probs, tv), ex))
    cert = distance.certify([r.tv for r in rows], tolerance) if tolerance is not None and rows else None
    tpr = [c.tokens_per_round for c in report.cases if math.isfinite(getattr(c, "tokens_per_round", float("nan")))]
    return Measurement(scheme or report.scheme, report.budget, report.seed, alpha, rows, cert,
                       float(np.mean(tpr)) if tpr else float("nan"), report)
