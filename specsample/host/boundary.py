"""The floating-point edge of a host sampler's generator: its uniforms set to 0 and 1 - 2^-24."""

from __future__ import annotations

import sys

import functools
import time
from typing import Optional

import numpy as np

from ..models.tables import TableModel, validate_table

from .eager import compilation_off
from .sampler import HostSampler, load_sampler
from .run import OutOfTime, _Caller


EXTREME_VALUES = (0.0, float(np.float32(1.0) - np.float32(2.0**-24)))  # float32 uniforms: 0 and 1 - 2^-24
MAX_SLOT = 64  # a found state serves every uniform slot below this
PROBE_MASS = 1e-6  # the interception's probe round: the forbidden token allowed, rarely enough to stay rejected


def _float32_draws(kind: str, seed: int, n: int):
    """The first ``n`` float32 uniforms of a generator of ``kind`` seeded with ``seed``."""
    if kind == "numpy":
        return np.random.Generator(np.random.PCG64(seed)).random(n, dtype=np.float32)
    import torch

    return torch.rand(n, generator=torch.Generator().manual_seed(seed)).numpy()


@functools.lru_cache(maxsize=None)
def extreme_states(kind: str, draws: int = 1 << 16, max_seeds: int = 1 << 15) -> dict:
    """Generator states whose next float32 uniform is exactly 0, and exactly 1 - 2^-24.

    Each value is ``(seed, position)``: seeded with ``seed``, the generator's float32 draw at index
    ``position`` (>= :data:`MAX_SLOT`) is the extreme value. So a sampler's i-th uniform is that value
    when ``position - i`` draws are burnt after seeding. Either value comes once in 2^24 draws, so the
    search reads about 2^24 draws per value (~0.5 s for numpy, ~3 s for torch on a 2-core CPU).
    ``kind`` is "torch" (torch's CPU generator, also the global one) or "numpy" (PCG64, draws made
    with ``random(dtype=np.float32)``).
    """
    found = {}
    for seed in range(max_seeds):
        x = _float32_draws(kind, seed, draws)
        for value in EXTREME_VALUES:
            if value not in found:
                hit = np.flatnonzero(x[MAX_SLOT:] == np.float32(value))
                if hit.size:
                    found[value] = (seed, int(hit[0]) + MAX_SLOT)
        if len(found) == len(EXTREME_VALUES):
            return found
    raise RuntimeError(f"no {kind} generator state with an extreme float32 uniform in {max_seeds} seeds")


_MT_LEFT, _MT_NEXT, _MT_WORDS = 8, 16, 24  # byte offsets in torch's CPU generator state (mt19937, 8-byte words)


def crafted_zero_state(slot: int, words: int = 1, seed: int = 0):
    """A torch CPU generator whose ``slot``-th next uniform is exactly 0 (``words`` 32-bit outputs a value:
    1 for float32, 2 for float64), crafted rather than searched.

    The mt19937 state is read back as bytes: after a draw has twisted it, the words the next outputs
    are read from (tempered: a zero word gives a zero output) are set to 0. Checked on use: the state
    layout is torch's, so a layout other than the one expected raises instead of misleading.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    torch.rand(1, generator=gen)  # twist: every state word fresh, the next word index known
    state = gen.get_state().numpy().copy()
    nxt = int(np.frombuffer(state[_MT_NEXT : _MT_NEXT + 4].tobytes(), np.uint32)[0])
    left = int(np.frombuffer(state[_MT_LEFT : _MT_LEFT + 4].tobytes(), np.int32)[0])
    first = nxt + slot * words
    if state.size != _MT_WORDS + 8 * 629 or first + words > 624 or left < (slot + 1) * words + 1:
        raise RuntimeError("torch's generator state has a layout this version of specsample does not know")
    for j in range(first, first + words):
        state[_MT_WORDS + 8 * j : _MT_WORDS + 8 * j + 8] = 0
    gen.set_state(torch.from_numpy(state))
    return gen


def host_boundary_check(sampler, target: TableModel, draft: TableModel, *, k: int):
    """Call the sampler with each of its first k uniforms at exactly 0 and at 1 - 2^-24; hard checks only.

    For each slot i and value: the drafts before slot i are a token the target accepts whatever
    the uniform (p >= q), the draft at slot i a token the target gives probability 0 but the draft
    does not (what an ``u <= p / q`` rule lets through at u = 0), or, without such a token, the least
    likely token under p; the sampler's generator (numpy or torch, passed or global) is set to a
    state whose i-th next float32 uniform is the value (:func:`extreme_states`; for torch and the value 0
    a crafted state, :func:`crafted_zero_state`). One round per slot
    and value, batch of 1. A round fails when it emits a token outside [0, V), a token the target
    gives probability 0, a number of tokens outside [1, k + 1], or (rule "standard") a token before
    the last that is not the draft at its place. Returns a :class:`specsample.battery.boundary.BoundaryResult`.

    This assumes the sampler draws its acceptance uniforms first, one float32 per draft in order
    (as ``torch.rand(k)`` / ``rng.random(k, dtype=np.float32)`` do); a sampler drawing float64 numpy
    uniforms meets 0 with probability 2^-53 per draw, which this pass does not try to reach.
    """
    from ..battery.boundary import BoundaryResult
    from ..battery.edges import Edge, round_violation

    s = load_sampler(sampler)
    p = validate_table(np.asarray(target.table), "target table").reshape(-1, np.shape(target.table)[-1])[0]
    q = validate_table(np.asarray(draft.table), "draft table").reshape(-1, np.shape(draft.table)[-1])[0]
    v = p.size
    if k >= MAX_SLOT:
        raise ValueError(f"the boundary pass covers k < {MAX_SLOT}, got k = {k}")
    kind = "numpy" if s.rng == "numpy" else "torch"
    states = extreme_states(kind)
    safe = int(np.argmax(np.where(q > 0, p - q, -np.inf)))  # accepted whatever u when p >= q
    hazards = np.flatnonzero((p == 0) & (q > 0))
    hazard = int(hazards[0]) if hazards.size else int(np.argmin(np.where(q > 0, p / np.maximum(q, 1e-300), np.inf)))
    q_rows = np.broadcast_to(q, (1, k, v)).astype(np.float32)
    p_rows = np.broadcast_to(p, (1, k + 1, v)).astype(np.float32)
    from . import intercept

    rounds, violations, first = 0, 0, ""
    checked = confirmed = 0  # rounds whose draws were seen, and of those the rounds whose uniform was the value set
    missed = first_draw = ""
    for i in range(k):
        drafts = np.array([[safe] * i + [hazard] * (k - i)], np.int64)
        for value in EXTREME_VALUES:
            seed, position = states[value]
            call = _Caller(s, 0, "boundary")
            burn = position - i
            if kind == "numpy":
                call.generator = np.random.Generator(np.random.PCG64(seed))
                call.generator.random(burn, dtype=np.float32)
            else:
                import torch

                if value == 0.0:  # crafted, not searched: the i-th next 32-bit output is made 0
                    gen = crafted_zero_state(i)
                else:
                    gen = torch.Generator().manual_seed(seed)
                    torch.rand(burn, generator=gen)
                if s.rng == "torch":
                    call.generator = gen
                else:  # the global generator, put in the same state
                    torch.default_generator.set_state(gen.get_state())
                    call.seed_global = False
            rec = intercept.Interceptor()  # what the sampler drew, to confirm the value set took effect
            if isinstance(call.generator, np.random.Generator):
                call.generator = intercept.wrap_numpy(call.generator, {"interceptor": rec})
            with compilation_off(s.fn), rec:
                tokens, n = call(drafts, q_rows, p_rows)
            rounds += 1
            took = _took_effect(rec, i, value)
            d = _first_uniform(rec)[0]
            first_draw = first_draw or (intercept.describe([d]) if d is not None else "")
            if took is not None:
                checked += 1
                confirmed += took
                if not took:
                    missed = missed or (f"uniform {i} = {value:.9g} set, but the sampler's uniform at slot {i} was "
                                        f"{_first_uniform(rec)[1][i]:.9g}")
            bad = (f"output shapes {tokens.shape} and {n.shape}" if tokens.shape != (1, k + 1) or n.shape != (1,)
                   else round_violation(tokens[0], n[0], drafts[0], Edge("boundary", "", p, q, hazard), k, i, s.rule))
            if bad:
                violations += 1
                first = first or f"uniform {i} = {value:.9g}: {bad} (drafts {drafts[0].tolist()})"
    seen = (f"; the value set took effect in {confirmed} of the {checked} rounds whose draws were seen (in "
            f"{first_draw}, the sampler's first float32 uniform draw)"
            + (f" (first miss: {missed})" if missed else "") if checked else
            "; the sampler's draws were not seen, so the values set are not confirmed")
    detail = (f"{rounds} rounds, each acceptance uniform at 0 and 1 - 2^-24 via {kind} generator states{seen}; "
              + (f"first violation: {first}" if violations else "no violation"))
    if checked and not confirmed and not violations:
        detail = (f"not reached: the generator states set each uniform slot to 0 and 1 - 2^-24, but in none of the "
                  f"{checked} rounds whose draws were seen did the sampler's acceptance uniform take that value "
                  f"({missed}): it draws other values first. The interception pass forces the draws it sees.")
    return BoundaryResult(rounds, violations, detail, confirmed if checked else None)


def _first_uniform(rec):
    """The sampler's first float32 uniform draw and the values kept of it: ``(Draw, values)``, or ``(None, None)``."""
    from . import intercept

    for d, v in zip(rec.draws, rec.values):
        if d.kind == intercept.UNIFORM and d.dtype.replace("torch.", "") in ("float32", "float"):
            return d, v
    return None, None


def _took_effect(rec, slot: int, value: float):
    """Whether the first float32 uniform draw holds ``value`` at ``slot`` (None: no such draw seen)."""
    v = _first_uniform(rec)[1]
    if v is None or slot >= v.size:
        return None
    return bool(np.float32(v[slot]) == np.float32(value))


def _intercept_rows(k: int):
    """Rows for the interception pass: p forbids token 5, which q drafts with probability 0.3, and
    token 2 has p >= q (accepted whatever the uniform) to reach later slots."""
    from ..battery.edges import Edge

    q = np.array([0.05, 0.1, 0.2, 0.1, 0.05, 0.3, 0.1, 0.1], np.float32)
    p = np.array([0.1, 0.1, 0.3, 0.2, 0.1, 0.0, 0.1, 0.1], np.float32)
    return Edge("intercepted", "p(5) = 0, q(5) = 0.3", p, q, 5, 2)


def host_intercept_check(sampler, *, k: int, seed: int = 0, max_elements: int = 64):
    """Every value the sampler draws (torch or numpy), in turn, at its extremes; hard checks only.

    For each slot i the hazard (a token p forbids and q drafts) is drafted after i safe drafts, and
    one more round drafts only safe tokens, so that it emits its bonus (self-drafting samplers draft
    from the same rows themselves, hazard first, then from q = p for the bonus round); one call is recorded
    (:class:`specsample.host.intercept.Interceptor`), then repeated once per (draw, element, extreme value)
    with that value forced and the same generator state otherwise. Returns an
    :class:`specsample.battery.edges.EdgeResult` whose ``reached`` counts the forced settings that met their
    draw: 0 when the sampler draws nothing specsample can intercept ("not reached").
    """
    from . import intercept
    from ..battery.edges import Tally
    from .run import _HostModel

    s = load_sampler(sampler)
    edge = _intercept_rows(k)
    v = edge.p.size
    q_rows = np.broadcast_to(edge.q, (1, k, v)).astype(np.float32)
    p_rows = np.broadcast_to(edge.p, (1, k + 1, v)).astype(np.float32)
    self_drafting = s.drafts == "self"
    dev = s.device if s.arrays == "torch" else False
    # the probe: the same rows but the hazard allowed at 1e-6, so that a round still rejects it (as the
    # edge's) while a forced value that feeds the output moves it (u = 0 accepts it, E = 0 picks it)
    p_probe = edge.p.astype(np.float64)
    p_probe[edge.hazard] = PROBE_MASS
    p_probe = (p_probe / p_probe.sum()).astype(np.float32)

    def host_models(p_row):
        target = _HostModel(p_row[None], 0, 1, s.target_inputs == "logits", dev)
        # a self-drafting sampler's bonus round: it drafts from q = p, so every draft is accepted whatever
        # the uniform (p / q = 1) and never the hazard, and the round emits its bonus from p
        return ((_HostModel(edge.q[None], 0, 1, s.draft_inputs == "logits", dev), target),
                (_HostModel(p_row[None], 0, 1, s.draft_inputs == "logits", dev), target))

    rows_of = {False: (p_rows, host_models(edge.p)), True: (np.broadcast_to(p_probe, (1, k + 1, v)).copy(),
                                                            host_models(p_probe))}
    tally = Tally()
    seen: list = []

    def one(slot, icpt, call=None, probe=False):
        call = call or _Caller(s, seed, f"intercept/{slot}")
        box = {"interceptor": icpt}
        if isinstance(call.generator, np.random.Generator):
            call.generator = intercept.wrap_numpy(call.generator, box)
        drafts = np.array([[edge.safe] * slot + [edge.hazard] * (k - slot)], np.int64)
        p_use, (models, bonus_models) = rows_of[probe]
        with icpt:
            if self_drafting:
                tokens, n, drafts = call.call_self(np.zeros((1, 1), np.int64), *(bonus_models if slot == k else models),
                                                   k)
            else:
                tokens, n = call(drafts, q_rows, p_use)
        return tokens[0], n[0], np.asarray(drafts)[0][:k]

    def could_fire(slot, draws) -> Optional[dict]:
        """(draw, element) -> whether forcing it moved the probe round's output; None when the probe
        drew otherwise than the edge's call (its draws depend on the rows)."""
        base_rec = intercept.Interceptor()
        base = one(slot, base_rec, probe=True)
        if [(d.function, d.kind, d.shape) for d in base_rec.draws] != [(d.function, d.kind, d.shape) for d in draws]:
            return None
        moved: dict = {}
        for setting in intercept.settings(draws, max_elements):
            icpt = intercept.Interceptor(setting)
            t, n, d = one(slot, icpt, probe=True)
            role = ("drafts" if not np.array_equal(d, base[2]) else "acceptance" if n != base[1] else
                    "last token" if not np.array_equal(t[:n], base[0][:n]) else None)
            if icpt.applied and role:
                roles.setdefault(draws[setting[0]].site, set()).add(role)
            moved[setting[:2]] = moved.get(setting[:2], False) or (icpt.applied and role is not None)
        return moved

    # slot k: every draft the safe token (p >= q: accepted whatever the uniform), so the round emits
    # its bonus from p's row k, which forbids the hazard: the bonus sampler's draws are forced where
    # they can show (an exponential race argmax(p / E) with E = 0 at p = 0 gives 0 / 0 = NaN there)
    unseen: dict = {}  # generator kind -> calls whose generator advanced beyond the draws intercepted
    per_site: dict = {}  # draw site (function, dtype, shape, line) -> (settings that met their draw, that could fire)
    roles: dict = {}  # draw site -> what its forced values changed in a probe round: drafts, acceptance, last token
    unprobed = 0  # calls whose probe drew otherwise (row-dependent draws): their settings count as could fire
    with compilation_off(s.fn) as turned_off:  # compiled code as Python: its draws seen and forced
        for slot in (list(range(k + 1)) if not self_drafting else [0, k]):
            call = _Caller(s, seed, f"intercept/{slot}")
            gens = _torch_generators(call)
            np_gens = [call.generator] if isinstance(call.generator, np.random.Generator) else []
            if s.rng == "torch-global":  # seeded now, as each forced call will be: a seed is not a draw
                call._seed_global()
                call.seed_global = False
            if gens or np_gens:
                _, rec, hidden = intercept.unseen_draws(lambda icpt: one(slot, icpt, call), gens, np_gens)
                for kind in hidden:
                    unseen[kind] = unseen.get(kind, 0) + 1
            else:
                rec = intercept.Interceptor()
                one(slot, rec, call)
            seen += rec.draws
            fire = could_fire(slot, rec.draws)
            unprobed += fire is None
            for setting in intercept.settings(rec.draws, max_elements):
                icpt = intercept.Interceptor(setting)
                tokens, n, drafts = one(slot, icpt)
                hit = np.flatnonzero(drafts == edge.hazard)
                live = icpt.applied and (fire is None or fire.get(setting[:2], False))
                site = rec.draws[setting[0]].site
                forced = f"{rec.draws[setting[0]].function} draw {setting[0]} element {setting[1]} = {setting[2]:.9g}"
                tally.add(edge, int(hit[0]) if hit.size else -1, tokens, n, drafts, k, s.rule, reached=live,
                          forced=forced, site=site)
                met, fired = per_site.get(site, (0, 0))
                per_site[site] = (met + int(icpt.applied), fired + int(live))
    sites = ", ".join(f"{site}{_roles(roles.get(site))} {f} of {m}" for site, (m, f) in per_site.items()) or "none"
    note = (f"; {unprobed} of the calls drew otherwise on the probe's rows, and their settings count as could fire"
            if unprobed else "")
    compiled = (f"; compiled code run as Python for this pass: {', '.join(turned_off)}" if turned_off else "")
    r = tally.result(f"each of {len(intercept.settings(seen, 1 << 30)) // 2} drawn values at its extremes; "
                     f"settings that could fire (met their draw and moved a probe round's output, the forbidden "
                     f"token at {PROBE_MASS:g}) of those that met it, per draw site: {sites}{note}{compiled}; draws seen: "
                     f"{intercept.describe(seen[: 8])}")
    if r.violations and compiled:  # a violation found in code that ran compiled until this pass: say so
        r = r._replace(detail=r.detail + compiled)
    if unseen and not r.violations:  # partly reached: never a plain pass
        why = []
        if "torch" in unseen:
            why.append(f"in {unseen['torch']} of the recorded calls the sampler's torch generator advanced beyond the "
                       "draws intercepted: draws inside TorchScript or other compiled code were not forced; run with "
                       "TorchScript off (PYTORCH_JIT=0 specsample verify ...) to reach them")
        if "numpy" in unseen:
            why.append(f"in {unseen['numpy']} of the recorded calls the numpy Generator passed in advanced beyond the "
                       "draws intercepted: methods specsample does not force (normal, permutation, ...) were used; "
                       "draw uniforms with random() or uniform(), exponentials with exponential() or "
                       "standard_exponential(), to reach them")
        r = r._replace(reached=0, detail=(f"partly reached: {'; '.join(why)} (draws seen: "
                                          f"{intercept.describe(seen[:8])}). Of what was seen: {r.detail}"))
    return r


def _roles(found) -> str:
    """`` (decides acceptance, the last token)``: what a site's forced values changed, or ''."""
    order = ("drafts", "acceptance", "last token")
    return f" (decides {', '.join(r for r in order if r in found)})" if found else ""


def _torch_generators(call) -> list:
    """The torch generators a call can draw from: the one passed to the sampler, and the global one."""
    torch = sys.modules.get("torch")
    if torch is None or call.s.rng == "numpy":
        return []
    gens = [torch.default_generator]
    if isinstance(call.generator, torch.Generator) and call.generator.device.type == "cpu":
        gens.append(call.generator)
    return gens


def _first_draw_note(s: HostSampler, k: int) -> str:
    """Why the generator-state pass does not reach this sampler ("" when it does): its first draw
    must be float32 uniforms, at least k of them, which is what the found states control."""
    from . import intercept

    if s.drafts == "self":
        return "a self-drafting sampler draws its drafts first"
    edge = _intercept_rows(k)
    call = _Caller(s, 0, "probe")
    box: dict = {}
    rec = intercept.Interceptor()
    box["interceptor"] = rec
    if isinstance(call.generator, np.random.Generator):
        call.generator = intercept.wrap_numpy(call.generator, box)
    with compilation_off(s.fn), rec:  # a uniform drawn inside TorchScript is still the generator's first draw
        call(np.array([[edge.safe] * k], np.int64), np.broadcast_to(edge.q, (1, k, 8)).astype(np.float32),
             np.broadcast_to(edge.p, (1, k + 1, 8)).astype(np.float32))
    if not rec.draws:
        return "no draw of the sampler was seen"
    d = rec.draws[0]
    if d.kind != intercept.UNIFORM or d.dtype.replace("torch.", "") not in ("float32", "float") or d.size < k:
        return f"its first draw is {intercept.describe([d])}, not float32 uniforms"
    return ""


def _boundary_case(s: HostSampler, c, seed: int):
    """The floating-point edges as a case: generator states, intercepted draws, edge rows (hard checks)."""
    from ..battery.edges import as_test
    from .edges import host_edge_check, self_drafting_edge_check
    from ..battery.report import CaseResult, TestResult
    from .sampler import HostSamplerError

    pair = c.pair(seed)
    t0 = time.perf_counter()
    tests, rounds = [], 0
    try:
        note = _first_draw_note(s, c.k)
        if note:  # the states found control float32 uniforms drawn first: say what it cannot reach
            tests.append(TestResult("boundary-uniforms", 0.0, 1.0, hard=True, reached=False,
                                    detail=f"not reached: {note} (the interception pass covers it)"))
        else:
            r = host_boundary_check(s, pair.target, pair.draft, k=c.k)
            rounds += r.rounds
            tests.append(TestResult("boundary-uniforms", float(r.violations), 1.0 if r.passed else 0.0, hard=True,
                                    detail=r.detail, reached=r.confirmed != 0 or not r.passed))
        r = host_intercept_check(s, k=c.k, seed=seed)
        rounds += r.rounds
        t = as_test(r)
        tests.append(TestResult("boundary-intercepted", t.statistic, t.pvalue, hard=True, detail=r.detail,
                                reached=t.reached))
        call = _Caller(s, seed, "edges")
        e = (self_drafting_edge_check(call, c.k, s.rule, logits=s.draft_inputs == "logits",
                                      torch_arrays=s.device if s.arrays == "torch" else False) if s.drafts == "self"
             else host_edge_check(call, c.k, s.rule))
        rounds += e.rounds
        tests.append(as_test(e))
    except HostSamplerError as err:  # a sampler that raises on an edge fails this case; the others still run
        tests.append(TestResult("boundary-raised", 1.0, 0.0, hard=True, detail=str(err)))
    except OutOfTime:  # --time: the pass's share ran out; what it did not reach is said, never passed
        done = ", ".join(t.name for t in tests) or "none"
        tests.append(TestResult("boundary-cut-short", 0.0, 1.0, hard=True, reached=False,
                                detail=f"not reached: the boundary pass's share of --time ran out after "
                                       f"{time.perf_counter() - t0:.1f} s (checks finished: {done}); give more "
                                       "time (--time) for the rest"))
    return CaseResult(name=c.name, scheme=s.name, family=c.family, model=c.model, vocab=c.vocab, k=c.k,
                      length=c.length, sequences=0, rounds=rounds, tests=tests, min_detectable_tv=float("nan"),
                      seconds=time.perf_counter() - t0)
