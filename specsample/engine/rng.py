"""Uniform numbers from JAX's threefry keys, bit for bit, with the hash unrolled.

``jax.random`` lowers the Threefry-2x32 hash on CPU as a rolled loop of five
four-round steps (it keeps compile times short). That loop is a barrier XLA cannot fuse
or vectorise across: measured on a 2-core CPU, one core makes about 2.2e8 uniforms/s
through it and about 1.0e9/s through the same twenty rounds written out. This module is
that written-out hash, driven exactly as ``jax.random.uniform`` drives it (the
partitionable counter layout, the default since JAX 0.5), so it returns the *same
numbers* for the same key: the engine's random stream does not depend on which of the two
computes it (tested bit for bit).

Keys of other implementations (``rbg``, ``unsafe_rbg``) go to ``jax.random.uniform``.
:func:`uniform_side_by_side` draws for a batch of keys (the engine's batch of pairs) straight into
the layout of the engine's lanes.

References
----------
Salmon, J. K., Moraes, M. A., Dror, R. O. and Shaw, D. E. (2011). Parallel random
numbers: as easy as 1, 2, 3. SC '11. doi:10.1145/2063384.2063405.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotl(x, d: int):
    return (x << np.uint32(d)) | (x >> np.uint32(32 - d))


def threefry2x32(k1, k2, x1, x2):
    """The Threefry-2x32 hash (20 rounds) of counters ``(x1, x2)`` under key ``(k1, k2)``; uint32 in and out."""
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    x1, x2 = x1 + ks[0], x2 + ks[1]
    for step in range(5):  # static: the rounds are written out, which is the point
        for rot in _ROTATIONS[step % 2]:
            x1 = x1 + x2
            x2 = _rotl(x2, rot) ^ x1
        x1 = x1 + ks[(step + 1) % 3]
        x2 = x2 + ks[(step + 2) % 3] + np.uint32(step + 1)
    return x1, x2


def is_threefry(key) -> bool:
    """Whether ``key`` is a typed key of JAX's default Threefry-2x32 implementation."""
    return jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) and "threefry2x32" in str(jax.random.key_impl(key))


def uniform(key, shape: tuple) -> jax.Array:
    """``jax.random.uniform(key, shape)`` (float32 in [0, 1)), with the hash unrolled for Threefry keys.

    Equal bit for bit to ``jax.random.uniform`` under JAX's partitionable Threefry
    (``jax_threefry_partitionable``, the default); with that flag off JAX draws other
    numbers, and this function keeps drawing these, so a run's stream does not depend on
    a global flag. Arrays of more than 2^32 numbers are not supported (nor needed here).
    """
    if not is_threefry(key):
        return jax.random.uniform(key, shape)
    size = _size(shape)
    k = jax.random.key_data(key)
    lo = jax.lax.iota(jnp.uint32, size).reshape(shape)  # the counter: flat index, high word 0
    return _unit_floats(*threefry2x32(k[0], k[1], jnp.zeros_like(lo), lo))


def _size(shape: tuple) -> int:
    """Numbers in an array of ``shape``: fewer than 2^32, as the counter's high word stays 0."""
    size = int(np.prod(shape, dtype=np.int64))
    if size >= 1 << 32:
        raise ValueError(f"at most 2^32 uniforms per key, asked for {size}")
    return size


def _unit_floats(b1, b2):
    """The float32 uniforms in [0, 1) that ``jax.random.uniform`` makes of the hash's two words."""
    bits = b1 ^ b2
    # 23 random mantissa bits under the exponent of 1.0, minus 1: the float32 grid of [0, 1)
    floats = jax.lax.bitcast_convert_type((bits >> np.uint32(9)) | np.uint32(0x3F800000), jnp.float32) - 1.0
    return jnp.maximum(floats, 0.0)


def uniform_side_by_side(keys, shape: tuple) -> jax.Array:
    """``uniform(keys[i], shape)`` for every key of a 1-D batch, laid side by side: shape
    ``shape[:-1] + (len(keys),) + shape[-1:]``, item ``[..., i, j]`` being ``uniform(keys[i], shape)[..., j]``.

    The same numbers as a ``vmap`` of :func:`uniform` over the keys followed by a ``moveaxis``, written
    straight into this layout: on CPU the moved copy of the batched hash was fused into one scalar loop
    (eight times slower than the hash alone at two keys), where this is elementwise along the last axis.
    """
    if not is_threefry(keys):
        return jnp.moveaxis(jax.vmap(lambda k: jax.random.uniform(k, shape))(keys), 0, -2)
    _size(shape)
    k = jax.random.key_data(keys)  # [P, 2]
    out = tuple(shape[:-1]) + (keys.shape[0], shape[-1])
    # each key's counter is the flat index within its own array of ``shape``, whatever its slot here
    axes = tuple(range(len(shape) - 1)) + (len(out) - 1,)  # where each axis of ``shape`` sits in ``out``
    strides = np.cumprod((1,) + tuple(shape[:0:-1]))[::-1]  # row-major strides of ``shape``
    lo = sum(jax.lax.broadcasted_iota(jnp.uint32, out, a) * np.uint32(st) for a, st in zip(axes, strides))
    kk = k.reshape((1,) * (len(shape) - 1) + (keys.shape[0], 1, 2))
    return _unit_floats(*threefry2x32(kk[..., 0], kk[..., 1], jnp.zeros_like(lo), lo))
