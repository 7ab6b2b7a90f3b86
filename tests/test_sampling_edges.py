"""Inverse-CDF sampling at the float edges: a zero-probability token is never drawn.

XLA's cumsum is a parallel prefix sum: the cumulative row can step down, or step up across
a zero weight, by an ulp. These tests hit those rows with many uniforms, including the
extremes 0 and 1 - 2**-24.
"""

import jax
import jax.numpy as jnp
import numpy as np

from specsample import models
from specsample.schemes import base


def _rows(rng, v, n_rows):
    w = rng.dirichlet(np.full(v, 0.3), size=n_rows)
    w[rng.random(w.shape) < 0.4] = 0.0
    w[:, 0] = 0.0
    w[:, -1] = 0.0  # trailing zeros: the rounding fallback must not land there
    return (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


def test_sample_weights_never_draws_a_zero_weight(rng):
    for v in (64, 32768):
        w = jnp.asarray(_rows(rng, v, 4))
        u = jnp.concatenate([jnp.array([0.0, 1.0 - 2.0**-24], jnp.float32),
                             jax.random.uniform(jax.random.key(v), (4000,))])
        picks = jax.jit(jax.vmap(jax.vmap(base.sample_weights, (None, 0)), (0, None)))(w, u)
        chosen = np.take_along_axis(np.asarray(w), np.asarray(picks), axis=1)
        assert np.all(chosen > 0)


def test_table_sampling_with_exact_cdf_never_draws_a_zero(rng):
    for v in (64, 32768):
        m = models.TableModel(_rows(rng, v, 1).astype(np.float64), 0)
        m = models.TableModel(m.table / m.table.sum(), 0).with_cdf()
        u = jnp.concatenate([jnp.array([0.0, 1.0 - 2.0**-24], jnp.float32),
                             jax.random.uniform(jax.random.key(1), (20000,))])
        picks = np.asarray(jax.jit(jax.vmap(lambda ui: m.sample(jnp.zeros(0, jnp.int32), ui)))(u))
        assert np.all(np.asarray(m.table)[0, picks] > 0)
