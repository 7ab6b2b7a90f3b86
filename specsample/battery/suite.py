"""The verification battery: cases -> engine -> stats -> a verdict.

A *case* is one pair of models (or a sweep of many random pairs) run with one scheme and
draft length k, keeping the first L = k + 2 tokens of every stream (so the bonus token
and the start of a second round are inside the window). Cases with the same shapes run
as one batched, jitted engine call. Every p-value of the run enters one Holm correction
at family-wise level ``alpha``; support violations and out-of-range tokens are hard
failures outside it.

Sample sizes come from the power of the chi-square test on a token's law
(:mod:`stats.power`) at the most stringent Holm level ``alpha / m``, for a target minimum
detectable total variation, capped by the budget; each case reports the TV it could
detect with probability ``power``.
"""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

import stats

from .. import SEED_MAX, program_cache
from ..engine import compile_cache, lanes as engine
from . import edges, recorded_rounds, sequential, stage_worker, stages
from ..laws import exact
from .boundary import boundary_check
from ..models.tables import TableModel, exact_joint, exact_marginals, pair_for_device
from ..models.pairs import Pair
from .report import CaseResult, Report, TestResult, holm_all
from .streams import mc_seed
from ..schemes import Scheme, StatefulStep, get_factory, make_scheme, program_identity, user_location
# the plan lives in its own module; its names stay importable from here
from .cases import (  # noqa: F401
    BOUNDARY_FAMILY, BUDGETS, DRAFT_LENGTHS, LARGE_VOCAB, LONG_WINDOW_SEQUENCES, LONG_WINDOW_VOCAB, NEURAL_BLOCK,
    NEURAL_CASES, NGRAM_FAMILIES, NGRAM_ORDER, Budget, Case, _case_seed, _law_tests_planned, _planned_tests, _sequences,
    default_cases, select)

DEFAULT_ALPHA = 0.01
DEFAULT_POWER = 0.99
# Pooling threshold. Cochran's rule (expected >= 5) is calibrated for levels near 0.05; Holm
# over hundreds of tests rejects at p ~ 1e-5, where Poisson tails of small cells make Pearson's
# statistic anti-conservative (measured: 1.31x the nominal rate at 4.3e-5 with 5, 1.09x with 100,
# 1.2e6 null simulations over 12 pairs; 3 false alarms in 100 quick runs before this change).
MIN_EXPECTED = 100.0
SMALL_BLOCK = (256, 4)  # (lanes, per_lane) for the 32k-vocabulary case and sweeps


class SchemeError(RuntimeError):
    """The scheme under test failed (raised, or returned malformed output)."""


# --- running -----------------------------------------------------------------------------


def _trace_round(scheme: Scheme, pair, width: int, length: int):
    """The abstract output of one round (shapes only), for a table pair or a neural pair."""
    if isinstance(scheme.step, StatefulStep):
        st = scheme.step

        def one(key):
            state = st.init(pair.target, pair.draft, jnp.asarray(pair.prompt, jnp.int32), length)
            return st(key, pair.target, pair.draft, state)

        out = jax.eval_shape(one, jax.random.key(0))
        if not (isinstance(out, tuple) and len(out) == 2):
            raise SchemeError(f"scheme {scheme.name!r} carries state: its round must return (RoundOutput, state)")
        return out[0]

    def first(m):  # the first pair of a batch, as the engine puts it on the device
        table = np.asarray(m.table)
        return TableModel(table[0] if table.ndim == 3 else table, m.order)

    t, d = pair_for_device(first(pair.target), first(pair.draft))
    return jax.eval_shape(scheme.step, jax.random.key(0), t, d, jax.ShapeDtypeStruct((width,), np.int32))


def _check_scheme_output(scheme: Scheme, pair: Pair, width: int, length: int = 1) -> None:
    """Trace one round abstractly and check the shapes, before spending any time.

    The registry's own scheme, at this source and these shapes, passes as it passed before: the
    command keeps the pass (:func:`specsample.program_cache.value`) and skips the trace."""
    identity = program_identity(scheme, "scheme-check", width, length, len(getattr(pair, "prompt", ())))
    program_cache.value(lambda *_: _check_now(scheme, pair, width, length), identity, pair.target, pair.draft)


def _check_now(scheme: Scheme, pair: Pair, width: int, length: int) -> bool:
    try:
        out = _trace_round(scheme, pair, width, length)
    except SchemeError:
        raise
    except Exception as e:
        raise SchemeError(f"scheme {scheme.name!r} failed when traced: {type(e).__name__}: {_first_line(e)}"
                          f"{user_location(e)}") from e
    expect = {"tokens": (scheme.max_tokens,), "n_emitted": (), "n_accepted": ()}
    for field, shape in expect.items():
        got = getattr(out, field, None)
        if got is None or tuple(got.shape) != shape:
            raise SchemeError(f"scheme {scheme.name!r} returned {field} with shape "
                              f"{None if got is None else tuple(got.shape)}, expected {shape}")
        if not np.issubdtype(got.dtype, np.integer):
            raise SchemeError(f"scheme {scheme.name!r} returned {field} of dtype {got.dtype}; token ids and "
                              f"counts must be integers (cast with .astype(jnp.int32))")
    n = out.drafts.shape
    if len(n) != 1 or out.draft_tested.shape != n or out.draft_accepted.shape != n:
        raise SchemeError(f"scheme {scheme.name!r}: drafts, draft_tested and draft_accepted must be "
                          f"vectors of one length, got {out.drafts.shape}, {out.draft_tested.shape}, "
                          f"{out.draft_accepted.shape}")
    return True


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


def _min_tv(probs: np.ndarray, n: int, level: float, power: float, token_test: bool = False) -> float:
    """The smallest TV of the *token* law that ``n`` draws detect with ``power`` at ``level``
    (:func:`stats.identity.token_min_tv`): the pooled chi-square's claim plus the mass it pools
    (mass moved within a pooled cell is invisible to it), or, where the case also makes the token
    chi-square (``token_test``), the better of that and the token chi-square's claim. NaN where
    neither reaches below 1 (or fewer than two pooled cells)."""
    return stats.identity.token_min_tv(probs, n, level, power, MIN_EXPECTED, token_test=token_test).tv


def _test_min_tv(probs: np.ndarray, n: int, level: float, power: float) -> Optional[float]:
    """A soft test's min TV: None for a point-mass law (nothing to deviate to but outside the support,
    which the hard check settles), NaN where too few sequences leave no token-law claim."""
    return None if np.count_nonzero(probs) <= 1 else _min_tv(probs, n, level, power)


def _gof_test(name: str, counts, probs, level, power) -> TestResult:
    # a simulated p-value goes as low as the run's strictest Holm level: the test can reject alone
    r = stats.goodness_of_fit(counts, probs, min_expected=MIN_EXPECTED, seed=mc_seed(name), min_pvalue=level)
    # a position's law (V cells) is kept for the HTML report's observed-against-expected panels
    law = (np.asarray(counts), np.asarray(probs)) if name.startswith("position[") else None
    return TestResult(name, r.statistic, r.pvalue, r.dof, detail=f"{r.cells} cells, {r.method}",
                      min_detectable_tv=_test_min_tv(np.ravel(probs), int(np.sum(counts)), level, power), law=law)


def token_tested(case: Case) -> bool:
    """Whether a case's position laws also get the token chi-square (:func:`stats.identity.token_chi2_test`):
    a table case whose vocabulary is too large for the pooled chi-square to see most tokens alone."""
    return case.vocab > LARGE_VOCAB and not (case.neural or case.sweep or case.boundary)


def _token_test(name: str, counts, probs, level, power) -> TestResult:
    r = stats.identity.token_chi2_test(counts, probs)
    mtv = stats.identity.token_chi2_min_detectable(probs, r.n, level, power) if r.n > 1 else float("nan")
    return TestResult(name, r.statistic, r.pvalue, r.cells - 1,
                      detail=f"token chi-square over {r.cells:,} cells (every token with an expected draw alone, "
                             f"{r.rest_mass:.4f} of p's mass in the rest): Z {r.statistic:,.1f} against "
                             f"{r.null_mean:.0f} +- {r.null_sd:,.1f} by chance",
                      min_detectable_tv=mtv if mtv < 1 else float("nan"))  # 1 or more: no law is that far


def _case_tests(case: Case, scheme: Scheme, pair_t: TableModel, pair_d: TableModel, c: engine.Counts,
                level: float, power: float) -> tuple[list, dict]:
    """The tests of one single-pair case, and the numbers its report row shows."""
    tests = []
    L = case.length
    marg = exact_marginals(pair_t, L)
    bad = int(c.invalid)
    tests.append(TestResult("valid-tokens", float(bad), 1.0 if bad == 0 else 0.0, hard=True,
                            detail=f"{bad} token ids outside [0, {case.vocab}) or rounds emitting outside "
                                   f"[1, {scheme.max_tokens}] tokens"))
    # support: a token with p = 0 in its context is a hard failure
    if case.order == 0:
        viol = int(c.position[:, marg[0] == 0].sum())
    else:
        viol = int(c.transitions[np.asarray(pair_t.table) == 0].sum())
    tests.append(TestResult("support", float(viol), 1.0 if viol == 0 else 0.0, hard=True,
                            detail=f"{viol} tokens emitted where the target gives probability 0"))
    if c.joint is not None:
        tests.append(_gof_test("joint", c.joint, exact_joint(pair_t, L).ravel(), level, power))
    for t in range(L):
        tests.append(_gof_test(f"position[{t}]", c.position[t], marg[t], level, power))
    if token_tested(case):  # most tokens pooled: the token law needs a test that sees every token
        for t in range(L):
            tests.append(_token_test(f"tokens[{t}]", c.position[t], marg[t], level, power))
    if case.order > 0:
        r = stats.transition_test(c.transitions, np.asarray(pair_t.table), min_expected=MIN_EXPECTED)
        tests.append(TestResult("transitions", r.statistic, r.pvalue, r.dof, detail=f"{r.contexts} contexts"))
    extra = {}
    p = np.asarray(pair_t.table[0], np.float64)
    q = np.asarray(pair_d.table[0], np.float64)
    tested = c.drafted.sum()
    extra["acceptance_observed"] = c.draft_accepted.sum() / tested if tested else float("nan")
    extra["tokens_per_round"] = float((c.emitted * np.arange(c.emitted.size)).sum() / max(1, c.rounds))
    if case.order == 0 and scheme.accepted_law is not None:
        law = np.asarray(scheme.accepted_law(p, q), dtype=np.float64)
        r = stats.accepted_drafts_test(c.accepted, law, min_expected=MIN_EXPECTED, seed=mc_seed("accepted-law"),
                                       min_pvalue=level)
        tests.append(TestResult("accepted-law", r.statistic, r.pvalue, r.dof, detail=f"{r.cells} cells, {r.method}"))
        extra["acceptance_theory"] = float(stats.acceptance_probability(p, q))
    if case.order == 0 and scheme.token_acceptance is not None:
        r = stats.per_token_acceptance_test(c.drafted, c.draft_accepted, scheme.token_acceptance(p, q),
                                            min_expected=MIN_EXPECTED)
        tests.append(TestResult("token-acceptance", r.statistic, r.pvalue, r.dof,
                                detail=f"{r.dof} tokens tested" + (f"; violations at {r.violations.tolist()}"
                                                                   if r.violations.size else "")))
    if c.sequences >= 10 * np.count_nonzero(marg[0]):  # the bias formula needs N >> cells
        extra["kl"] = stats.kl_divergence(c.position[0], marg[0]).corrected
    extra["min_detectable_tv"] = _min_tv(marg[0], int(c.sequences), level, power, token_test=token_tested(case))
    return tests, extra


def law_tests(joint_counts, position_counts, joint, marginals, invalid: int, invalid_detail: str,
              level: float, power: float) -> list:
    """Tests of first-L counts against exact laws: invalid outputs and support (hard), the joint (when
    counted) and every position. Shared by the transformer cases and the end-to-end mode."""
    if joint_counts is not None:
        viol, unit = int(joint_counts[joint == 0].sum()), "sequences"
    else:
        viol, unit = int(position_counts[marginals == 0].sum()), "tokens"
    tests = [TestResult("valid-tokens", float(invalid), float(invalid == 0), hard=True, detail=invalid_detail),
             TestResult("support", float(viol), float(viol == 0), hard=True,
                        detail=f"{viol} {unit} emitted that the target gives probability 0")]
    if joint_counts is not None:
        tests.append(_gof_test("joint", joint_counts, joint, level, power))
    for t in range(len(marginals)):
        tests.append(_gof_test(f"position[{t}]", position_counts[t], marginals[t], level, power))
    return tests


def _neural_laws(pair, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Both models' rows after every prefix of a window of ``length`` (``exact.prefix_rows``): target, draft.

    A command keeps them (:func:`specsample.program_cache.value`, under a digest of both networks and the
    prompt): a warm battery reads a case's laws instead of loading and running their passes."""
    def compute():
        return exact.prefix_rows(pair.target, pair.prompt, length), exact.prefix_rows(pair.draft, pair.prompt, length)

    return program_cache.value(compute, _laws_identity(pair, length), host=True)


def _laws_identity(pair, length: int) -> Optional[tuple]:
    """What a pair's exact laws depend on: the prompt, the window and both networks (their configs and the
    bytes of every weight); None with the cache off, or for models other than specsample's transformers."""
    from ..models.transformer import Transformer

    if program_cache.folder() is None or not all(type(m) is Transformer for m in (pair.target, pair.draft)):
        return None
    h = hashlib.sha256(repr((tuple(pair.prompt), length)).encode())
    for model in (pair.target, pair.draft):
        program_cache.hash_model(h, model)
    return "neural-laws", h.hexdigest()


def _case_laws(case: Case, scheme: Scheme, pair, sequences: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_neural_laws` of a case, called as the stage pass is (by the background thread or the stage worker)."""
    return _neural_laws(pair, case.length)


def _neural_tests(case: Case, scheme: Scheme, pair, c: engine.Counts, level: float,
                  power: float, laws: Optional[tuple] = None) -> tuple[list, dict]:
    """The tests of a transformer case: exact laws by teacher-forced enumeration of prefixes
    (``laws``: :func:`_neural_laws`, when computed already)."""
    L = case.length
    if case.spans_rounds:
        return _long_window_tests(case, pair, c, level, power)
    p_rows, q_rows = _neural_laws(pair, L) if laws is None else laws
    marg = exact.marginals_from_rows(p_rows)
    bad = int(c.invalid)
    tests = law_tests(c.joint, c.position, exact.joint_from_rows(p_rows), marg, bad,
                      f"{bad} token ids outside [0, {case.vocab}) or rounds emitting outside "
                      f"[1, {scheme.max_tokens}] tokens", level, power)
    if getattr(scheme.step, "rule", None) == "standard":
        law = exact.standard_rounds_law(p_rows, q_rows, case.k)
        r = stats.goodness_of_fit(c.rounds_per_sequence, law, min_expected=MIN_EXPECTED,
                                  seed=mc_seed("rounds-per-sequence"), min_pvalue=level)
        tests.append(TestResult("rounds-per-sequence", r.statistic, r.pvalue, r.dof,
                                detail=f"{r.cells} cells, {r.method}; exact law of the standard rule",
                                min_detectable_tv=_test_min_tv(law, int(c.sequences), level, power)))
    tested = c.drafted.sum()
    extra = dict(acceptance_observed=c.draft_accepted.sum() / tested if tested else float("nan"),
                 alpha=float(np.mean(exact.acceptance_from_rows(p_rows, q_rows))),
                 tokens_per_round=float((c.emitted * np.arange(c.emitted.size)).sum() / max(1, c.rounds)),
                 min_detectable_tv=_min_tv(marg[0], int(c.sequences), level, power))
    if c.sequences >= 10 * np.count_nonzero(marg[0]):
        extra["kl"] = stats.kl_divergence(c.position[0], marg[0]).corrected
    return tests, extra


def _long_window_tests(case: Case, pair, c: engine.Counts, level: float, power: float) -> tuple[list, dict]:
    """A transformer window that spans rounds (L = 2k + 3): support and every position's next token
    per observed prefix (:mod:`specsample.battery.sequential`); V**(L-1) prefixes are not enumerated, so the
    joint, the marginals and the rounds law are left to the short windows."""
    bad = int(c.invalid)
    seq_tests, zero, first_row = sequential.tests_from_joint(c.joint, pair.target, pair.prompt, case.vocab, case.length,
                                                             MIN_EXPECTED, level=level)
    tests = [TestResult("valid-tokens", float(bad), float(bad == 0), hard=True,
                        detail=f"{bad} token ids outside [0, {case.vocab}) or malformed rounds"),
             TestResult("support", float(zero), float(zero == 0), hard=True,
                        detail=f"{zero} tokens emitted that the target gives probability 0 after their prefix")]
    tested = c.drafted.sum()
    extra = dict(acceptance_observed=c.draft_accepted.sum() / tested if tested else float("nan"),
                 tokens_per_round=float((c.emitted * np.arange(c.emitted.size)).sum() / max(1, c.rounds)),
                 min_detectable_tv=_min_tv(first_row, int(c.sequences), level, power))
    if c.round_start is not None:  # a standard-rule decoder: every round's outcome given where it started
        for t in (sequential.first_acceptance_test(c.round_start, pair.target, pair.draft, pair.prompt, case.vocab),
                  sequential.rounds_given_prefix_test(c.round_start, pair.target, pair.draft, pair.prompt, case.vocab,
                                                      case.k, MIN_EXPECTED, level=level)):
            if t is not None:
                seq_tests.append(t)
    return tests + seq_tests, extra


def _sweep_tests(case: Case, scheme: Scheme, pair: Pair, c: engine.Counts, level: float,
                 power: float) -> tuple[list, dict]:
    n_pairs = pair.target.table.shape[0]
    p_joint, p_acc, support, invalid = [], [], 0, 0
    min_tvs = []
    for i in range(n_pairs):
        ci = c.pair(i)
        t = TableModel(pair.target.table[i], 0)
        pv = np.asarray(pair.target.table[i, 0])
        qv = np.asarray(pair.draft.table[i, 0])
        support += int(ci.position[:, pv == 0].sum())
        invalid += int(ci.invalid)
        law = exact_joint(t, case.length).ravel()
        if np.count_nonzero(law) > 1:  # a point mass (greedy) has no p-value to speak of
            p_joint.append(stats.goodness_of_fit(ci.joint, law, min_expected=MIN_EXPECTED,
                                                 seed=mc_seed("sweep-joint", i)).pvalue)
        if scheme.accepted_law is not None:
            p_acc.append(stats.accepted_drafts_test(ci.accepted, scheme.accepted_law(pv, qv), min_expected=MIN_EXPECTED,
                                                   seed=mc_seed("sweep-accepted-law", i)).pvalue)
        if np.count_nonzero(pv) > 1:
            min_tvs.append(_min_tv(pv, int(ci.sequences), level / n_pairs, power))
    tests = [
        TestResult("valid-tokens", float(invalid), float(invalid == 0), hard=True),
        TestResult("support", float(support), float(support == 0), hard=True),
    ]
    for label, pv in (("joint", p_joint), ("accepted-law", p_acc)):
        if not pv:
            continue
        h = stats.holm(pv, 0.5)
        tests.append(TestResult(f"sweep-{label}-holm", float(np.min(pv)), float(np.min(h.adjusted)),
                                detail=f"smallest of {len(pv)} per-pair p-values, Holm-adjusted"))
        u = stats.uniformity_test(pv)
        tests.append(TestResult(f"sweep-{label}-uniformity", u.statistic, u.pvalue,
                                detail=f"KS of {len(pv)} per-pair p-values against Uniform(0, 1)"))
    tested = c.drafted.sum(axis=1)
    alphas = stats.acceptance_probability(pair.target.table[:, 0], pair.draft.table[:, 0])
    extra = dict(
        acceptance_observed=float(c.draft_accepted.sum() / tested.sum()) if tested.sum() else float("nan"),
        acceptance_theory=float(np.sum(alphas * tested) / tested.sum()) if tested.sum() else float("nan"),
        tokens_per_round=float((c.emitted.sum(0) * np.arange(c.emitted.shape[1])).sum() / max(1, c.rounds.sum())),
        min_detectable_tv=float(np.nanmax(min_tvs)) if np.any(np.isfinite(min_tvs)) else float("nan"),
    )
    return tests, extra


def verify(
    scheme="standard",
    *,
    budget="default",
    seed: int = 0,
    alpha: float = DEFAULT_ALPHA,
    power: float = DEFAULT_POWER,
    cases: Optional[str] = None,
    k=DRAFT_LENGTHS,
    prng: str = engine.DEFAULT_PRNG,
    progress: Optional[Callable[[str, int, int], None]] = None,
    checkpoint_dir: Optional[str] = None,
    ks=None,
) -> Report:
    """Run the battery against a scheme and return a :class:`~specsample.battery.report.Report`.

    Parameters
    ----------
    scheme : str, factory or Scheme
        A registered name (``specsample list``), ``module:attr``, ``path.py:attr``, a
        factory ``f(k) -> Scheme`` or a Scheme (whose own k is then used).
    budget : {"quick", "default", "thorough"} or int
        Named budget, or an explicit number of sequences per case.
    seed : int
    alpha : float
        Family-wise error rate over every test of the run (Holm). Default 0.01.
    power : float
        Power at which each case's min detectable TV is stated.
    cases : str, optional
        Exact case names, globs or substrings (``specsample list``), comma-separated.
    k : int or tuple of int
        Draft lengths crossed with the model families (default 1, 4, 8; the CLI's ``--k``).
    prng : str
        JAX PRNG implementation.
    progress : callable(label, done, total), optional
    checkpoint_dir : str, optional
        Keep each case's counts in ``<dir>/<case>-s<seed>.npz`` (written every minute); a
        killed run started again with the same arguments resumes where it stopped.
    ks : tuple of int, optional
        Former name of ``k``, still accepted.

    Returns
    -------
    Report
        The verdict, every case and every test (``report.passed``, ``report.table()``,
        ``report.to_json()``).

    Notes
    -----
    The command line ``specsample verify`` takes the same arguments with the same
    defaults (``--scheme``, ``--budget``, ``--seed``, ``--alpha``, ``--cases``, ``--k``,
    ``--prng``, ``--checkpoint``); it runs on every CPU core as a JAX device, and so does
    this function when ``specsample`` is imported before JAX.

    Examples
    --------
    >>> report = verify("standard", budget="quick", cases="dirichlet/V8/k4")  # doctest: +SKIP
    >>> report.passed  # doctest: +SKIP
    True
    """
    alpha = stats.multiplicity.check_level(alpha)
    power = stats.multiplicity.check_level(power, "power")
    seed = check_seed(seed)
    prng = engine.check_prng(prng)  # a bad name stops the run here, not inside its first case as the scheme's error
    ks = _draft_lengths(k if ks is None else ks)
    bud, explicit, budget = resolve_budget(budget)
    factory = get_factory(scheme)
    compile_cache.release_if_crowded()  # many batteries in one process: drop compiled code before the limit
    schemes = {}
    for k in ks:
        s = make_scheme(factory, k)
        schemes[s.k] = s  # a fixed Scheme keeps its own k
    name = next(iter(schemes.values())).name
    # a scheme whose lanes carry state (KV caches) runs the transformer cases; a table scheme the rest
    stateful = isinstance(next(iter(schemes.values())).step, StatefulStep)
    plan = [c for c in default_cases(bud, tuple(schemes)) if c.k in schemes and c.neural == stateful]
    try:
        plan = select(plan, cases)
    except ValueError:
        everything = select(default_cases(bud, tuple(range(1, 17))), cases) if cases else []
        if everything and all(c.neural != stateful for c in everything):  # cases of the other kind of scheme
            kind, runs = (("table", "the transformer cases (transformer-*)") if stateful else
                          ("transformer", "table cases"))
            raise ValueError(f"{cases!r} names {kind} cases only; {name} "
                             f"{'carries KV caches' if stateful else 'is a table scheme'} and runs {runs} "
                             f"(see `specsample list`)") from None
        other = [c.k for c in everything if c.neural == stateful]
        if other:  # the pattern names cases, of draft lengths not asked for
            lengths = ",".join(str(x) for x in sorted(set(other)))
            raise ValueError(f"no case matches {cases!r} with k in {','.join(map(str, schemes))}; it names "
                             f"cases with k = {lengths}: add that to --k (the API's k=)") from None
        raise
    m = sum(_planned_tests(c, schemes[c.k]) for c in plan)
    level = alpha / max(1, m)  # Holm's most stringent level: power statements hold at any step
    t_start = time.perf_counter()
    # the stage pass needs no counts: a worker process (stage_worker) or one background thread plays it
    # while the engine compiles and samples; the worker starts first, as its imports take seconds (a
    # transformer case plays none: its stage tests read the rounds its run recorded)
    n_staged = sum(1 for c in plan if not (c.sweep or c.boundary or c.neural))
    beside = stage_worker.worker() if stage_worker.eligible(scheme, n_staged) else None
    jobs = []  # one engine call per case (a sweep is one case); cases of one shape share a compile
    boundary_cases = [c for c in plan if c.boundary]
    for c in plan:
        if c.boundary:
            continue
        pair = c.pair(seed)
        _check_scheme_output(schemes[c.k], pair, c.order, c.length)
        # large vocabularies and sweeps run in small blocks: a block is the unit of sampling
        lanes, per_lane = SMALL_BLOCK if (c.vocab > LARGE_VOCAB or c.sweep) else (bud.lanes, bud.per_lane)
        if c.neural:
            lanes, per_lane = NEURAL_BLOCK
        run_kw = dict(sequences=_sequences(c, bud, level, power, explicit), length=c.length,
                      seed=_case_seed(seed, c.name), lanes=lanes, per_lane=per_lane, prng=prng)
        if c.neural:
            run_kw["prompt"] = pair.prompt
        if c.spans_rounds:  # V**L cells (2^19 at k = 8): every prefix's next tokens are read off them
            run_kw["joint"] = True
        jobs.append((c, pair, run_kw))
    # a long window's tests (prefix by prefix) are a transformer battery's longest: sampled first, they run
    # beside the other cases' sampling, not alone after it (the report keeps the plan's order)
    jobs.sort(key=lambda job: not job[0].spans_rounds)
    background = ThreadPoolExecutor(1)
    # a transformer case's tests (exact laws read, teacher-forced rows, the stage tests on its recorded rounds):
    # two at a time, so that they keep up with the engine and leave no long tail after its last run
    testing = ThreadPoolExecutor(2)
    staged, laws = {}, {}

    def submit(fn, c, pair, kw):  # fn(case, scheme, pair, sequences, seed), beside the engine
        args = (c, schemes[c.k], pair, kw["sequences"], seed)
        return beside.submit(fn, scheme, *args) if beside is not None else background.submit(fn, *args)

    for c, pair, kw in jobs:  # in the order they are needed; a transformer case's exact laws need no counts either
        if c.neural and not c.spans_rounds:
            laws[c.name] = submit(_case_laws, c, pair, kw)
        if not (c.sweep or c.neural):  # a transformer case's stage tests read the rounds its run recorded
            staged[c.name] = submit(_stage_pass, c, pair, kw)
    try:
        _compile_all(jobs, schemes)
        boundary = [lambda c=c: _boundary_case(c, schemes[c.k], seed) for c in boundary_cases]
        results = _sample_and_test(jobs, schemes, staged, laws, seed, level, power, progress, checkpoint_dir,
                                   boundary, testing.submit, None if beside is None else beside.steal)
    finally:  # after a run every future has been read; after an error nothing waits for the thread
        background.shutdown(wait=False, cancel_futures=True)
        testing.shutdown(wait=False, cancel_futures=True)
    rank = {c.name: i for i, c in enumerate(plan)}
    results.sort(key=lambda r: rank[r.name])  # the plan's order: each k's boundary case after its pairs
    _holm_all(results, alpha)
    return Report(scheme=name, alpha=alpha, seed=int(seed), budget=str(budget), cases=results,
                  seconds=time.perf_counter() - t_start, power=power,
                  engine=dict(prng=prng, lanes=bud.lanes, per_lane=bud.per_lane, small_block=list(SMALL_BLOCK),
                              devices=jax.device_count()))


def _stage_pass(case: Case, scheme: Scheme, pair, sequences: int, seed: int) -> tuple[list, list]:
    """A table case's stage pass: each stage of the round against its own law (a FAIL then names the broken
    stage). It depends on the scheme, the pair and the seed only, not on the case's counts."""
    return _guarded(lambda: stages.table_stage_tests(scheme, pair.target, pair.draft,
                                                     min(sequences, stages.STAGE_ROUNDS), _case_seed(seed, case.name)),
                    scheme, case.name)


def _sample_and_test(jobs: list, schemes: dict, staged: dict, laws: dict, seed: int, level: float, power: float,
                     progress, checkpoint_dir, boundary: list, beside: Callable,
                     steal: Optional[Callable[[], bool]] = None) -> list:
    """Each case's engine run (the long windows first, then in the plan's order) and its tests, then each
    case's stage pass and the boundary cases (``boundary``: one call each), played while a stage pass is
    still running.

    The engine does not wait for its tests: a transformer case is tested (its exact laws from the worker,
    then its law tests and the stage tests on the rounds its run recorded) in a thread beside the next
    case's run (``beside(fn) -> Future``), and stage passes are collected last (waiting case by case kept a
    core idle whenever the worker was behind). Waiting for the worker, this process plays the boundary cases, then
    takes back the worker's last jobs not started yet (``steal``, :meth:`stage_worker.StageWorker.steal`)
    and plays them itself, the same calls with the same results."""
    results, tested = [], []

    def settle(future):
        while not future.done():  # fill the wait: hard checks (no sampling), then the worker's last jobs
            if boundary:
                results.append(boundary.pop(0)())
            elif steal is None or not steal():
                break
        return future.result()

    def test(c, pair, counts, secs):
        scheme_k = schemes[c.k]
        if c.neural:  # beside the next case's run: its teacher-forced rows and tests are mostly one-threaded numpy
            law = laws.get(c.name)

            def neural():
                tests, extra = _neural_tests(c, scheme_k, pair, counts.pair(0), level, power,
                                             None if law is None else law.result())
                # the stage tests, on the rounds its run recorded
                stage = _guarded(lambda: recorded_rounds.recorded_stage_tests(
                    scheme_k, pair, counts.record[0], c.length, _case_seed(seed, c.name)), scheme_k, c.name)
                return tests, extra, stage

            tested.append((c, counts, secs, beside(neural)))
            return
        if c.sweep:
            tests, extra = _sweep_tests(c, scheme_k, _output_law(scheme_k, pair), counts, level, power)
        else:
            law = _output_law(scheme_k, pair)
            tests, extra = _case_tests(c, scheme_k, law.target, law.draft, counts.pair(0), level, power)
        tested.append((c, counts, secs, (tests, extra, None)))

    total_seq = sum(kw["sequences"] * max(1, c.sweep) for c, _, kw in jobs)
    done_seq = 0
    for c, pair, run_kw in jobs:
        scheme_k = schemes[c.k]
        weight = max(1, c.sweep)

        def tick(done, total, _label=c.name, _base=done_seq, _w=weight):
            if progress is not None:
                progress(_label, _base + done * _w, total_seq)

        t0 = time.perf_counter()
        ck = None
        if checkpoint_dir:
            os.makedirs(checkpoint_dir, exist_ok=True)
            ck = os.path.join(checkpoint_dir, f"{c.name.replace('/', '_')}-s{seed}.npz")
        counts = _guarded(lambda: engine.run(scheme_k, pair.target, pair.draft, progress=tick, checkpoint=ck,
                                             **run_kw), scheme_k, c.name)
        done_seq += run_kw["sequences"] * weight
        test(c, pair, counts, time.perf_counter() - t0)
    for c, counts, secs, done in tested:
        tests, extra, stage = settle(done) if isinstance(done, Future) else done
        if not c.sweep:
            stage_tests, extra["stages"] = stage if c.neural else settle(staged[c.name])
            tests += stage_tests
        results.append(CaseResult(
            name=c.name, scheme=schemes[c.k].name, family=c.family, model=c.model, vocab=c.vocab, k=c.k,
            length=c.length, sequences=int(counts.sequences.sum()), rounds=int(counts.rounds.sum()), tests=tests,
            pairs=max(1, c.sweep), seconds=secs, **extra))
    results += [play() for play in boundary]
    return results


def _boundary_case(case: Case, scheme: Scheme, seed: int) -> CaseResult:
    """The floating-point edges as a case: extreme uniforms and edge rows, hard checks, no sampling."""
    pair = case.pair(seed)
    _check_scheme_output(scheme, pair, case.order)
    t0 = time.perf_counter()
    law = _output_law(scheme, pair).target.table
    r = _guarded(lambda: boundary_check(scheme, pair.target, pair.draft, law, seed=_case_seed(seed, case.name)),
                 scheme, case.name)
    tests = [TestResult("boundary-uniforms", float(r.violations), 1.0 if r.passed else 0.0, hard=True,
                        detail=r.detail if r.rounds else f"not reached: {r.detail}", reached=r.rounds > 0)]
    e = _guarded(lambda: edges.jax_edge_check(scheme, seed=_case_seed(seed, case.name)), scheme, case.name)
    tests.append(edges.as_test(e))
    rounds = r.rounds + e.rounds
    return CaseResult(name=case.name, scheme=scheme.name, family=case.family, model=case.model, vocab=case.vocab,
                      k=case.k, length=case.length, sequences=0, rounds=rounds, tests=tests,
                      min_detectable_tv=float("nan"), seconds=time.perf_counter() - t0)


def resolve_budget(budget) -> tuple[Budget, Optional[int], str]:
    """A named budget, or an explicit number of sequences per case (then the default budget's other
    settings): ``(budget, sequences or None, label)``; a one-line error for anything else."""
    if isinstance(budget, str) and budget in BUDGETS:
        return BUDGETS[budget], None, budget
    try:
        explicit = int(float(budget))
    except (TypeError, ValueError):
        raise ValueError(f"unknown budget {budget!r}; use quick, default, thorough or a number of "
                         "sequences per case") from None
    if explicit < 1:
        raise ValueError(f"a budget is a positive number of sequences per case, got {budget!r}")
    # small budgets are valid (cells under the expected count get Monte Carlo p-values); the report
    # states each case's min detectable TV and warns where a case has none
    return BUDGETS["default"], explicit, str(explicit)


def check_seed(seed) -> int:
    """A seed as an int in [0, 2^31 - 1], or a one-line error (negative seeds used to wrap silently)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= SEED_MAX:
        raise ValueError(f"seed must be an integer in [0, {SEED_MAX}], got {seed!r}")
    return int(seed)


def _draft_lengths(k) -> tuple:
    ks = (k,) if isinstance(k, (int, np.integer)) and not isinstance(k, bool) else tuple(k)
    if not ks or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1 for x in ks):
        raise ValueError(f"k takes draft lengths, integers >= 1 (an int or a tuple), got {k!r}")
    return tuple(int(x) for x in ks)


def _output_law(scheme: Scheme, pair: Pair) -> Pair:
    """The pair whose target is the law the scheme's output must follow (p unless stated)."""
    if scheme.target_law is None:
        return pair
    table = np.asarray(scheme.target_law(np.asarray(pair.target.table)), dtype=np.float64)
    return Pair(pair.name, TableModel(table, pair.target.order), pair.draft)


def _guarded(fn, scheme: Scheme, label: str):
    """Run engine work, turning a failure of the scheme's code into one readable line."""
    try:
        return fn()
    except (ValueError, TypeError) as e:
        raise SchemeError(f"running scheme {scheme.name!r} on {label} failed: {_first_line(e)}{user_location(e)}") from e
    except Exception as e:  # the user's code raised inside the engine
        raise SchemeError(f"scheme {scheme.name!r} raised on {label}: {type(e).__name__}: {_first_line(e)}"
                          f"{user_location(e)}") from e


def _compile_all(jobs: list, schemes: dict) -> None:
    """Compile every group's engine call up front, in parallel threads (XLA releases the GIL)."""
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    if jax.process_count() > 1:  # warming runs collectives: every process must issue them in one order
        workers = 1

    def one(job):
        case, pair, run_kw = job
        scheme = schemes[case.k]
        _guarded(lambda: engine.warm(scheme, pair.target, pair.draft, **run_kw), scheme, case.name)

    first_of_group = {j[0].group: j for j in reversed(jobs)}  # same shapes: one compile
    with ThreadPoolExecutor(workers) as pool:
        for f in [pool.submit(one, j) for j in first_of_group.values()]:
            f.result()


_holm_all = holm_all  # the name callers beside the battery import
