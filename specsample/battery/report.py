"""Results of a verification run: per-test, per-case, and the whole report."""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import re
import shutil
import textwrap
from typing import Optional

import numpy as np

import stats


@dataclasses.dataclass
class TestResult:
    """One statistical test of a case.

    ``hard`` tests (support, invalid tokens) are assertions: any violation fails the case
    whatever ``alpha`` is; they take no part in the multiple-testing correction.
    """

    name: str
    statistic: float
    pvalue: float
    dof: int = 0
    hard: bool = False
    detail: str = ""
    min_detectable_tv: Optional[float] = None
    adjusted: float = float("nan")
    rejected: bool = False
    reached: bool = True  # a hard check that controlled nothing (no draw, no edge reached) is not a pass
    # (observed counts, expected probabilities) of a position's law, for the HTML report's figures;
    # not in the JSON (it would grow with V x positions for every case)
    law: Optional[tuple] = dataclasses.field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "law"}


TOO_FEW = ("too few sequences for a claim about the token law: no test reaches a min detectable TV below 1 "
           "(the pooled chi-square pools too many tokens, or too few cells)")


@dataclasses.dataclass
class CaseResult:
    """Everything measured and tested for one case (one pair, or one sweep of pairs)."""

    name: str
    scheme: str
    family: str
    model: str
    vocab: int
    k: int
    length: int
    sequences: int
    rounds: int
    tests: list
    min_detectable_tv: float
    kl: float = float("nan")  # KL(empirical || p) of position 0, bias-corrected, nats
    acceptance_observed: float = float("nan")  # accepted drafts per tested draft
    acceptance_theory: float = float("nan")
    alpha: float = float("nan")  # neural pairs: E sum_x min(p, q) at each of the first L positions, averaged
    tokens_per_round: float = float("nan")
    pairs: int = 1
    seconds: float = 0.0
    min_tv_note: str = ""  # when the min TV does not come from the first position: why, and from which tests
    stages: list = dataclasses.field(default_factory=list)  # diagnosis.StageResult of the stage pass, if any
    # what the run planned, where a time bound (or a checkpoint's) could cut it: sequences, and the min TV
    # they would have given (0 and NaN: no plan that could be cut)
    sequences_planned: int = 0
    min_detectable_tv_planned: float = float("nan")

    def __post_init__(self):
        # The case's min TV is that of position 0's law. When that pools to fewer than two cells
        # (a concentrated first token, or few sequences), later positions and the joint may still
        # have soft tests: the case then states the largest of their min TVs, and says so.
        if self.min_tv_note or not math.isnan(self.min_detectable_tv):
            return
        soft = [t for t in self.tests if not t.hard]
        # a test's min TV: None where it does not apply (a point-mass law), NaN where too few sequences
        sized = [t for t in soft if t.min_detectable_tv is not None and np.isfinite(t.min_detectable_tv)]
        unsized = [t.name for t in soft if t.min_detectable_tv is not None and not np.isfinite(t.min_detectable_tv)]
        if sized and unsized:
            self.min_detectable_tv = float(max(t.min_detectable_tv for t in sized))
            self.min_tv_note = (f"largest min TV of {', '.join(t.name for t in sized)}; {', '.join(unsized)} "
                                f"had too few sequences for a token-law claim (tested, no power figure)")
        elif not soft:
            self.min_tv_note = "hard checks only"
        elif unsized and not sized:
            self.min_tv_note = TOO_FEW

    @property
    def passed(self) -> bool:
        return not any(t.rejected for t in self.tests)

    @property
    def not_reached(self) -> list:
        """The case's hard checks when *none* of them controlled anything (the sampler draws in a way
        none can reach): then the case is "not reached", never a pass. A check that did not reach
        while another did says so in its own detail (and ``reached`` in the JSON)."""
        hard = [t for t in self.tests if t.hard]
        return [t.name for t in hard] if hard and not any(t.reached for t in hard) else []

    @property
    def boundary_unreached(self) -> list:
        """The case's boundary checks (forced uniforms) when none of them could have fired, though the
        case's other checks did: its statistics stand, but a ``u <= p / q`` was not tested."""
        bound = [t for t in self.tests if t.hard and t.name.startswith("boundary-")]
        return [t.name for t in bound] if bound and not any(t.reached for t in bound) and not self.not_reached \
            else []

    @property
    def short_of_plan(self) -> bool:
        """The case ran fewer sequences than it planned (a time bound cut it): its claim is weaker than planned."""
        return 0 < self.sequences < self.sequences_planned

    @property
    def verdict(self) -> str:
        if not self.passed:
            return "FAIL"
        if self.not_reached:
            return "not reached"
        if self.short_of_plan:
            return "pass, short"  # never a plain pass: the run did not do what its claim was planned on
        return "pass°" if self.boundary_unreached else "pass"

    @property
    def worst(self) -> Optional[TestResult]:
        """The test closest to rejection: a failed hard check first, else the smallest p-value."""
        hard = [t for t in self.tests if t.hard and t.rejected]
        soft = [t for t in self.tests if not t.hard]
        if hard or not soft:  # a case of hard checks only shows its first one
            return hard[0] if hard else (self.tests[0] if self.tests else None)
        return min(soft, key=lambda t: (_nan_last(t.adjusted), _nan_last(t.pvalue)))

    @property
    def rejected_stages(self) -> list:
        """The stages of the round whose own law was rejected (``stage:<name>`` tests), in round order."""
        # a stage tested in two orders (an audit's PIT by token id and by rank: "bonus[rank]") is one stage
        names = [t.name.split(":", 1)[1].split("[", 1)[0] for t in self.tests if t.name.startswith("stage:")
                 and t.rejected]
        # a failed hard check that names the stage by the slot of its token (an audit's support check)
        names += [m.group(1) for t in self.tests if t.hard and t.rejected
                  for m in [re.search(r"\(stage: (\w+)\)", t.detail)] if m]
        return list(dict.fromkeys(names))

    @property
    def diagnosis(self) -> str:
        """Which stage of the round is broken, by how much and where, and which stages are consistent
        (empty when the case ran no stage pass)."""
        if not self.stages:
            return ""
        from .diagnosis import describe

        line = describe(self.stages, set(self.rejected_stages))
        if not self.passed and not self.rejected_stages:
            line = f"not localised: no stage deviates on its own ({line})"
        return line

    def test(self, name: str) -> TestResult:
        """The test called ``name`` (``"joint"``, ``"position[0]"``, ``"support"``, ...)."""
        for t in self.tests:
            if t.name == name:
                return t
        raise KeyError(f"case {self.name!r} has no test {name!r}; it has {', '.join(t.name for t in self.tests)}")

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("tests", "stages")}
        d = {k: _jsonable(v) for k, v in d.items()}
        d["passed"] = self.passed
        d["verdict"] = self.verdict
        d["short_of_plan"] = self.short_of_plan
        if self.stages:
            d["stages"] = [{k: _jsonable(v) for k, v in s._asdict().items()} for s in self.stages]
            d["diagnosis"] = self.diagnosis
        d["tests"] = [t.to_dict() for t in self.tests]
        return d


@dataclasses.dataclass
class Report:
    """A verification run: ``report.passed``, ``report.cases``, ``report.table()``, ``report.to_json()``."""

    scheme: str
    alpha: float
    seed: int
    budget: str
    cases: list
    seconds: float
    power: float
    engine: dict
    # how alpha is shared among the tests: "Holm" for a fixed-size run; an anytime monitor names its own
    multiplicity: str = "Holm"

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)

    @property
    def verdict(self) -> str:
        return "pass" if self.passed else "fail"

    def case(self, name: str) -> CaseResult:
        """The case called ``name`` (as ``specsample list`` prints it)."""
        for c in self.cases:
            if c.name == name:
                return c
        raise KeyError(f"no case {name!r} in this report; it has {', '.join(c.name for c in self.cases)}")

    @property
    def failed_cases(self) -> list:
        return [c for c in self.cases if not c.passed]

    @property
    def min_detectable_tv(self) -> float:
        """The weakest (largest) min detectable TV over the cases: what the claim covers."""
        vals = [c.min_detectable_tv for c in self.cases if np.isfinite(c.min_detectable_tv)]
        return max(vals) if vals else float("nan")

    @property
    def best_min_detectable_tv(self) -> float:
        vals = [c.min_detectable_tv for c in self.cases if np.isfinite(c.min_detectable_tv)]
        return min(vals) if vals else float("nan")

    def headline(self, width: int = 0) -> str:
        """The verdict in words, wrapped to ``width`` columns (0: the terminal's, at most 100)."""
        n_tests = sum(len(c.tests) for c in self.cases)
        rounds = sum(c.rounds for c in self.cases)
        # an end-to-end run counts generated sequences (a black box's rounds are not seen)
        work = f"{rounds:.3g} rounds" if rounds else f"{sum(c.sequences for c in self.cases):.3g} sequences"
        if self.passed:
            text = (
                f"PASS  {self.scheme}: no deviation from the target found in {len(self.cases)} cases, "
                f"{n_tests} tests, {work} ({self.multiplicity} family-wise alpha = {self.alpha:g}). "
            )
            if any(np.isfinite(c.min_detectable_tv) for c in self.cases):
                text += (f"Each case would have detected any deviation of a token's law with total variation >= "
                         f"its min detectable TV ({self.best_min_detectable_tv:.2g} to {self.min_detectable_tv:.2g}) "
                         f"with probability >= {self.power:g}.")
            unreached = [f"{c.name} ({', '.join(c.not_reached or c.boundary_unreached)})" for c in self.cases
                         if c.not_reached or c.boundary_unreached]
            if unreached:
                text = text.rstrip() + (f" NOT REACHED: {len(unreached)} case{'s' * (len(unreached) != 1)} "
                                        f"({', '.join(unreached[:3])}{' ...' if len(unreached) > 3 else ''}): those "
                                        f"checks controlled nothing in this sampler, so they say nothing of it.")
                why = self.first_unreached()
                if why:  # what the check says to do about it (mask the target, turn compilation off, ...)
                    text += f" Why, and what to do: {why}"
            short = [c for c in self.cases if c.short_of_plan]
            if short:
                text = "PASS, SHORT OF PLAN" + text[len("PASS"):]
                c = short[0]
                planned = "" if math.isnan(c.min_detectable_tv_planned) else \
                    f" (min detectable TV {_tv(c.min_detectable_tv)} where {_tv(c.min_detectable_tv_planned)} was planned)"
                text = text.rstrip() + (f" SHORT OF PLAN: {len(short)} case{'s' * (len(short) != 1)} ran fewer sequences "
                                        f"than planned; {c.name}: {c.sequences:,} of {c.sequences_planned:,}{planned}. "
                                        f"Give more time (--time) to reach the planned claim.")
            few = [c.name for c in self.cases if c.min_tv_note == TOO_FEW]
            if few:
                text = text.rstrip() + (f" WARNING: {len(few)} case{'s' * (len(few) != 1)} ({', '.join(few[:3])}"
                         f"{' ...' if len(few) > 3 else ''}) had too few sequences for any power figure: a pass "
                         f"there says little; give a larger budget.")
        else:
            names = ", ".join(c.name for c in self.failed_cases[:6])
            more = "" if len(self.failed_cases) <= 6 else f" and {len(self.failed_cases) - 6} more"
            text = (
                f"FAIL  {self.scheme}: {self.what_failed()} in {len(self.failed_cases)} of "
                f"{len(self.cases)} cases ({names}{more}) at {self.multiplicity} family-wise alpha = {self.alpha:g}. "
                f"Evidence: {self.evidence()}."
            )
            first = self.first_violation()
            if first:
                text += f" First violation: {first}."
            if self.narrow:
                worst = min(t.adjusted for c in self.failed_cases for t in c.tests if t.rejected)
                text += (f" NARROW: the smallest adjusted p is {worst:.2g}, within ten times alpha; a correct "
                         f"sampler fails a run this way about {self.alpha:g} of the time: confirm with an "
                         f"independent run (a new seed) before filing a bug.")
            stages = self.broken_stages()
            if stages:
                text += " Broken stage: " + ", ".join(f"{s} (in {n} case{'s' * (n != 1)})" for s, n in stages.items()) + "."
            elif any(c.stages for c in self.failed_cases):
                text += " Broken stage: not localised (every stage tested is consistent on its own)."

        return "\n".join(textwrap.wrap(text, _width(width), subsequent_indent="      "))

    def what_failed(self) -> str:
        """What the failing tests say, in words: the output law first, then hard checks, then acceptance."""
        kinds = {_family(t) for c in self.failed_cases for t in c.tests if t.rejected}
        for kind, words in (("output", "the output deviates from the target"), ("hard", "a hard check failed"),
                            ("acceptance", "the acceptance of drafts deviates from its law")):
            if kind in kinds:
                return words
        return "a stage of the round deviates from its own law"

    def first_unreached(self) -> str:
        """The first check that reached nothing, in its own words (case: test: detail), which say why and what
        would reach it; '' when every check reached something."""
        for c in self.cases:
            for t in c.tests:
                if t.hard and not t.reached and not t.rejected:
                    detail = t.detail.rstrip(".")
                    return f"{c.name}: {t.name}: {detail[:400]}{' ...' if len(detail) > 400 else ''}."
        return ""

    def first_violation(self) -> str:
        """The first failed hard check, as the check words it (case: test: detail), or ''."""
        for c in self.failed_cases:
            for t in c.tests:
                if t.hard and t.rejected:
                    return f"{c.name}: {t.name}: {t.detail.rstrip('.')}"
        return ""

    @property
    def narrow(self) -> bool:
        """A FAIL of soft tests only whose smallest adjusted p is within ten times alpha: a correct
        sampler produces one at a rate of about alpha, so it wants an independent confirmation."""
        rejected = [t for c in self.failed_cases for t in c.tests if t.rejected]
        return bool(rejected) and not any(t.hard for t in rejected) and \
            min(t.adjusted for t in rejected) >= self.alpha / 10

    def broken_stages(self) -> dict:
        """Stages whose own law was rejected, with the number of failing cases naming each, most first."""
        named: dict = {}
        for c in self.failed_cases:
            for stage in c.rejected_stages:
                named[stage] = named.get(stage, 0) + 1
        return dict(sorted(named.items(), key=lambda kv: -kv[1]))

    def diagnosis(self, width: int = 0, cases: int = 4) -> str:
        """The stage diagnosis of the first failing cases that have one, one wrapped paragraph each."""
        wrap = max(60, _width(width, cap=None) - 1)
        lines = []
        shown = [c for c in self.failed_cases if c.stages]
        for c in shown[:cases]:
            lines += textwrap.wrap(f"{c.name}: {c.diagnosis}", wrap, subsequent_indent="    ")
        if len(shown) > cases:
            lines.append(f"... and {len(shown) - cases} more cases (\"diagnosis\" in the JSON)")
        return "\n".join(lines)

    def evidence(self) -> str:
        """What kind of test rejected, and in how many cases: 'support violation (3 cases), joint (2 cases)'."""
        kinds: dict = {}
        positions: set = set()
        for c in self.failed_cases:
            for t in c.tests:
                if t.rejected and t.name.startswith("position["):
                    positions.add(int(t.name[9:-1]))
            for kind in dict.fromkeys(_kind(t) for t in c.tests if t.rejected):
                kinds[kind] = kinds.get(kind, 0) + 1
        hard = ("support violation", "invalid tokens or rounds")  # assertions first, then by cases
        order = sorted(kinds, key=lambda k: (k not in hard, -kinds[k]))
        label = {"position marginals": f"position marginals (positions {', '.join(map(str, sorted(positions)))})"}
        return ", ".join(f"{label.get(k, k)} in {kinds[k]} case{'s' * (kinds[k] != 1)}" for k in order)

    def table(self, width: int = 0) -> str:
        """One row per case, fitted to ``width`` columns (0: the terminal's width).

        Under 100 columns the narrow layout drops the model, KL and acceptance columns. The
        ``worst test`` is the test with the smallest p-value; ``p`` is its raw p-value (which
        varies on a passing run) and ``adj p`` its Holm-adjusted p-value (what the verdict
        compares with alpha). A case whose target is one-hot (greedy, say) has no soft test
        of a token's law: its min TV reads ``n/a*`` (support check only).
        """
        wide = _width(width, cap=None) >= 100
        head = ["case", "rounds", "worst test", "p", "adj p", "min TV", "verdict"]
        if wide:
            head[1:1] = ["model"]
            head[-2:-2] = ["KL", "accept obs/theory"]
        rows, marks = [], {}
        for c in self.cases:
            w = c.worst
            acc = "-" if math.isnan(c.acceptance_observed) else (
                f"{c.acceptance_observed:.4f}/" + ("-" if math.isnan(c.acceptance_theory) else f"{c.acceptance_theory:.4f}"))
            if math.isnan(c.min_detectable_tv) and c.min_tv_note.startswith("no token-law claim"):
                tv = "n/a+"  # a claim about another law (binned PITs) stands in the note
                marks.setdefault("+", []).append(c)
            elif math.isnan(c.min_detectable_tv):
                tv = "n/a*"
                marks.setdefault("*", []).append(c.name)
            elif c.min_tv_note:
                tv = f"{c.min_detectable_tv:.1e}+"
                marks.setdefault("+", []).append(c)
            else:
                tv = f"{c.min_detectable_tv:.1e}"
            row = [c.name, "-" if c.rounds <= 0 else f"{c.rounds:.3g}", "-" if w is None else w.name,
                   "-" if w is None else _fmt_p(w.pvalue),
                   "-" if w is None else _fmt_p(w.pvalue if w.hard else w.adjusted),
                   tv, c.verdict]
            if wide:
                row[1:1] = [c.model]
                row[-2:-2] = ["-" if math.isnan(c.kl) else f"{c.kl:.1e}", acc]
            rows.append(row)
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
        fmt = lambda r: "  ".join(s.ljust(widths[i]) for i, s in enumerate(r)).rstrip()  # noqa: E731
        lines = [fmt(head), fmt(["-" * x for x in widths])] + [fmt(r) for r in rows]
        notes = []
        if any(c.boundary_unreached for c in self.cases):
            notes.append("° its statistical tests passed, but its boundary pass reached nothing (no forced value "
                         "could have emitted a forbidden token): see the check's detail")
        if "*" in marks:
            notes.append("* no power figure: hard checks only (the boundary pass), a one-hot target (support "
                         "check only), or too few sequences for a claim about the token law")
        notes += [f"+ {c.name}: {c.min_tv_note}" for c in marks.get("+", [])[:3]]
        if len(marks.get("+", [])) > 3:
            notes.append(f"+ and {len(marks['+']) - 3} more cases (min_tv_note in the JSON)")
        wrap = max(60, _width(width, cap=None) - 1)
        lines += [ln for note in notes for ln in textwrap.wrap(note, wrap, subsequent_indent="  ")]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "short_of_plan": any(c.short_of_plan for c in self.cases),
            "scheme": self.scheme,
            "alpha": self.alpha,
            "multiplicity": self.multiplicity,
            "power": self.power,
            "seed": self.seed,
            "budget": self.budget,
            "seconds": round(self.seconds, 3),
            "min_detectable_tv": _jsonable(self.min_detectable_tv),
            "engine": self.engine,
            "versions": versions(),
            "broken_stages": self.broken_stages(),
            "cases": [c.to_dict() for c in self.cases],
        }

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), indent=kw.pop("indent", 2), **kw)

    def __str__(self) -> str:
        diag = self.diagnosis()
        return self.table() + "\n\n" + (f"Diagnosis:\n{diag}\n\n" if diag else "") + self.headline()


def versions() -> dict:
    """The versions a report was made with (and JAX's backend)."""
    import jax
    import scipy

    from .. import __version__

    return {"specsample": __version__, "jax": jax.__version__, "numpy": np.__version__, "scipy": scipy.__version__,
            "python": platform.python_version(), "backend": jax.default_backend()}


def _width(width: int = 0, cap: Optional[int] = 100) -> int:
    """``width`` if given, else the terminal's columns (80 when not a terminal), at most ``cap``."""
    w = width or shutil.get_terminal_size((80, 24)).columns
    return min(w, cap) if cap else w


def _kind(t: TestResult) -> str:
    """The kind of evidence a rejected test gives, for the FAIL headline."""
    if t.name == "support":
        return "support violation"
    if t.name == "valid-tokens":
        return "invalid tokens or rounds"
    if t.name == "boundary-uniforms":
        return "boundary uniforms (0 or 1 - 2^-24)"
    if t.name.startswith("sweep-"):
        return t.name.replace("sweep-", "sweep ").replace("-holm", " (worst pair)").replace("-uniformity", " (p-values)")
    if t.name.startswith("position["):
        return "position marginals"
    return {"joint": "joint law", "transitions": "transitions", "accepted-law": "acceptance law",
            "token-acceptance": "per-token acceptance"}.get(t.name, t.name)


_ACCEPTANCE = ("accepted-law", "token-acceptance", "stage:acceptance", "acceptance-at-round-starts",
               "first-acceptance-given-prefix", "rounds-per-sequence", "rounds-given-prefix")


def _family(t: TestResult) -> str:
    """hard, acceptance, stage (a stage's law that is not the output's: drafting) or output."""
    if t.hard:
        return "hard"
    if t.name in _ACCEPTANCE:
        return "acceptance"
    return "stage" if t.name == "stage:drafting" else "output"


def _fmt_p(p: float) -> str:
    if math.isnan(p):
        return "-"
    return f"{p:.3f}" if p >= 1e-3 else f"{p:.1e}"


def _tv(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2g}"


def _nan_last(x: float) -> float:
    return float("inf") if math.isnan(x) else x


def _jsonable(v):
    if isinstance(v, np.ndarray):
        return [_jsonable(x) for x in v.tolist()]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return None if math.isnan(v) else ("inf" if math.isinf(v) else v)
    return v


def holm_all(results: list, alpha: float) -> None:
    """Holm over every soft test of every case in ``results``; a hard check rejects exactly when it failed."""
    soft = [t for c in results for t in c.tests if not t.hard]
    if soft:
        h = stats.holm([t.pvalue for t in soft], alpha)
        for t, adj, rej in zip(soft, h.adjusted, h.rejected):
            t.adjusted, t.rejected = float(adj), bool(rej)
    for c in results:
        for t in c.tests:
            if t.hard:
                t.adjusted = t.pvalue
                t.rejected = t.pvalue == 0.0
