"""Throughput of the engine next to a numpy baseline and the random-number ceiling.

All numbers come from the same process and run, so the ratios are meaningful on any
machine; the absolute rates are this machine's.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from . import engine
from .pairs import make_pair
from .reference import numpy_rounds
from .schemes import standard


def _best_of(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def random_rate(prng: str = engine.DEFAULT_PRNG, n: int = 1 << 24) -> float:
    """Uniform float32 numbers per second of the given PRNG, on all devices at once."""
    nd = jax.device_count()
    f = jax.pmap(lambda key: jnp.sum(jax.random.uniform(key, (n // nd,))))
    keys = jax.random.split(jax.random.key(0, impl=prng), nd)
    f(keys).block_until_ready()
    return (n // nd) * nd / _best_of(lambda: f(keys).block_until_ready())


def bench_point(vocab: int, k: int, *, sequences: int = 1 << 22, length: int | None = None,
                prng: str = engine.DEFAULT_PRNG, numpy_rounds_n: int = 1 << 20, seed: int = 0) -> dict:
    """Rounds/s of the engine (battery counting mode) for the standard scheme on a Dirichlet pair."""
    pair = make_pair("dirichlet", seed, vocab)
    scheme = standard(k)
    length = k + 2 if length is None else length
    lanes, per_lane = 4096, 64
    kw = dict(length=length, lanes=lanes, per_lane=per_lane, prng=prng)
    engine.run(scheme, pair.target, pair.draft, sequences=lanes * per_lane, seed=seed, **kw)  # compile
    t0 = time.perf_counter()
    counts = engine.run(scheme, pair.target, pair.draft, sequences=sequences, seed=seed + 1, **kw)
    dt = time.perf_counter() - t0
    rounds = int(counts.rounds.sum())
    p = np.asarray(pair.target.table[0])
    q = np.asarray(pair.draft.table[0])
    t_np = _best_of(lambda: numpy_rounds(p, q, k, numpy_rounds_n), repeat=2)
    rate = random_rate(prng)
    return dict(
        vocab=vocab, k=k, length=length, prng=prng, rounds=rounds, seconds=dt,
        rounds_per_s=rounds / dt,
        numpy_rounds_per_s=numpy_rounds_n / t_np,
        uniforms_per_s=rate,
        ceiling_rounds_per_s=rate / (2 * k + 1),
    )


def main(grid=((64, 4),), json_path: str | None = None, sequences: int = 1 << 22,
         prng: str = engine.DEFAULT_PRNG) -> list:
    rows = [bench_point(v, k, sequences=sequences, prng=prng) for v, k in grid]
    print(f"backend: {jax.default_backend()}, devices: {jax.device_count()}, prng: {prng}")
    print(f"{'V':>6} {'k':>2} {'rounds/s':>10} {'numpy':>10} {'ceiling':>10} {'x numpy':>8} {'of ceiling':>10}")
    for r in rows:
        print(f"{r['vocab']:>6} {r['k']:>2} {r['rounds_per_s']:>10.3g} {r['numpy_rounds_per_s']:>10.3g} "
              f"{r['ceiling_rounds_per_s']:>10.3g} {r['rounds_per_s'] / r['numpy_rounds_per_s']:>8.2f} "
              f"{r['rounds_per_s'] / r['ceiling_rounds_per_s']:>10.2f}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"backend": jax.default_backend(), "devices": jax.device_count(), "points": rows}, f, indent=2)
    return rows
