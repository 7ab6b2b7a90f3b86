"""The small causal transformer: teacher-forced rows, its KV cache, and what the cache saves.

Every sequence length compiles its own pass, so the default run keeps to a few lengths; the
full grid of the key-count check runs under ``pytest -m long``.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from specsample.laws import exact
from specsample.models import transformer as tr


@pytest.fixture(scope="module")
def model():
    return tr.Transformer.create(0, vocab=8, width=32, layers=2, heads=2, max_len=32)


TOKENS = jnp.array([1, 5, 2, 7, 0, 3, 3, 4, 6, 1])


def test_rows_are_distributions_for_every_position(model):
    rows = model.probs(TOKENS)
    assert rows.shape == (10, 8)
    np.testing.assert_allclose(np.asarray(rows.sum(-1)), 1.0, atol=1e-5)
    batched = model.probs(jnp.stack([TOKENS, TOKENS[::-1]]))
    np.testing.assert_allclose(np.asarray(batched[0]), np.asarray(rows), atol=1e-6)


@pytest.mark.parametrize("splits", [(10,), (1,) * 10, (3, 3, 4), (1, 4, 5)])
def test_cached_rows_equal_teacher_forced_rows(model, splits):
    full = np.asarray(model.probs(TOKENS))
    start = 0
    cache = tr.empty_cache(model.config)
    for n in splits:
        rows, cache, _ = model.extend(cache, TOKENS[start:start + n])
        np.testing.assert_allclose(np.asarray(rows), full[start:start + n], atol=1e-5)
        start += n
    assert int(cache.length) == 10


def test_a_cache_holds_the_keys_of_the_full_pass(model):
    # the cache keeps keys head-major and transposed (the layout attention multiplies by): read back in
    # the full pass's order, every slot written holds that position's key, one pass or one token at a time
    for splits in ((10,), (1,) * 10):
        cache, start = tr.empty_cache(model.config, 12), 0
        for n in splits:
            _, cache, _ = model.extend(cache, TOKENS[start:start + n])
            start += n
        keys, values = tr.cache_entries(cache)
        assert keys.shape == values.shape == (2, 12, 2, 16) and tr.cache_slots(cache) == 12
        np.testing.assert_allclose(np.asarray(keys[:, :10]), np.asarray(tr.layer_keys(model, TOKENS)), atol=1e-5)


def test_rollback_then_extend_matches_recomputation(model):
    full = np.asarray(model.probs(TOKENS))
    _, cache, _ = model.prefill(TOKENS[:6])
    other = jnp.array([2, 2, 2])  # a rejected draft, written into the cache and then dropped
    _, cache, _ = model.extend(cache, other)
    cache = cache.rollback(4)
    rows, cache, _ = model.extend(cache, TOKENS[4:10])
    np.testing.assert_allclose(np.asarray(rows), full[4:10], atol=1e-5)
    # without the rollback the rows are those of another context
    _, stale, _ = model.extend(model.prefill(TOKENS[:6])[1], other)
    wrong, _, _ = model.extend(stale, TOKENS[4:10])
    assert np.max(np.abs(np.asarray(wrong) - full[4:10])) > 1e-3


GRID = [(1, 1), (1, 4), (3, 1), (3, 5), (6, 2)]
LONG_GRID = [(t, k) for t in (1, 2, 5, 9, 16) for k in (1, 2, 4, 7, 12)]


@pytest.mark.parametrize("prompt, k", GRID + [pytest.param(t, k, marks=pytest.mark.long) for t, k in LONG_GRID])
def test_key_projections_equal_the_closed_forms(model, prompt, k):
    ctx = (np.arange(prompt) * 5 + 1) % 8
    naive = tr.generate_naive(model, ctx, k)
    cached = tr.generate_cached(model, ctx, k)
    assert naive.keys_per_layer == tr.n_naive(prompt, k) == k * prompt + k * (k - 1) // 2
    assert cached.keys_per_layer == tr.n_cached(prompt, k) == prompt + k - 1
    assert naive.tokens == cached.tokens  # same greedy continuation either way


def test_bidirectional_attention_breaks_the_cache(model):
    bi = model.bidirectional()
    # appending a token changes earlier positions' keys above the first layer
    short, longer = tr.layer_keys(bi, TOKENS[:5]), tr.layer_keys(bi, TOKENS[:6])
    toks = TOKENS[:6]
    assert np.max(np.abs(np.asarray(longer[1, :5] - short[1]))) > 1e-3
    np.testing.assert_allclose(np.asarray(longer[0, :5]), np.asarray(short[0]), atol=1e-6)  # layer 1: embeddings only
    # causal: no earlier key moves
    c_short, c_long = tr.layer_keys(model, TOKENS[:5]), tr.layer_keys(model, TOKENS[:6])
    np.testing.assert_allclose(np.asarray(c_long[:, :5]), np.asarray(c_short), atol=1e-5)
    # a cache of the bidirectional network would serve stale rows; the API refuses it
    assert tr.stale_cache_rows(bi, toks) > 1e-2
    assert tr.stale_cache_rows(model, toks) < 1e-5
    with pytest.raises(ValueError, match="needs causal attention"):
        bi.prefill(TOKENS[:3])


@pytest.mark.long
def test_temperature_and_learned_positions():
    hot = tr.Transformer.create(1, vocab=6, width=16, layers=1, heads=1, max_len=8)
    cold = hot.with_temperature(0.5)
    p, q = np.asarray(hot.probs(TOKENS[:4] % 6), np.float64), np.asarray(cold.probs(TOKENS[:4] % 6), np.float64)
    want = p**2 / (p**2).sum(-1, keepdims=True)  # logits / 0.5
    np.testing.assert_allclose(q, want, rtol=1e-4, atol=1e-6)
    learned = tr.Transformer.create(2, vocab=6, width=16, layers=2, heads=4, max_len=8, rotary=False)
    full = np.asarray(learned.probs(TOKENS[:6] % 6))
    rows, cache, _ = learned.prefill(TOKENS[:2] % 6)
    rest, _, _ = learned.extend(cache, TOKENS[2:6] % 6)
    np.testing.assert_allclose(np.asarray(rest), full[2:6], atol=1e-5)


def test_a_perturbed_draft_has_tunable_acceptance(model):
    close, far = model.perturbed(1, 0.05), model.perturbed(1, 0.5)
    a_same = exact.expected_acceptance(model, model, [1], 2)
    a_close = exact.expected_acceptance(model, close, [1], 2)
    a_far = exact.expected_acceptance(model, far, [1], 2)
    np.testing.assert_allclose(a_same, 1.0, atol=1e-5)
    assert np.all(a_far < a_close) and np.all(a_close < 1.0) and np.all(a_close > 0.8)


@pytest.mark.parametrize("config, match", [
    (dict(vocab=1), "vocab must be an integer"),
    (dict(width=30, heads=4), "even size"),
    (dict(temperature=0.0), "temperature must be > 0"),
])
def test_bad_configs(config, match):
    with pytest.raises(ValueError, match=match):
        tr.Transformer.create(0, **config)


def test_sequences_longer_than_max_len_are_refused(model):
    with pytest.raises(ValueError, match="does not fit"):
        model.probs(jnp.zeros(40, jnp.int32))
    _, cache, _ = model.prefill(jnp.zeros(30, jnp.int32))
    with pytest.raises(ValueError, match="do not fit"):
        model.extend(cache, jnp.zeros(3, jnp.int32))


@pytest.mark.long
def test_timings_run():
    small = tr.Transformer.create(0, vocab=8, width=16, layers=1, heads=1, max_len=16)
    g = tr.time_generation(small, 4, 3, repeats=1)
    v = tr.time_verification(small, 4, 3, repeats=1)
    assert g["naive_s_per_token"] > 0 and g["cached_s_per_token"] > 0
    assert v["one_pass_s"] > 0 and v["sequential_s"] > 0


@pytest.mark.parametrize("n, t", [(64, 8), (512, 16), (2048, 24)])
def test_batched_rows_are_the_vmapped_rows_bit_for_bit(model, n, t):
    """``probs`` on a batch runs the sequences in batches of 256: every row must be the one a vmap over
    the whole batch gives, to the bit (the exact laws are built from them), and match a pass over the
    sequence alone to float32 rounding."""
    import jax

    x = np.random.default_rng(n).integers(0, model.vocab_size, (n, t)).astype(np.int32)
    batched = np.asarray(model.probs(x))
    vmapped = np.asarray(jax.jit(jax.vmap(lambda row: tr._full(model.params, model.config, row)[0]))(x))
    np.testing.assert_array_equal(batched, vmapped)
    np.testing.assert_allclose(batched[::97], np.stack([np.asarray(model.probs(jnp.asarray(r))) for r in x[::97]]),
                               rtol=1e-5, atol=1e-7)


def test_rotary_table_gives_the_rotation_of_each_position_bit_for_bit():
    """`_rope` reads cos and sin from a table of positions: under vmap, at traced positions, each lane's
    rotation is the one computed from its own angles, to the bit."""
    import jax

    def direct(x, pos):
        dh = x.shape[-1]
        freq = 1.0 / (10000.0 ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))
        ang = pos[:, None].astype(jnp.float32) * freq[None, :]
        cos, sin = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(64, 5, 2, 16)), jnp.float32)
    pos = jnp.asarray(rng.integers(0, 64, (64, 5)), jnp.int32)
    table = jax.jit(jax.vmap(lambda a, p: tr._rope(a, p, 64)))(x, pos)
    assert np.array_equal(np.asarray(table), np.asarray(jax.jit(jax.vmap(direct))(x, pos)))
