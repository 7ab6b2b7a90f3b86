"""Throughput of the engine next to numpy and torch baselines and the random-number ceiling.

All numbers come from the same process and run, so the ratios are meaningful on any
machine; the absolute rates are this machine's.

The ceiling: a standard round consumes 2k + 1 uniforms (k to draft, k to test, one for
the last token), so the rate at which the PRNG alone produces uniforms on all devices at
once (:func:`random_rates`), divided by 2k + 1, bounds the rounds/s of any implementation
that draws its uniforms from that PRNG. Two generators give the same Threefry numbers:
``jax.random.uniform`` and the engine's :func:`specsample.engine.rng.uniform` (the hash unrolled,
several times faster on CPU). The ceiling is the faster of the two; the rate of
``jax.random`` alone is reported next to it.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from .engine import lanes as engine, rng
from .models.pairs import make_pair
from .laws.reference import numpy_rounds, torch_rounds
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


def neural_point(*, sequences: int = 1 << 15, vocab: int = 32, k: int = 4, seed: int = 0, repeat: int = 3) -> dict:
    """Rounds/s of a transformer pair in the engine: KV caches (``cached``) against a full
    teacher-forced pass per row (``recompute``), and the table engine on a Dirichlet pair of
    the same V and k, all measured now (best of ``repeat`` timed runs each).

    The table engine runs 32 times as many sequences, at least 2^22 (its rounds are ~100x cheaper;
    a short run would time its fixed costs). The
    pair is the battery's close draft (a width-32, 2-layer, 2-head target and the same
    network with perturbed weights), the prompt two tokens, L = k + 2 kept tokens per
    sequence, in the battery's neural block shape.
    """
    from .battery.suite import NEURAL_BLOCK
    from .models.pairs import neural_pair
    from .schemes import make_scheme

    pair = neural_pair("transformer-close", seed, vocab, prompt_len=2)
    c = pair.target.config
    lanes, per_lane = NEURAL_BLOCK
    out = dict(vocab=vocab, width=c.width, layers=c.layers, heads=c.heads, k=k, length=k + 2, sequences=sequences)
    for name in ("cached", "recompute"):
        scheme = make_scheme(name, k)
        kw = dict(length=k + 2, lanes=lanes, per_lane=per_lane, prompt=pair.prompt)
        engine.run(scheme, pair.target, pair.draft, sequences=lanes * per_lane, seed=seed, **kw)  # compile
        best = 0.0
        for i in range(repeat):
            t0 = time.perf_counter()
            rounds = int(engine.run(scheme, pair.target, pair.draft, sequences=sequences, seed=seed + 1 + i,
                                    **kw).rounds.sum())
            best = max(best, rounds / (time.perf_counter() - t0))
        out[f"{name}_rounds_per_s"] = best
    table = make_pair("dirichlet", seed, vocab)
    kw = dict(length=k + 2, lanes=4096, per_lane=64)
    engine.run(standard(k), table.target, table.draft, sequences=4096 * 64, seed=seed, **kw)
    best = 0.0
    for i in range(repeat):
        t0 = time.perf_counter()
        rounds = int(engine.run(standard(k), table.target, table.draft, sequences=max(1 << 22, 32 * sequences),
                                seed=seed + 1 + i, **kw).rounds.sum())
        best = max(best, rounds / (time.perf_counter() - t0))
    out["table_rounds_per_s"] = best
    return out


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main(grid=GRID, json_path: str | None = None, sequences: int = 1 << 22,
         prng: str = engine.DEFAULT_PRNG, echo=None, neural_sequences: int = 1 << 15) -> list:
    """Measure every (V, k) point of ``grid``, print a table of rates and ratios (a row as each
    point is measured), then the transformer pair (:func:`neural_point`, skipped when
    ``neural_sequences`` is 0), write JSON."""
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
    neural = None
    if neural_sequences:
        neural = neural_point(sequences=neural_sequences)
        n = neural
        echo(f"transformer pair (V={n['vocab']}, width {n['width']}, {n['layers']} layers, k={n['k']}, L={n['length']}): "
             f"cached {n['cached_rounds_per_s']:.3g} rounds/s, recompute {n['recompute_rounds_per_s']:.3g} "
             f"({n['cached_rounds_per_s'] / n['recompute_rounds_per_s']:.2f}x); table engine at the same V, k "
             f"{n['table_rounds_per_s']:.3g} ({n['table_rounds_per_s'] / n['cached_rounds_per_s']:.0f}x cached)")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"backend": jax.default_backend(), "devices": jax.device_count(), "prng": prng,
                       "uniforms_per_s": rate, "generators_uniforms_per_s": rates, "torch": torch_ver,
                       "points": rows, "neural": neural}, f, indent=2)
    return rows
