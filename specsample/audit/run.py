"""``specsample audit``: verify an engine from the rounds it recorded.

Each round of a record file (:mod:`.records`) is checked and counted, batch by batch, into a
:class:`Tally` whose counts add exactly across batches and files (the uniforms of the randomised
PIT come from a hash of the seed, request id, round and slot, never from reading order). Then, per
draft length k:

* hard checks: rounds whose emitted tokens do not start with the accepted drafts or whose count is
  outside 1..k + 1 (``valid-records``); a draft of q(x) = 0, a token emitted where its law is 0, a
  draft accepted whose acceptance probability is 0 or rejected whose probability is 1 (``support``);
* ``stage:drafting``: drafts against q, by the PIT of each draft under its own row of q;
* ``stage:acceptance``: accepted drafts against min(1, p/q) (exact-match: p(x)), a Bernoulli sum at
  each draft slot (z per slot, their squares summed: chi-square with one degree per slot);
* ``stage:rejection``, ``stage:bonus``: the token at the stop by its PIT under
  norm(max(0, p - q)) (exact-match: p without the draft) and under p.

PIT values are binned into 20 equiprobable cells and tested against the uniform law with the
suite's chi-square; a deviation of the token law of total variation d moves the PIT law by d, so
the min detectable TV of these tests speaks of the token laws (binned: a little conservative).
All soft tests of all cases are Holm-corrected together, as ``verify`` does.
"""

from __future__ import annotations

import time
from typing import Optional

import numpy as np
from scipy import special  # chi-square tails; scipy.stats costs 0.4 s to import

import stats

from ..battery.diagnosis import StageResult
from ..battery.report import CaseResult, Report, TestResult, holm_all
from ..battery.streams import mc_seed
from . import counting
from .counting import BINS, Tally, duplicate_keys, tally

RANKED = ("drafting[rank]", "rejection[rank]", "bonus[rank]")
BINNED_NOTE = (f"no token-law claim: the stage tests see the {BINS}-bin PIT laws (their min detectable TVs are "
               f"in each test's detail), and mass moved among the tokens of one bin does not move them")


def _pit_test(stage: str, counts: np.ndarray, level: float, power: float) -> tuple[TestResult, StageResult]:
    n = int(counts.sum())
    probs = np.full(BINS, 1.0 / BINS)
    if n == 0:
        t = TestResult(f"stage:{stage}", 0.0, 1.0, 0, detail="no such rounds recorded", min_detectable_tv=float("nan"))
        return t, StageResult(stage, 0.0, 1.0, 0, 0, None, 0.0, 0.0, None, None, t.detail)
    r = stats.goodness_of_fit(counts, probs, min_expected=5.0, seed=mc_seed(f"stage:{stage}"), min_pvalue=level)
    freq = counts / n
    tv = 0.5 * float(np.abs(freq - probs).sum())
    null_tv = 0.5 * float(np.sum(np.sqrt(2 * probs * (1 - probs) / (np.pi * n))))  # E TV under the law
    mtv = stats.min_detectable_tv(n, BINS - 1, level, power).tv
    # a claim about the binned PIT law only: mass moved within a bin is not seen, so no token-law claim
    detail = (f"PIT of {n:,} tokens in {BINS} bins, TV {tv:.4f} (about {null_tv:.4f} by chance); min detectable "
              f"TV of the {BINS}-bin PIT law {mtv:.2g} (not of the token law)")
    t = TestResult(f"stage:{stage}", r.statistic, r.pvalue, r.dof, detail=detail, min_detectable_tv=None)
    return t, StageResult(stage, r.statistic, r.pvalue, r.dof, n, None, tv, null_tv, freq, probs, detail)


def _acceptance_test(t: Tally, level: float, power: float) -> tuple[TestResult, StageResult]:
    mean, var = t.expected, t.variance
    use = var > 0
    z = (t.accepted - mean)[use] / np.sqrt(var[use])
    stat, dof = float(np.sum(z ** 2)), int(use.sum())
    pvalue = float(special.chdtrc(dof, stat)) if dof else 1.0
    worst = int(np.flatnonzero(use)[np.argmax(np.abs(z))]) if dof else None
    tested = np.maximum(t.tested, 1)
    est = float((t.accepted[worst] - mean[worst]) / tested[worst]) if dof else 0.0
    err = float(np.sqrt(var[worst]) / tested[worst]) if dof else 0.0
    # a common offset d at every slot gives noncentrality d^2 sum(tested^2 / var)
    lam = stats.required_noncentrality(max(dof, 1), level, power) if dof else float("nan")
    offset = float(np.sqrt(lam / np.sum(t.tested[use] ** 2 / var[use]))) if dof else float("nan")
    detail = (f"{int(t.tested.sum()):,} tested drafts over {dof} slots, accepted {int(t.accepted.sum()):,} against "
              f"{mean.sum():,.1f} expected; min detectable offset of the acceptance rate {offset:.2g}")
    test = TestResult("stage:acceptance", stat, pvalue, dof, detail=detail)
    obs = np.array([t.accepted.sum() / max(1, t.tested.sum())])
    exp = np.array([mean.sum() / max(1, t.tested.sum())])
    return test, StageResult("acceptance", stat, pvalue, dof, int(t.tested.sum()), worst, est, err, obs, exp, detail)


def _case(rule: str, t: Tally, level: float, power: float, seconds: float) -> CaseResult:
    hard = t.draft_zero + t.stop_zero + t.impossible
    first = f"; first: {t.first}" if t.first else ""
    tests = [TestResult("valid-records", float(t.invalid), float(t.invalid == 0), hard=True,
                        detail=f"{t.invalid} rounds whose emitted tokens do not start with the accepted drafts, or "
                               f"emit outside 1..k + 1 tokens{first if t.invalid else ''}"),
             TestResult("support", float(hard), float(hard == 0), hard=True,
                        detail=f"{t.draft_zero} drafts of q(x) = 0, {t.stop_zero} tokens emitted where their law is "
                               f"0, {t.impossible} acceptance decisions of probability 0{first if hard else ''}")]
    stages = []
    for stage in ("drafting", "acceptance", "rejection", "bonus"):  # the round's order
        test, st = (_acceptance_test(t, level, power) if stage == "acceptance"
                    else _pit_test(stage, t.pit[stage], level, power))
        tests.append(test)
        stages.append(st)
    for stage in RANKED:  # format 2: the same stages' PIT in the laws' own probability-rank order
        if t.pit[stage].sum():
            tests.append(_pit_test(stage, t.pit[stage], level, power)[0])
    binned = [st.n for st in stages if st.stage != "acceptance" and st.n]
    rate = t.accepted.sum() / max(1, t.tested.sum())
    theory = t.expected.sum() / max(1, t.tested.sum())
    return CaseResult(name=f"records/{rule}/k{t.k}", scheme="recorded", family="records", model=rule, vocab=0,
                      k=t.k, length=t.k + 1, sequences=t.rounds, rounds=t.rounds, tests=tests,
                      min_detectable_tv=float("nan"), acceptance_observed=float(rate),
                      acceptance_theory=float(theory), seconds=seconds, stages=stages,
                      min_tv_note=(BINNED_NOTE if binned else "hard checks only"))


def audit(paths, *, alpha: float = 0.01, power: float = 0.99, seed: int = 0, batch_size: int = 65_536,
          workers: int = 1, dask=None, name: Optional[str] = None, progress=None, dedupe: bool = False) -> Report:
    """Audit recorded rounds: the same report, verdict and broken-stage naming as ``verify``.

    Parameters
    ----------
    paths : str or list of str
        Record files (Parquet, Arrow IPC) or folders of them, searched recursively.
    alpha : float
        Family-wise error rate (Holm over every soft test of every draft length).
    seed : int
        Seeds the randomised PIT's uniforms (a hash of seed, request id, round and slot).
    workers : int
        Processes that read and count (files and Parquet row groups); the report is the same. At
        most one per two cores is started (:func:`~.counting.processes`: a process reads ahead in a
        thread of its own and keeps two cores busy); ``engine["audit"]["workers"]`` says how many ran.
    dask : None, "local", a scheduler address or a ``distributed.Client``
        Count on a Dask cluster instead (:mod:`.fleet`); the report is the same.
    dedupe : bool
        A round recorded more than once (the same request id and round: a log shipped twice) is
        refused unless ``dedupe``, which counts its first copy and drops the others (the report's
        ``engine["audit"]["dropped"]`` says how many).
    progress : callable, optional
        ``progress(label, done, total)`` as files (or a worker's units) are counted, as ``verify``
        calls its own; the command line's bar (off with ``--no-progress``).

    Examples
    --------
    >>> from specsample.audit import audit
    >>> report = audit("records/")  # doctest: +SKIP
    >>> report.passed, report.broken_stages()  # doctest: +SKIP
    """

    alpha = stats.multiplicity.check_level(alpha)
    t0 = time.perf_counter()
    ran = workers
    if dask is not None:
        from .fleet import tally_dask

        tallies = tally_dask(paths, dask, seed=seed, batch_size=batch_size, workers=max(2, workers))
        if duplicate_keys(tallies).size:  # refused, or dropped in file order (a serial pass)
            tallies = tally(paths, seed=seed, batch_size=batch_size, dedupe=dedupe)
    else:
        ran = counting.processes(workers)
        tallies = tally(paths, seed=seed, batch_size=batch_size, workers=ran, progress=progress, dedupe=dedupe)
    n_tests = sum(4 + sum(bool(t.pit[s].sum()) for s in RANKED) for t in tallies.values())
    level = alpha / max(1, n_tests)
    seconds = time.perf_counter() - t0
    cases = [_case(rule, t, level, power, seconds) for (rule, _), t in sorted(tallies.items())]
    holm_all(cases, alpha)
    label = name or ("records " + (paths if isinstance(paths, str) else ", ".join(map(str, paths))))
    return Report(scheme=label, alpha=alpha, seed=seed, budget="recorded", cases=cases,
                  seconds=time.perf_counter() - t0, power=power,
                  engine={"audit": {"rounds": sum(t.rounds for t in tallies.values()),
                                    "dropped": int(getattr(tallies, "dropped", 0)),
                                    "workers": ran, "workers_asked": workers, "cores": counting.cores(),
                                    "rounds_per_s": sum(t.rounds for t in tallies.values()) / max(seconds, 1e-9)}})
