"""How far from lossless a run is: every position (and stage) law a report counted, as a distance with an interval.

:func:`measure` reads a :class:`~specsample.battery.report.Report` (any run ``verify`` makes: a JAX
scheme's battery, a host sampler, a whole loop) and turns each position law it kept (the counts of
``position[t]`` against the target's law there, and each stage law the stage pass kept with its counts:
the tokens at a stage's farthest slot against the law they must follow there) into a :class:`PositionDistance`: the bias-corrected TV
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
    stage: str = ""  # a stage of the round (its law at slot ``position``) rather than a position of the output

    @property
    def law(self) -> str:
        """``position[3]``, or ``rejection[slot 0]`` for a stage's law."""
        return f"{self.stage}[slot {self.position}]" if self.stage else f"position[{self.position}]"

    def to_dict(self) -> dict:
        out = {"case": self.case, "law": self.law, "stage": self.stage or None, "position": self.position,
               "n": self.n, "vocab": self.vocab,
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
    def positions(self) -> list:
        """The output's laws (the rows that are not a stage's): what the certificate and the verdict read."""
        return [r for r in self.rows if not r.stage]

    @property
    def bound(self) -> float:
        """The certificate the run makes without a tolerance: every position's law within this TV of p."""
        return max((r.tv.upper for r in self.positions), default=float("nan"))

    @property
    def worst(self) -> Optional[PositionDistance]:
        rows = self.positions
        return max(rows, key=lambda r: r.tv.upper) if rows else None

    @property
    def exit_code(self) -> int:
        """0 within the tolerance (or no tolerance given), 1 beyond it, 3 undecided at this budget."""
        return 0 if self.certificate is None else VERDICT_EXIT[self.certificate.verdict]

    def sequences_needed(self) -> Optional[int]:
        """For an undecided certificate: about how many sequences the blocking law would need (inf: none)."""
        c = self.certificate
        if c is None or c.verdict != "undecided":
            return None
        row = self.positions[c.worst]
        return None if not math.isfinite(c.growth) else int(math.ceil(row.n * c.growth))

    def to_dict(self) -> dict:
        c = self.certificate
        return {
            "scheme": self.scheme, "budget": self.budget, "seed": self.seed, "alpha": self.alpha,
            "simultaneous": f"Bonferroni over {len(self.rows)} laws (positions and stages), each interval at alpha / "
                            f"{len(self.rows)}",
            "bound": _finite(self.bound), "tokens_per_round": _finite(self.tokens_per_round),
            "certificate": None if c is None else {
                "verdict": c.verdict, "tolerance": c.tolerance, "growth": _finite(c.growth),
                "sequences_needed": self.sequences_needed(),
                "law": f"{self.positions[c.worst].case} {self.positions[c.worst].law}"},
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


def stage_laws(report) -> list:
    """``(case, stage, slot, counts, probs)`` of every stage law the report's stage passes kept with their
    counts: a token stage's farthest slot where its tokens follow one law (:class:`StageResult.counts`)."""
    out = []
    for c in report.cases:
        for s in getattr(c, "stages", None) or []:
            counts = getattr(s, "counts", None)
            if counts is not None and s.expected is not None and s.slot is not None and np.sum(counts) > 0:
                out.append((c, s.stage, int(s.slot), np.ravel(np.asarray(counts)), np.ravel(np.asarray(s.expected))))
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
        A TV: the certificate reads the position laws against it (:func:`stats.distance.certify`); the
        stage laws share the family's alpha but not the verdict (they say where a distance comes from).
    exact : callable, optional
        ``exact(case_result) -> array [L, V] or None``: the exact output law of the case's positions
        (:func:`specsample.measure.exact.exact_laws`); its distance from the target's law is printed
        beside the estimate.
    """
    alpha = report.alpha if alpha is None else float(alpha)
    laws = position_laws(report)
    staged = stage_laws(report)
    m = max(1, len(laws) + len(staged))
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
    for c, stage, slot, counts, probs in staged:  # each stage's own law, where the stage pass kept its counts
        probs = probs / probs.sum()
        tv = distance.tv_interval(counts, probs, alpha / m)
        rows.append(PositionDistance(c.name, slot, int(counts.sum()), int(counts.size), tv,
                                     distance.kl_estimate(counts, probs, tv), None, stage))
    # the verdict reads the output's laws; a stage's law says where a distance comes from (and, with few tokens
    # at a slot, is often too wide to certify), so it shares the family's alpha but not the verdict
    outputs = [r.tv for r in rows if not r.stage]
    cert = distance.certify(outputs, tolerance) if tolerance is not None and outputs else None
    tpr = [c.tokens_per_round for c in report.cases if math.isfinite(getattr(c, "tokens_per_round", float("nan")))]
    return Measurement(scheme or report.scheme, report.budget, report.seed, alpha, rows, cert,
                       float(np.mean(tpr)) if tpr else float("nan"), report)
