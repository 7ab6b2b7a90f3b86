"""The floating-point edge of a host sampler's generator: its uniforms set to 0 and 1 - 2^-24."""

from __future__ import annotations

import functools
import time

import numpy as np

from ..models import TableModel, validate_table

from .sampler import HostSampler, load_sampler
from .run import _Caller


EXTREME_VALUES = (0.0, float(np.float32(1.0) - np.float32(2.0**-24)))  # float32 uniforms: 0 and 1 - 2^-24
MAX_SLOT = 64  # a found state serves every uniform slot below this


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


def host_boundary_check(sampler, target: TableModel, draft: TableModel, *, k: int):
    """Call the sampler with each of its first k uniforms at exactly 0 and at 1 - 2^-24; hard checks only.

    For each slot i and value: the drafts before slot i are a token the target accepts whatever
    the uniform (p >= q), the draft at slot i a token the target gives probability 0 but the draft
    does not (what an ``u <= p / q`` rule lets through at u = 0), or, without such a token, the least
    likely token under p; the sampler's generator (numpy or torch, passed or global) is set to a
    state whose i-th next float32 uniform is the value (:func:`extreme_states`). One round per slot
    and value, batch of 1. A round fails when it emits a token outside [0, V), a token the target
    gives probability 0, a number of tokens outside [1, k + 1], or (rule "standard") a token before
    the last that is not the draft at its place. Returns a :class:`specsample.boundary.BoundaryResult`.

    This assumes the sampler draws its acceptance uniforms first, one float32 per draft in order
    (as ``torch.rand(k)`` / ``rng.random(k, dtype=np.float32)`` do); a sampler drawing float64 numpy
    uniforms meets 0 with probability 2^-53 per draw, which this pass does not try to reach.
    """
    from ..boundary import BoundaryResult

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
    rounds, violations, first = 0, 0, ""
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

                gen = torch.Generator().manual_seed(seed)
                torch.rand(burn, generator=gen)
                if s.rng == "torch":
                    call.generator = gen
                else:  # the global generator, put in the same state
                    torch.default_generator.set_state(gen.get_state())
                    call.seed_global = False
            tokens, n = call(drafts, q_rows, p_rows)
            rounds += 1
            bad = _round_violation(tokens, n, drafts, p, k, s.rule)
            if bad:
                violations += 1
                first = first or f"uniform {i} = {value:.9g}: {bad} (drafts {drafts[0].tolist()})"
    detail = (f"{rounds} rounds, each acceptance uniform at 0 and 1 - 2^-24 via {kind} generator states; "
              + (f"first violation: {first}" if violations else "no violation"))
    return BoundaryResult(rounds, violations, detail)


def _round_violation(tokens, n, drafts, p, k: int, rule) -> str:
    """What a single round broke, in words ("" when nothing)."""
    v = p.size
    if tokens.shape != (1, k + 1) or n.shape != (1,):
        return f"output shapes {tokens.shape} and {n.shape}"
    m = int(n[0])
    if not 1 <= m <= k + 1:
        return f"n_emitted = {m} outside [1, {k + 1}]"
    out = tokens[0, :m]
    if np.any((out < 0) | (out >= v)):
        return f"token ids {out.tolist()} outside [0, {v})"
    zero = [int(t) for t in out if p[t] == 0]
    if zero:
        return f"emitted token {zero[0]}, which the target gives probability 0"
    if rule == "standard" and np.any(out[: m - 1] != drafts[0, : m - 1]):
        return f"emitted {out.tolist()}, whose first {m - 1} are not the drafts"
    return ""


def _boundary_case(s: HostSampler, c, seed: int):
    """The boundary pass as a case: the sampler's generator set to states whose uniforms are 0 and 1 - 2^-24."""
    from ..report import CaseResult, TestResult

    pair = c.pair(seed)
    t0 = time.perf_counter()
    r = host_boundary_check(s, pair.target, pair.draft, k=c.k)
    test = TestResult("boundary-uniforms", float(r.violations), 1.0 if r.passed else 0.0, hard=True, detail=r.detail)
    return CaseResult(name=c.name, scheme=s.name, family=c.family, model=c.model, vocab=c.vocab, k=c.k,
                      length=c.length, sequences=0, rounds=r.rounds, tests=[test], min_detectable_tv=float("nan"),
                      seconds=time.perf_counter() - t0)
