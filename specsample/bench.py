"""Throughput of the engine next to numpy and torch baselines and the random-number ceiling.

All numbers come from the same process and run, so the ratios are meaningful on any
machine; the absolute rates are this machine's.

The ceiling: a standard round consumes 2k + 1 uniforms (k to draft, k to test, one for
the last token), so the rate at which the PRNG alone produces uniforms on all devices at
once (:func:`random_rates`), divided by 2k + 1, bounds the rounds/s of any implementation
that draws its uniforms from that PRNG. Two generators give the same Threefry numbers:
``jax.random.uniform`` and the engine's :func:`specsample.rng.uniform` (the hash unrolled,
several times faster on CPU). The ceiling is the faster of the two; the rate of
``jax.random`` alone is reported next to it.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from . import engine, rng
from .pairs import make_pair
from .reference import numpy_rounds, torch_rounds
from .schemes import standard
from .timing import best_of

GRID = tuple((v, k) for v in (8, 64, 1024, 32768) for k in (1, 4, 8))


GENERATORS = {"jax.random": jax.random.uniform, "specsample.rng": rng.uniform}


def random_rates(prng: str = engine.DEFAULT_PRNG, n: int = 1 << 24, chunk: int = 1 << 15,
                 repeat: int = 5) -> dict:
    """Uniform float32 numbers per second of each generator (:data:`GENERATORS`) for the given PRNG.

    Each is measured on all devices at once, as the best of two ways to draw ``n`` numbers
    per device: one large array, and a loop of cache-sized chunks (each summed, so nothing
    is written to memory; on CPU the chunks are several times faster), each timed ``repeat``
    times.
    """
    nd = jax.device_count()
    per = n // nd
    keys = jax.random.split(jax.random.key(0, impl=prng), nd)
    rates = {}
    for name, uniform in GENERATORS.items():
        def whole(key, uniform=uniform):
            return jnp.sum(uniform(key, (per,)))

        def chunked(key, uniform=uniform):
            def body(i, s):
                return s + jnp.sum(uniform(jax.random.fold_in(key, i), (chunk,)))
            return jax.lax.fori_loop(0, max(1, per // chunk), body, jnp.float32(0))

        best = 0.0
        for fn, count in ((whole, per), (chunked, max(1, per // chunk) * chunk)):
            f = jax.pmap(fn)
            f(keys).block_until_ready()
            best = max(best, count * nd / best_of(lambda: f(keys).block_until_ready(), repeat))
        rates[name] = best
    return rates


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def bench_point(vocab: int, k: int, *, sequences: int = 1 << 22, length: int | None = None,
                prng: str = engine.DEFAULT_PRNG, baseline_rounds: int = 1 << 20, seed: int = 0,
                rates: dict | None = None, repeat: int = 3) -> dict:
    """Rounds/s of the engine (battery counting mode) for the standard scheme on a Dirichlet pair.

    Next to it, measured now: the numpy baseline, the torch baseline (None without torch)
    and the ceiling ``uniforms_per_s / (2k + 1)`` from the fastest of the generator ``rates``
    (:func:`random_rates`, measured here when not given), and the same for ``jax.random`` alone.
    Every rate is the best of ``repeat`` timings (the engine's with a new seed each time):
    on a shared machine the best is the least disturbed.
    """
    pair = make_pair("dirichlet", seed, vocab)
    scheme = standard(k)
    length = k + 2 if length is None else length
    lanes, per_lane = 4096, 64
    kw = dict(length=length, lanes=lanes, per_lane=per_lane, prng=prng)
    engine.run(scheme, pair.target, pair.draft, sequences=lanes * per_lane, seed=seed, **kw)  # compile
    timings = []  # (rounds/s, rounds, seconds) of each timed run
    for i in range(repeat):
        t0 = time.perf_counter()
        rounds = int(engine.run(scheme, pair.target, pair.draft, sequences=sequences, seed=seed + 1 + i,
                                **kw).rounds.sum())
        dt = time.perf_counter() - t0
        timings.append((rounds / dt, rounds, dt))
    rate, rounds, dt = max(timings)
    p = np.asarray(pair.target.table[0], dtype=np.float64)
    q = np.asarray(pair.draft.table[0], dtype=np.float64)
    t_np = best_of(lambda: numpy_rounds(p, q, k, baseline_rounds), repeat=repeat)
    t_torch = best_of(lambda: torch_rounds(p, q, k, baseline_rounds), repeat=repeat) if torch_available() else None
    rates = random_rates(prng) if rates is None else rates
    uniforms_per_s, jax_uniforms_per_s = max(rates.values()), rates["jax.random"]
    return dict(
        vocab=vocab, k=k, length=length, prng=prng, rounds=rounds, seconds=dt,
        rounds_per_s=rate,
        numpy_rounds_per_s=baseline_rounds / t_np,
        torch_rounds_per_s=None if t_torch is None else baseline_rounds / t_torch,
        uniforms_per_s=uniforms_per_s,
        ceiling_rounds_per_s=uniforms_per_s / (2 * k + 1),
        jax_uniforms_per_s=jax_uniforms_per_s,
        jax_ceiling_rounds_per_s=jax_uniforms_per_s / (2 * k + 1),
    )


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main(grid=GRID, json_path: str | None = None, sequences: int = 1 << 22,
         prng: str = engine.DEFAULT_PRNG, echo=None) -> list:
    """Measure every (V, k) point of ``grid``, print a table of rates and ratios (a row as each
    point is measured), write JSON."""
    echo = echo or (lambda line: print(line, flush=True))
    rates = random_rates(prng)
    rate = max(rates.values())
    torch_ver = None
    if torch_available():
        import torch
        torch_ver = torch.__version__
    echo(f"backend: {jax.default_backend()}, devices: {jax.device_count()}, prng: {prng}, torch: "
         f"{torch_ver or 'not installed'}; uniforms/s: "
         + ", ".join(f"{name} {r:.3g}" for name, r in rates.items()) + " (the ceiling uses the fastest)")
    echo(f"{'V':>6} {'k':>2} {'rounds/s':>10} {'ceiling':>10} {'numpy':>10} {'torch':>10} "
         f"{'of ceiling':>10} {'of jax.rnd':>10} {'x numpy':>8} {'x torch':>8}")
    rows = []
    for v, k in grid:
        r = bench_point(v, k, sequences=sequences, prng=prng, rates=rates)
        rows.append(r)
        t = r["torch_rounds_per_s"]
        echo(f"{r['vocab']:>6} {r['k']:>2} {r['rounds_per_s']:>10.3g} {r['ceiling_rounds_per_s']:>10.3g} "
             f"{r['numpy_rounds_per_s']:>10.3g} {_fmt(t, '10.3g'):>10} "
             f"{r['rounds_per_s'] / r['ceiling_rounds_per_s']:>10.2f} "
             f"{r['rounds_per_s'] / r['jax_ceiling_rounds_per_s']:>10.2f} "
             f"{r['rounds_per_s'] / r['numpy_rounds_per_s']:>8.2f} "
             f"{_fmt(None if t is None else r['rounds_per_s'] / t, '8.2f'):>8}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"backend": jax.default_backend(), "devices": jax.device_count(), "prng": prng,
                       "uniforms_per_s": rate, "generators_uniforms_per_s": rates, "torch": torch_ver,
                       "points": rows}, f, indent=2)
    return rows
