"""The engine's uniforms: the unrolled Threefry hash gives jax.random's numbers bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsample.engine import rng


def _bits(x):
    return np.asarray(x).view(np.uint32)


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**31 - 1])
@pytest.mark.parametrize("shape", [(1,), (7,), (9, 4096), (3, 5, 2)])
def test_same_numbers_as_jax_random(seed, shape):
    key = jax.random.fold_in(jax.random.key(seed), 3)
    want = _bits(jax.random.uniform(key, shape))
    np.testing.assert_array_equal(_bits(rng.uniform(key, shape)), want)
    np.testing.assert_array_equal(_bits(jax.jit(rng.uniform, static_argnums=1)(key, shape)), want)


def test_same_numbers_under_vmap_and_in_a_loop():
    keys = jax.random.split(jax.random.key(7), 3)
    want = jax.vmap(lambda k: jax.random.uniform(k, (9, 64)))(keys)
    np.testing.assert_array_equal(_bits(jax.vmap(lambda k: rng.uniform(k, (9, 64)))(keys)), _bits(want))

    def loop(draw):
        def body(r, acc):
            return acc + draw(jax.random.fold_in(keys[0], r), (5, 8))
        return jax.jit(lambda: jax.lax.fori_loop(0, 10, body, jnp.zeros((5, 8))))()

    np.testing.assert_array_equal(_bits(loop(rng.uniform)), _bits(loop(jax.random.uniform)))


@pytest.mark.parametrize("key,count,want", [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
])
def test_the_hash_gives_the_known_answers(key, count, want):
    # Threefry-2x32, 20 rounds: Random123's known-answer vectors (JAX's hash gives them too)
    u32 = [jnp.uint32(v) for v in key + count]
    assert tuple(int(v) for v in rng.threefry2x32(*u32)) == want


def test_other_key_implementations_fall_back_to_jax_random():
    key = jax.random.key(3, impl="rbg")
    assert not rng.is_threefry(key)
    np.testing.assert_array_equal(_bits(rng.uniform(key, (4, 6))), _bits(jax.random.uniform(key, (4, 6))))


def test_numbers_do_not_depend_on_the_partitionable_flag():
    key = jax.random.key(11)
    before = _bits(rng.uniform(key, (3, 7)))
    with jax.threefry_partitionable(False):
        np.testing.assert_array_equal(_bits(rng.uniform(key, (3, 7))), before)


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
@pytest.mark.parametrize("n_keys,shape", [(1, (9, 64)), (3, (9, 64)), (2, (7,)), (4, (2, 3, 5))])
def test_keys_side_by_side_draw_what_a_vmap_over_the_keys_draws(impl, n_keys, shape):
    # the engine's layout for a batch of pairs: every key's numbers, slotted in before the last axis;
    # the same numbers as the vmap it replaces (for Threefry, as each key alone: rbg's differ under vmap)
    keys = jax.random.split(jax.random.key(5, impl=impl), n_keys)
    got = jax.jit(rng.uniform_side_by_side, static_argnums=1)(keys, shape)
    assert got.shape == shape[:-1] + (n_keys,) + shape[-1:]
    vmapped = jax.vmap(lambda k: rng.uniform(k, shape))(keys)
    np.testing.assert_array_equal(_bits(got), _bits(jnp.moveaxis(vmapped, 0, -2)))
    if impl == "threefry2x32":
        for i in range(n_keys):
            np.testing.assert_array_equal(_bits(got[..., i, :]), _bits(jax.random.uniform(keys[i], shape)))
