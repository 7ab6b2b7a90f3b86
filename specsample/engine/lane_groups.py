"""Lanes stepped in groups, for rounds whose per-lane arrays are wide (whole rows of a large vocabulary).

The engine plays a round for every lane of a block at once (a ``vmap`` over lanes), which vectorises
rounds made of table lookups: the standard rule's alias draws and paired residuals. A round that
builds whole rows instead (a residual, an inverse-CDF draw, a tree node's proposal law: the
multi-draft, K-SEQ, block and tree-walk rules) holds arrays of V floats per lane. At V = 32,768 and
256 lanes each of them is 32 MiB, past this CPU's caches, and the round runs at the speed of memory.
On CPU such a round runs over groups of lanes in a loop (``lax.map``), each group small enough that
its arrays stay in cache. Each lane computes what it computed before, from the same uniforms, so
the counts are the same to the bit (``tests/test_lane_groups.py``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

WIDE = 4096  # elements per lane: a round whose arrays are all smaller steps every lane at once
GROUP_BYTES = 1 << 20  # a group's row of V floats at most this (8 lanes at V = 32,768): within a core's L2
PROBE = 1031  # lanes in the probe: a prime no table dimension takes, so the lane axis is the axis of this size


def widest(jaxpr, lanes: int = PROBE) -> int:
    """Elements per lane of the largest array with a lane axis that a (closed) jaxpr makes, its nested
    programs included: arrays with an axis of size ``lanes`` are the ones ``vmap`` batched."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    best = 0
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            shape = getattr(v.aval, "shape", ())
            if lanes in shape:
                best = max(best, math.prod(shape) // lanes)
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                if hasattr(getattr(sub, "jaxpr", sub), "eqns"):
                    best = max(best, widest(sub, lanes))
    return best


def group_size(lane_fn, lane_args: tuple, shared: tuple, vocab: int, n_lanes: int, platform: str) -> int:
    """How many lanes to step at once: all ``n_lanes``, unless on CPU a lane's round makes an array of
    :data:`WIDE` elements or more (found by tracing ``lane_fn(*lane_args, *shared)`` over :data:`PROBE`
    lanes, ``lane_args`` one lane's and ``shared`` every lane's: arrays or shape structs). Then the
    largest power of two dividing ``n_lanes`` whose rows of ``vocab`` floats fit :data:`GROUP_BYTES`."""
    if platform != "cpu" or vocab < WIDE:  # a GPU wants every lane at once
        return n_lanes
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct((PROBE,) + tuple(x.shape), x.dtype), lane_args)
    fixed = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), shared)
    probe = jax.vmap(lane_fn, in_axes=(0,) * len(lane_args) + (None,) * len(shared))
    if widest(jax.make_jaxpr(probe)(*batch, *fixed)) < WIDE:
        return n_lanes
    group = 1
    while n_lanes % (2 * group) == 0 and 2 * group * vocab * 4 <= GROUP_BYTES:
        group *= 2
    return group


def in_groups(batched, group: int):
    """``batched`` (a function of arrays with lanes on their last axis, returning the same) applied to
    ``group`` lanes at a time in a loop; ``group`` divides the number of lanes."""

    def run(*args):
        n = args[0].shape[-1]
        if group >= n:
            return batched(*args)
        g = n // group
        xs = tuple(jnp.moveaxis(a.reshape(a.shape[:-1] + (g, group)), -2, 0) for a in args)
        out = jax.lax.map(lambda x: batched(*x), xs)
        return jax.tree.map(lambda o: jnp.moveaxis(o, 0, -2).reshape(o.shape[1:-1] + (n,)), out)

    return run
