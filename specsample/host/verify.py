"""The battery for host samplers: cases, budgets (power, time), checkpoints, the report."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import time
import warnings
from typing import Callable, Optional

import numpy as np

from ..engine import checkpoint, compile_cache
from ..engine.lanes import Counts

from .sampler import HostNondeterminismWarning, HostSampler, load_sampler
from ..battery.diagnosis import Rounds
from ..battery.stages import play_host, stage_results
from .run import HostRun, _Caller, run_host
from .batch import batch_case
from .boundary import _boundary_case


HOST_CAPS = {"quick": 1 << 14, "default": 1 << 17, "thorough": 1 << 20, "certify": 1 << 18}  # sequences per case at most
HOST_STAGE_ROUNDS = 1 << 14  # rounds of a case's stage pass, at most
STAGE_SHARE = 0.2  # of a case's share of a time budget, left to its stage pass


def _stage_pass(s: HostSampler) -> bool:
    """Whether a sampler gets the stage pass: it claims the standard rule and verifies drafts specsample
    chose (a self-drafting sampler's drafts, and the rows behind them, are its own)."""
    return s.rule == "standard" and s.drafts != "self"


def _rule_scheme(sampler: HostSampler, k: int):
    """What the battery's tests read from a scheme (k and the acceptance theory), for a host sampler."""
    import stats

    from ..schemes import Scheme
    from ..schemes.standard import standard_law

    standard = sampler.rule == "standard"
    fixed_k = sampler.layout != "flat"  # ragged draft counts: accepted drafts per round follow no fixed-k law
    return Scheme(sampler.name, k, k + 1, None, accepted_law=standard_law(k) if standard and fixed_k else None,
                  token_acceptance=stats.per_token_acceptance if standard else None,
                  description=f"host sampler ({sampler.inputs}, rng {sampler.rng})",
                  rule="standard" if _stage_pass(sampler) else None)


def parse_time(value) -> Optional[float]:
    """Seconds from ``90``, ``90s``, ``10m`` or ``1h``; None passes through."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:], None)
        try:
            seconds = float(text[:-1]) * scale if scale else float(text)
        except ValueError:
            raise ValueError(f"a time budget is a number of seconds or 90s / 10m / 1h, got {value!r}") from None
    if not seconds > 0:
        raise ValueError(f"a time budget must be positive, got {value!r}")
    return seconds


def verify_host(sampler, *, budget="quick", seed: int = 0, alpha: float = 0.01, power: float = 0.99,
                cases: Optional[str] = None, k=(1, 4, 8), tv: Optional[float] = None, time_budget=None,
                batch: int = 4096, progress: Optional[Callable[[str, int, int], None]] = None,
                checkpoint_dir: Optional[str] = None, batch_calls: Optional[int] = None, **options):
    """Run the battery against a host sampler; returns a :class:`~specsample.battery.report.Report`.

    Parameters
    ----------
    sampler : callable, HostSampler or str
        The sampler (``path.py:fn`` or ``module:fn`` for a file's callable); ``options``
        (``inputs``, ``batched``, ``rng``, ``arrays``, ``rule``) say how to call it.
    budget : {"quick", "default", "thorough"} or int
        Sequences per case: what the power calculation asks for at the budget's TV, capped at
        :data:`HOST_CAPS` (host samplers are slower than the engine); an int is used as is.
    tv : float, optional
        Target minimum detectable total variation: each case runs exactly the sequences the power
        calculation asks for (no cap).
    time_budget : float or str, optional
        A bound on the sampling's time (``"10m"``; ``sampling_s`` in the report's ``engine["host"]``
        says how long it took; the tests on the counts run after it). The boundary pass runs first; then each case
        in turn gets an equal share of the time left, and runs until its share is spent or its
        power calculation (at the budget's or ``tv``'s TV) is met. No sequence starts after a
        case's deadline and every started one is finished, so the counts are unbiased but depend
        on the machine's speed: for reproducible counts give ``budget`` or ``tv`` instead.
    checkpoint_dir : str, optional
        Each finished case's counts are kept here (one file a case); a killed run started again
        with the same arguments loads them instead of sampling again, and ends with the counts of
        an uninterrupted run. A case is the unit: one killed half way is sampled again.
    batch_calls : int, optional
        Calls of the batch pass with the probe alone (half as many amid neighbours, two copies each):
        default :data:`specsample.host.batch.ALONE_CALLS`. Its detail states the smallest shift of the
        probe's law it detects, which shrinks as one over the square root of the calls.
    k, cases, seed, alpha, power
        As :func:`specsample.verify`. The cases are the battery's table cases (pair families and
        n-gram models; not the sweep, the boundary pass or the transformer cases), the boundary pass
        (``boundary/V8/k4``) and the batch pass (``batch/V8/k4``, batched samplers given their drafts).
        The batch pass runs with the whole battery, or when ``cases`` names it; ``!batch*`` leaves it
        out, and a selection of other cases only (the boundary pass alone, say) does not run it.

    Examples
    --------
    >>> report = verify_host("my_sampler.py:verify", budget="quick", k=4)  # doctest: +SKIP
    """
    import jax

    import stats

    from ..battery import suite as battery
    from ..battery.report import CaseResult, Report

    s = load_sampler(sampler, **options)
    compile_cache.release_if_crowded()
    alpha = stats.multiplicity.check_level(alpha)
    power = stats.multiplicity.check_level(power, "power")
    seed = battery.check_seed(seed)
    ks = battery._draft_lengths(k)
    seconds = parse_time(time_budget)
    if tv is not None and not 0 < float(tv) < 1:
        raise ValueError(f"tv is a total variation in (0, 1), got {tv!r}")
    bud, explicit, budget = battery.resolve_budget(budget)
    plan = [c for c in battery.default_cases(bud, ks) if c.k in ks and not (c.neural or c.sweep)]
    plan = [c for c in plan if c.name not in _serving_left_out(cases)]
    # the batch pass is a case of its own name on the boundary case's pair: selected, or excluded, by name
    batched = {f"batch/V{c.vocab}/k{c.k}": c for c in plan if c.boundary} if s.batched and s.drafts == "given" \
        else {}
    plan = battery.select(plan + [dataclasses.replace(c, name=n) for n, c in batched.items()], cases)
    batch_plan = [batched[n] for n in _batch_names(plan, batched, cases)]
    plan = [c for c in plan if c.name not in batched]
    schemes = {kk: _rule_scheme(s, kk) for kk in ks}
    m = sum(battery._planned_tests(c, schemes[c.k]) for c in plan) + 2 * len(batch_plan)
    level = alpha / max(1, m)
    target_tv = float(tv) if tv is not None else bud.tv

    def need(c):
        if explicit:
            return explicit
        n = stats.samples_for_tv(target_tv, c.vocab - 1, level, power).n
        return n if tv is not None else min(n, HOST_CAPS.get(bud.name, HOST_CAPS["default"]))

    t_start = time.perf_counter()
    rank = {c.name: i for i, c in enumerate(plan)}  # the report keeps the plan's order
    boundary = [c for c in plan if c.boundary]
    plan = [c for c in plan if not c.boundary]
    sizes = {c.name: need(c) for c in plan}
    results = []
    passes = _pass_budget(s, boundary, batch_plan, plan, seed, t_start, seconds, batch_calls, level, power) \
        if seconds is not None and (boundary or batch_plan) else None
    for c in boundary:  # first, so that a time budget shares what is left among the statistical cases
        with _pass_clock(passes, "boundary", c.name, progress):
            results.append(_boundary_case(s, c, seed))
    for c in batch_plan:  # the probe alone and amid neighbours, on the boundary case's pair
        calls = batch_calls if passes is None else passes["batch_calls"]
        if calls is not None and calls < MIN_BATCH_CALLS:
            results.append(_batch_not_run(s, c, passes))
        else:
            with _pass_clock(passes, "batch", f"batch/V{c.vocab}/k{c.k}", progress):
                results.append(batch_case(s, c, seed, level=level, power=power, calls=calls))
        rank[results[-1].name] = rank.get(c.name, len(rank)) + 0.5
    skipped = []
    if seconds is not None and plan:  # a bound is a bound: every case run must afford its first calls
        plan, skipped = _fit_to_time(s, plan, sizes, seed, batch, t_start, seconds)
    sampled_at = time.perf_counter()  # when the sampler was last called (its timing calls too): --time bounds that
    run_stats = HostRun()
    total = sum(sizes.values())
    done_before = 0
    for i, c in enumerate(plan):
        pair = c.pair(seed)
        n = sizes[c.name]

        def tick(done, _total, _label=c.name, _base=done_before):
            if progress is not None:
                progress(_label, _base + done, total)

        deadline = stage_deadline = None
        if seconds is not None:  # an equal share of the time left, so a case that ends early leaves more
            now = time.perf_counter()
            share = max(0.0, t_start + seconds - now) / (len(plan) - i)
            deadline, stage_deadline = now + (1 - STAGE_SHARE) * share, now + share
        case_stats = HostRun()
        ck = _case_checkpoint(checkpoint_dir, s, c, seed, n, seconds)
        counts, rounds = _load_case(ck, case_stats)
        if counts is None:
            counts = run_host(s, pair.target, pair.draft, k=c.k, sequences=n, length=c.length, seed=seed,
                              batch=batch, label=c.name, progress=tick, stats=case_stats, deadline=deadline)
            if _stage_pass(s):  # each stage of the round against its own law, on drafts and rows chosen here
                t0 = time.perf_counter()
                rounds = play_host(_Caller(s, seed, f"{c.name}/stages", case_stats.warnings), pair.target,
                                   pair.draft, c.k, min(HOST_STAGE_ROUNDS, n), seed=battery._case_seed(seed, c.name),
                                   batch=batch, deadline=stage_deadline)
                case_stats.seconds += time.perf_counter() - t0
            sampled_at = time.perf_counter()
            _save_case(ck, counts, case_stats, rounds)
        done_before += n
        for f in ("calls", "rounds", "sampler_seconds", "seconds"):
            setattr(run_stats, f, getattr(run_stats, f) + getattr(case_stats, f))
        run_stats.warnings += [w for w in case_stats.warnings if w not in run_stats.warnings]
        tests, extra = battery._case_tests(c, schemes[c.k], pair.target, pair.draft, counts.pair(0), level, power)
        if rounds is not None:
            stage_tests, extra["stages"] = stage_results(rounds, seed)
            tests += stage_tests
        marg0 = np.asarray(pair.target.table, np.float64).reshape(-1, pair.target.vocab_size)[0] \
            if pair.target.order == 0 else None  # a context-free case's first position: its planned claim
        results.append(CaseResult(name=c.name, scheme=s.name, family=c.family, model=c.model, vocab=c.vocab, k=c.k,
                                  length=c.length, sequences=int(counts.sequences[0]), rounds=int(counts.rounds[0]),
                                  tests=tests, seconds=case_stats.seconds, sequences_planned=int(n),
                                  min_detectable_tv_planned=battery._min_tv(marg0, int(n), level, power)
                                  if marg0 is not None else float("nan"), **extra))
    results.sort(key=lambda r: rank[r.name])
    battery._holm_all(results, alpha)
    from ..battery.memory import peak_rss_mib

    host_info = dict(sampler=s.name, inputs=s.inputs, batched=s.batched, rng=s.rng, arrays=s.arrays, rule=s.rule,
                     calls=run_stats.calls, rounds=run_stats.rounds, rounds_per_s=run_stats.rounds_per_s,
                     sampler_share=run_stats.sampler_seconds / run_stats.seconds if run_stats.seconds else None,
                     wasted_fraction=run_stats.wasted_fraction, tv=target_tv, time_budget_s=seconds,
                     sampling_s=sampled_at - t_start,
                     skipped_cases=skipped, warnings=run_stats.warnings, peak_rss_mib=peak_rss_mib())
    if skipped:
        host_info["warnings"] = [f"--time covers {len(plan)} of {len(plan) + len(skipped)} statistical cases at "
                                 f"this sampler's speed; not run: {', '.join(skipped)}"] + host_info["warnings"]
    for w in run_stats.warnings:
        warnings.warn(w, HostNondeterminismWarning, stacklevel=2)
    return Report(scheme=s.name, alpha=alpha, seed=int(seed), budget=str(budget), cases=results,
                  seconds=time.perf_counter() - t_start, power=power,
                  engine=dict(host=host_info, devices=jax.device_count()))


PASS_SHARE = 0.5  # of --time, at most, for the boundary and batch passes when statistical cases follow
MIN_BATCH_CALLS = 50  # fewer calls of the batch pass detect nothing worth its time: it is not run, and says so
def boundary_calls(k: int) -> int:
    """About the boundary pass's sampler calls at draft length k: 32, 152 and 424 at k = 1, 4, 8 for the
    numpy and torch reference samplers (generator states, interception, edge rows); a sampler that draws
    more values makes more, and the pass's deadline bounds them."""
    return 4 * k * k + 20 * k + 8


def _pass_budget(s: HostSampler, boundary: list, batch_plan: list, plan: list, seed: int, t_start: float,
                 seconds: float, batch_calls, level: float, power: float) -> dict:
    """``--time`` for the boundary and batch passes: one call is timed, each pass gets a deadline, the batch
    pass as many calls as its share affords; a budget the boundary pass alone cannot fit is refused at once."""
    from .batch import ALONE_CALLS
    from .run import _Caller

    c = (boundary or batch_plan)[0]
    pair = c.pair(seed)
    v = pair.target.vocab_size
    q = np.broadcast_to(np.asarray(pair.draft.table, np.float32).reshape(-1, v)[0], (1, c.k, v)).copy()
    p = np.broadcast_to(np.asarray(pair.target.table, np.float32).reshape(-1, v)[0], (1, c.k + 1, v)).copy()
    t0 = time.perf_counter()
    _Caller(s, seed, "time-probe/passes")(np.zeros((1, c.k), np.int64), q, p)
    call = max(time.perf_counter() - t0, 1e-6)
    share = seconds * (PASS_SHARE if plan else 1.0) - (time.perf_counter() - t_start)
    need = call * sum(boundary_calls(b.k) for b in boundary)
    if boundary and need > share:
        raise ValueError(f"--time {seconds:g}s cannot cover the boundary pass: one sampler call took {call:.2f} s and "
                         f"the pass makes about {boundary_calls(c.k)} calls a case ({need:.0f} s), with "
                         f"{max(share, 0):.0f} s for it; give --time {int(need / (PASS_SHARE if plan else 1) + 1)}s "
                         f"or more, or leave the passes out (--cases '...,!boundary*,!batch*')")
    boundary_s = min(share, max(need * 3, share - (share / 2 if batch_plan else 0)))
    batch_s = max(0.0, share - boundary_s)
    calls = min(batch_calls or ALONE_CALLS, int(batch_s / (2.5 * call))) if batch_plan else None
    return {"call": call, "boundary_s": boundary_s / max(1, len(boundary)), "batch_s": batch_s / max(1, len(batch_plan)),
            "batch_calls": calls, "seconds": seconds}


@contextlib.contextmanager
def _pass_clock(passes: Optional[dict], kind: str, label: str, progress):
    """Under ``--time`` (``passes``), a pass runs against its deadline with progress from its first call."""
    from .run import clock

    if passes is None:
        yield
        return
    budget = passes[f"{kind}_s"]
    est = max(1, int(budget / passes["call"]))

    def tick(calls):
        if progress is not None:
            progress(label, min(calls, est), est)

    with clock(time.perf_counter() + budget, tick):
        yield


def _batch_not_run(s: HostSampler, c, passes: dict):
    """The batch pass's case when ``--time`` leaves it too few calls: not run, and why."""
    from ..battery.report import CaseResult, TestResult

    need = MIN_BATCH_CALLS * 2.5 * passes["call"]
    t = TestResult("batch-not-run", 0.0, 1.0, hard=True, reached=False,
                   detail=f"not reached: --time {passes['seconds']:g}s leaves {passes['batch_s']:.0f} s for the batch "
                          f"pass, {passes['batch_calls']} calls at {passes['call']:.2f} s a call, fewer than its "
                          f"{MIN_BATCH_CALLS} at the least (about {need:.0f} s); give more time (--time)")
    return CaseResult(name=f"batch/V{c.vocab}/k{c.k}", scheme=s.name, family=c.family, model=c.model, vocab=c.vocab,
                      k=c.k, length=c.length, sequences=0, rounds=0, tests=[t], min_detectable_tv=float("nan"))


def _serving_left_out(cases: Optional[str]) -> set:
    """The serving-vocabulary cases a host run leaves out unless ``cases`` names them: all but the first
    (a host sampler moves whole rows a round, so each costs a case of 32,768-token rows or more: the
    32,768-token case alone was most of a default host run)."""
    from ..battery.cases import SERVING_CASES, named

    serving = [f"{fam}/V{v}/k4" for fam, v, _ in SERVING_CASES[1:]]
    items = [p.strip() for p in (cases or "").split(",") if p.strip() and not p.strip().startswith("!")]
    return {n for n in serving if not any(named(n, p) for p in items)}


def _batch_names(chosen: list, batched: dict, cases: Optional[str]) -> list:
    """The batch passes to run: those ``cases`` names, and those beside a selected boundary case when the
    selection also holds a statistical case (a boundary-only selection runs none unless named); never one
    an exclusion (``!batch*``) names."""
    from ..battery.cases import named

    names = {c.name for c in chosen}
    wanted = {n for n in batched if n in names}
    if any(not c.boundary for c in chosen if c.name not in batched):
        wanted |= {n for n, c in batched.items() if c.name in names}
    drops = [p.strip()[1:].strip() for p in (cases or "").split(",") if p.strip().startswith("!")]
    wanted -= {n for n in batched for d in drops if named(n, d)}
    return [n for n in batched if n in wanted]


def _fit_to_time(s: HostSampler, plan: list, sizes: dict, seed: int, batch: int, t_start: float,
                 seconds: float) -> tuple[list, list]:
    """The cases whose first calls (the count's, and the stage pass's) fit in the time left, in plan
    order, and the names of those that do not (said at once, as a warning). One call of the first
    case's batch is timed first (its result is dropped); a time that covers no case is refused with
    the time that would."""
    from ..battery.memory import rounds_per_call
    from .run import FIRST_LANES, _Caller

    c = plan[0]
    pair = c.pair(seed)
    v = pair.target.vocab_size
    b = rounds_per_call(c.k, v, min(batch, FIRST_LANES, sizes[c.name]))  # a first call
    q_row = np.asarray(pair.draft.table, np.float64)[0]
    drafts = np.random.default_rng(seed).choice(v, size=(b, c.k), p=q_row / q_row.sum())
    q = np.broadcast_to(q_row.astype(np.float32), (b, c.k, v)).copy()
    p = np.broadcast_to(np.asarray(pair.target.table, np.float32)[0], (b, c.k + 1, v)).copy()
    t0 = time.perf_counter()
    _Caller(s, seed, "time-probe")(drafts, q, p)
    call = time.perf_counter() - t0
    # a case's first lanes run until their sequences are whole (at worst a round a token), then the
    # stage pass plays its first windows of three rounds
    per_case = call * (c.length + (3 if _stage_pass(s) else 0))
    used = time.perf_counter() - t_start
    fits = int(max(0.0, seconds - used) // per_case)
    if fits == 0:
        raise ValueError(f"--time {seconds:g}s cannot cover one case: {used:.1f} s went to the boundary pass and a "
                         f"timing call, and a case's first calls take about {per_case:.2f} s with this sampler "
                         f"({call:.2f} s a call of {b} rounds); give --time {int(used + len(plan) * per_case) + 1}s "
                         f"or more for every case to start")
    if fits < len(plan):
        warnings.warn(f"--time {seconds:g}s covers {fits} of {len(plan)} statistical cases at this sampler's speed "
                      f"({call:.2f} s a call): running {', '.join(x.name for x in plan[:fits])}; give --time "
                      f"{int(used + len(plan) * per_case * 3) + 1}s or more to run them all", TimeBudgetWarning,
                      stacklevel=3)
    return plan[:fits], [x.name for x in plan[fits:]]


class TimeBudgetWarning(UserWarning):
    """A time budget too short for every case: fewer cases run, and the report names the others."""


def _case_checkpoint(folder: Optional[str], s: HostSampler, c, seed: int, n: int, seconds) -> Optional[tuple]:
    """(path, signature) of a case's checkpoint, or None without a folder."""
    if folder is None:
        return None
    from ..engine.lanes import STREAM_VERSION

    fn = s.fn
    code = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    fields = {f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name != "fn"}
    sig = repr(("host", STREAM_VERSION, code, sorted(fields.items()), c.name, c.k, c.length, int(seed), int(n),
                seconds))
    digest = hashlib.sha256(sig.encode()).hexdigest()
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"host-{s.name}-{c.name.replace('/', '_')}-s{seed}-{digest[:10]}.npz"), digest


def _load_case(ck: Optional[tuple], run_stats: HostRun) -> tuple:
    """(counts, stage-pass rounds or None) of a finished case, or (None, None)."""
    saved = checkpoint.load(*ck) if ck else None
    if saved is None:
        return None, None
    for f in ("calls", "rounds"):
        setattr(run_stats, f, int(saved[f"stats_{f}"]))
    for f in ("sampler_seconds", "seconds"):
        setattr(run_stats, f, float(saved[f"stats_{f}"]))
    counts = Counts(**{name: (saved[name] if name in saved else None) for name in Counts._fields})
    rounds = None
    if "stage_drafts" in saved:
        arrays = Rounds._fields[: Rounds._fields.index("drafted")]  # the arrays; drafted and history are not kept
        rounds = Rounds(*(saved[f"stage_{f}"] for f in arrays), drafted=False)
    return counts, rounds


def _save_case(ck: Optional[tuple], counts: Counts, run_stats: HostRun, rounds: Optional[Rounds] = None) -> None:
    if not ck:
        return
    arrays = {name: v for name, v in counts._asdict().items() if v is not None}
    arrays.update({f"stats_{f}": getattr(run_stats, f) for f in ("calls", "rounds", "sampler_seconds", "seconds")})
    if rounds is not None:  # the case's stage pass is part of it: a resumed run does not call the sampler again
        arrays.update({f"stage_{f}": getattr(rounds, f) for f in Rounds._fields[: Rounds._fields.index("drafted")]})
    checkpoint.save(ck[0], ck[1], arrays)
