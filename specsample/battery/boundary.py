"""The floating-point edge of the generator: every uniform slot at its extreme values.

A sampler can be wrong only where its uniforms take their extreme values: exactly 0, or the
largest float32 below 1 (1 - 2^-24). ``jax.random.uniform`` returns each about once in 2^23
draws, so no statistical budget sees a bug that lives there, such as an acceptance test
``u <= p / q`` (at u = 0 it accepts a draft whose target probability is 0) or an inverse
CDF that runs off the end of its row at u -> 1. This pass feeds those values on purpose and
checks only what must hold for every single draw: emitted token ids in [0, V), no token the
output law gives probability 0 in its context, and a number of emitted tokens in
[1, max_tokens]. One violation is a failure.

It applies to schemes whose randomness is a vector of uniforms (:class:`UniformStep`, as every
built-in scheme and control is): each slot is set in turn to each extreme value, and then
every slot at once, over many lanes with random other uniforms and random contexts.
"""

from __future__ import annotations

import functools
from typing import Optional, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import program_cache
from ..models.tables import TableModel, pair_for_device, window_index
from ..schemes import Scheme, UniformStep, program_identity

EXTREMES = (0.0, float(np.nextafter(np.float32(1.0), np.float32(0.0))))  # 0 and 1 - 2^-24
LANES = 64


class BoundaryResult(NamedTuple):
    """Rounds checked, how many broke a hard rule, and the first broken one in words."""

    rounds: int
    violations: int
    detail: str
    # rounds whose forced value was seen to take effect (None: not checked); 0 of some: reached nothing
    confirmed: Optional[int] = None

    @property
    def passed(self) -> bool:
        return self.violations == 0


def _first_pair(model: TableModel) -> TableModel:
    table = np.asarray(model.table)
    return TableModel(table[0] if table.ndim == 3 else table, model.order)


@functools.lru_cache(maxsize=64)
def _vmapped(round_fn):
    # lanes on the last axis, as the engine lays them out
    return jax.jit(jax.vmap(round_fn, in_axes=(1, None, None, 1)))


def boundary_check(scheme: Scheme, target: TableModel, draft: TableModel, law: np.ndarray | None = None, *,
                   lanes: int = LANES, seed: int = 0) -> BoundaryResult:
    """Run ``scheme``'s round with each uniform slot at each extreme value and check hard rules.

    Parameters
    ----------
    scheme : Scheme
        Its ``step`` must be a :class:`UniformStep`; otherwise nothing is checked
        (``rounds = 0``, the detail says why).
    target, draft : TableModel
        The pair (the first pair of a batch is used).
    law : array, optional
        The output law's table (default: the target's), where a zero is a forbidden token.
    lanes : int
        Rounds per (slot, value) setting, each with random other uniforms and context.
    """
    if not isinstance(scheme.step, UniformStep):
        return BoundaryResult(0, 0, "not applicable: the scheme draws its own randomness from a key")
    if scheme.step.n == 0:
        return BoundaryResult(0, 0, "not applicable: the scheme uses no uniforms (deterministic)")
    t_host, d_host = _first_pair(target), _first_pair(draft)
    t, d = pair_for_device(t_host, d_host)
    law = np.asarray(t_host.table if law is None else (law[0] if np.ndim(law) == 3 else law), np.float64)
    n, v, width = scheme.step.n, t_host.vocab_size, max(t_host.order, d_host.order)
    settings = [(i, e) for i in range(n) for e in EXTREMES] + [(None, e) for e in EXTREMES]
    rng = np.random.default_rng(seed)
    u = rng.random((n, len(settings), lanes), dtype=np.float32)
    for s, (slot, e) in enumerate(settings):
        if slot is None:
            u[:, s] = e
        else:
            u[slot, s] = e
    u = u.reshape(n, -1)
    ctx = rng.integers(0, v, size=(width, u.shape[1])).astype(np.int32)
    # specsample's own scheme: the program loads in a new process
    out = program_cache.call(_vmapped(scheme.step.round), program_identity(scheme, "boundary-round"),
                             jnp.asarray(u), t, d, jnp.asarray(ctx))
    toks = np.asarray(out.tokens)  # [rounds, max_tokens]
    n_em = np.asarray(out.n_emitted)
    T = scheme.max_tokens
    bad_round = (n_em < 1) | (n_em > T)
    emitted = np.arange(T)[None, :] < np.clip(n_em, 0, T)[:, None]
    out_of_range = emitted & ((toks < 0) | (toks >= v))
    # each emitted token's context window, as a row of the law's table
    m = t_host.order
    full = np.concatenate([ctx.T.astype(np.int64), np.clip(toks, 0, v - 1)], axis=1)  # [rounds, width + T]
    rows = window_index(full[:, width - m:width + T - 1], m, v, np)  # [rounds, T]: row j precedes token j
    zero = emitted & ~out_of_range & (law[rows, np.clip(toks, 0, v - 1)] == 0)
    broken = bad_round | out_of_range.any(1) | zero.any(1)
    detail = f"{u.shape[1]} rounds with each of {n} uniform slots at 0 and at 1 - 2^-24"
    if broken.any():
        r = int(np.argmax(broken))
        slot, e = settings[r // lanes]
        where = "every slot" if slot is None else f"slot {slot}"
        what = (f"n_emitted = {n_em[r]}" if bad_round[r] else
                f"token {toks[r][out_of_range[r]][0]} outside [0, {v})" if out_of_range[r].any() else
                f"token {toks[r][zero[r]][0]} emitted where the target gives it probability 0")
        detail = f"{int(broken.sum())} of {u.shape[1]} rounds broken; first: {where} = {e:.9g}: {what}"
    return BoundaryResult(int(u.shape[1]), int(broken.sum()), detail)
