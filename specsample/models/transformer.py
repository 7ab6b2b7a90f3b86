"""A small causal transformer in JAX, usable as target p or draft q, with a KV cache.

Two forms of one network:

* the teacher-forced pass, :meth:`Transformer.probs`: next-token distributions after every
  position of a token array in one call (what parallel verification uses);
* a KV cache (:class:`KVCache`): :meth:`Transformer.prefill` a prompt, :meth:`Transformer.extend`
  by one or several tokens (each returns the next-token distribution after every new token),
  :meth:`KVCache.rollback` to a given length (what a rejected draft needs).

Pre-norm blocks (RMS norm, multi-head attention with rotary positions, a GELU MLP), tied to
nothing: every weight is drawn from a seed (:func:`init`). Positions are rotary by default,
so a cache that keeps counting positions after a rollback gives visibly wrong rows.

Every forward also returns how many key projections ``W_K h_t`` it computed (positions x
layers; the number is static, so it is exact under ``jit``). That is what
:func:`generate_naive` and :func:`generate_cached` add up against the closed forms
``N_naive(T, k) = k T + k (k - 1) / 2`` and ``N_cached(T, k) = T + k - 1`` per layer, for a
prompt of T tokens and k generated tokens.

Why caching needs the causal mask: with causal attention the hidden state of position t
depends on tokens <= t only, so its keys and values never change once computed and a cache
may keep them. Without the mask (``causal=False``) appending a token changes every earlier
hidden state above the first layer, hence their keys: the cache refuses such a model
(:func:`check_cacheable`), and :func:`stale_cache_rows` shows how far off a cache would be.

References
----------
Vaswani et al. (2017), Attention is all you need. Su et al. (2021), RoFormer: enhanced
transformer with rotary position embedding. Pope et al. (2022), Efficiently scaling
transformer inference (KV caching).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import program_cache
from ..timing import best_of


class Config(NamedTuple):
    """Shape and behaviour of a network (static: part of every jitted function's key)."""

    vocab: int = 8
    width: int = 32
    layers: int = 2
    heads: int = 2
    max_len: int = 64
    causal: bool = True
    rotary: bool = True  # False: learned absolute positions
    temperature: float = 1.0
    logit_scale: float = 3.0  # std of the initial logits: how peaked the distributions are


def _check_config(c: Config) -> Config:
    for name, lo, hi in (("vocab", 2, 1 << 16), ("width", 4, 4096), ("layers", 1, 64), ("heads", 1, 64),
                         ("max_len", 1, 1 << 16)):
        v = getattr(c, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
            raise ValueError(f"transformer {name} must be an integer in [{lo}, {hi}], got {v!r}")
    if c.width % c.heads or (c.width // c.heads) % 2:
        raise ValueError(f"width {c.width} must split into {c.heads} heads of even size (rotary pairs)")
    if not c.temperature > 0:
        raise ValueError(f"temperature must be > 0, got {c.temperature}")
    return c


def init(key, config: Config) -> dict:
    """Random weights for ``config`` from a JAX key (a params pytree of float32 arrays)."""
    c = _check_config(config)
    d, v = c.width, c.vocab
    names = ["embed", "pos", "unembed"] + [f"{n}{i}" for i in range(c.layers) for n in ("q", "k", "v", "o", "up", "down")]
    keys = dict(zip(names, jax.random.split(key, len(names))))

    def normal(name, shape, scale):
        return jax.random.normal(keys[name], shape, jnp.float32) * scale

    params = {"embed": normal("embed", (v, d), 1.0), "pos": normal("pos", (c.max_len, d), 0.5),
              "unembed": normal("unembed", (d, v), c.logit_scale / np.sqrt(d)),
              "norm_out": jnp.ones(d, jnp.float32), "blocks": []}
    for i in range(c.layers):
        params["blocks"].append({
            "norm_attn": jnp.ones(d, jnp.float32), "norm_mlp": jnp.ones(d, jnp.float32),
            "wq": normal(f"q{i}", (d, d), 1 / np.sqrt(d)), "wk": normal(f"k{i}", (d, d), 1 / np.sqrt(d)),
            "wv": normal(f"v{i}", (d, d), 1 / np.sqrt(d)), "wo": normal(f"o{i}", (d, d), 1 / np.sqrt(d)),
            "w_up": normal(f"up{i}", (d, 4 * d), 1 / np.sqrt(d)), "w_down": normal(f"down{i}", (4 * d, d), 0.5 / np.sqrt(d)),
        })
    return params


def perturb(key, params: dict, scale: float) -> dict:
    """The same network with every weight moved by ``scale`` times its own std (a draft close to p)."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(tree, [x + scale * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
                                     for x, k in zip(leaves, keys)])


# --- the network ---------------------------------------------------------------------------


def _rms(x, g):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g


def _rope(x, pos, n_pos: int):
    """Rotary embedding of ``x`` [T, H, dh] at integer positions ``pos`` [T], each below ``n_pos`` (static).

    The cosines and sines are a table of the ``n_pos`` positions read at ``pos``: the same angles, so
    the same bits, but under ``vmap`` the table is computed once a pass instead of once per lane and
    token (a cached round at 64 lanes spent about a sixth of its time in ``cos`` and ``sin``).
    """
    dh = x.shape[-1]
    freq = 1.0 / (10000.0 ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))
    ang = jnp.arange(n_pos, dtype=jnp.float32)[:, None] * freq[None, :]  # [n_pos, dh/2]
    cos, sin = jnp.cos(ang)[pos][:, None, :], jnp.sin(ang)[pos][:, None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)


def _embed(params, c: Config, tokens, pos):
    h = params["embed"][tokens]
    return h if c.rotary else h + params["pos"][pos]


def _qkv(block, c: Config, h, pos, n_pos: int):
    """Queries, keys and values of hidden states ``h`` [T, width] at positions ``pos`` (below ``n_pos``)."""
    t, dh = h.shape[0], c.width // c.heads
    x = _rms(h, block["norm_attn"])
    q, k, v = (jnp.dot(x, block[w]).reshape(t, c.heads, dh) for w in ("wq", "wk", "wv"))
    if c.rotary:
        q, k = _rope(q, pos, n_pos), _rope(k, pos, n_pos)
    return q, k, v


def _attend(block, c: Config, h, q, k, v, mask):
    dh = c.width // c.heads
    s = jnp.einsum("thd,shd->hts", q, k) / np.sqrt(dh)
    s = jnp.where(mask[None], s, -1e30)
    a = jnp.einsum("hts,shd->thd", jax.nn.softmax(s, axis=-1), v).reshape(h.shape[0], c.width)
    return _mlp(block, h, a)


def _attend_cache(block, c: Config, h, q, keys, values, mask):
    """:func:`_attend` over a cache layer: ``keys`` [H, dh, S] and ``values`` [H, S, dh], so that both
    products are plain matrix products per head and the cache is never transposed in a pass.

    The full pass keeps :func:`_attend`: run through this one, its rows move in their last bits, and
    with them the stage passes' p-values (the quick ``cached`` report changed in three cases)."""
    dh = c.width // c.heads
    s = jnp.matmul(q.transpose(1, 0, 2), keys) / np.sqrt(dh)  # [H, T, S]
    s = jnp.where(mask[None], s, -1e30)
    a = jnp.matmul(jax.nn.softmax(s, axis=-1), values).transpose(1, 0, 2).reshape(h.shape[0], c.width)
    return _mlp(block, h, a)


def _mlp(block, h, a):
    """The attention output ``a`` projected and added, then the MLP block."""
    h = h + jnp.dot(a, block["wo"])
    x = _rms(h, block["norm_mlp"])
    return h + jnp.dot(jax.nn.gelu(jnp.dot(x, block["w_up"])), block["w_down"])


def _head(params, c: Config, h):
    logits = jnp.dot(_rms(h, params["norm_out"]), params["unembed"]) / c.temperature
    return jax.nn.softmax(logits, axis=-1)


def _forward(params, c: Config, tokens, length=None):
    """The layers over ``tokens`` [T]: the last hidden states and every layer's keys.

    ``length`` (traced) hides positions at or past it from attention, so one compiled pass
    serves every prefix of a padded array (rows past ``length`` are then meaningless).
    """
    t = tokens.shape[0]
    pos = jnp.arange(t)
    h = _embed(params, c, tokens, pos)
    mask = (pos[None, :] <= pos[:, None]) if c.causal else jnp.ones((t, t), bool)
    if length is not None:
        mask = mask & (pos[None, :] < length)
    keys = []
    for block in params["blocks"]:
        q, k, v = _qkv(block, c, h, pos, t)
        keys.append(k)
        h = _attend(block, c, h, q, k, v, mask)
    return h, keys


@functools.partial(jax.jit, static_argnums=1)
def _full(params, c: Config, tokens, length=None):
    """Teacher-forced pass over ``tokens`` [T]: rows [T, V] and the key projections computed."""
    h, _ = _forward(params, c, tokens, length)
    return _head(params, c, h), jnp.int32(tokens.shape[0] * c.layers)  # W_K on every position, each layer


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Keys and values of every layer for the first ``length`` positions (fixed-size arrays).

    ``keys``: a tuple of one float32 array [heads, head_dim, max_len] per layer; ``values``: the same
    with [heads, max_len, head_dim]. That is the layout attention multiplies by, so a pass writes its
    new entries and never transposes the cache (at 64 lanes, a one-token pass took 0.5-0.7 of the time
    of a [layers, max_len, heads, head_dim] cache's). Entries at or past
    ``length`` are ignored (masked) and overwritten by the next :meth:`Transformer.extend`.
    A pytree, so it can sit in a ``vmap`` or a loop carry.
    """

    keys: jax.Array
    values: jax.Array
    length: jax.Array  # int32 scalar

    def rollback(self, length) -> "KVCache":
        """The cache of the first ``length`` positions (a rejected draft's entries are dropped)."""
        return dataclasses.replace(self, length=jnp.minimum(jnp.asarray(length, jnp.int32), self.length))


def empty_cache(c: Config, size: int | None = None) -> KVCache:
    """An empty cache of ``size`` positions (default ``c.max_len``)."""
    size, dh = c.max_len if size is None else int(size), c.width // c.heads
    return KVCache(tuple(jnp.zeros((c.heads, dh, size), jnp.float32) for _ in range(c.layers)),
                   tuple(jnp.zeros((c.heads, size, dh), jnp.float32) for _ in range(c.layers)), jnp.int32(0))


def cache_slots(cache: KVCache) -> int:
    """Slots of ``cache`` (static)."""
    return cache.values[0].shape[-2]


def cache_entries(cache: KVCache) -> tuple:
    """(keys, values) as [layers, slots, heads, head_dim] arrays, the order of :func:`layer_keys`."""
    return (jnp.stack([k.transpose(2, 0, 1) for k in cache.keys]),
            jnp.stack([v.transpose(1, 0, 2) for v in cache.values]))


def cached_layers(params, c: Config, cache: KVCache, h, pos, mask):
    """Every layer over new positions (hidden states ``h`` [n, width] at positions ``pos``): their keys
    and values written at ``cache.length``, then attention over the cache under ``mask`` [n, slots].
    Returns the last hidden states and the new keys and values."""
    keys, values = list(cache.keys), list(cache.values)
    n_pos = max(c.max_len, cache_slots(cache))  # every position a cache entry can take
    for li, block in enumerate(params["blocks"]):
        q, k, v = _qkv(block, c, h, pos, n_pos)
        keys[li] = jax.lax.dynamic_update_slice(keys[li], k.transpose(1, 2, 0), (0, 0, cache.length))
        values[li] = jax.lax.dynamic_update_slice(values[li], v.transpose(1, 0, 2), (0, cache.length, 0))
        h = _attend_cache(block, c, h, q, keys[li], values[li], mask)
    return h, tuple(keys), tuple(values)


@functools.partial(jax.jit, static_argnums=1)
def _extend(params, c: Config, cache: KVCache, tokens):
    """Append ``tokens`` [n] after ``cache.length`` positions: rows [n, V], new cache, keys computed."""
    n = tokens.shape[0]
    start = cache.length
    pos = start + jnp.arange(n)
    h = _embed(params, c, tokens, jnp.minimum(pos, c.max_len - 1))
    j = jnp.arange(cache_slots(cache))  # the cache's own size (a lane's cache may differ from max_len)
    mask = j[None, :] <= pos[:, None]  # causal over the cache: earlier entries and these tokens
    h, keys, values = cached_layers(params, c, cache, h, pos, mask)  # W_K on the n new positions only
    return _head(params, c, h), KVCache(keys, values, start + n), jnp.int32(n * c.layers)


def check_cacheable(c: Config) -> None:
    """Refuse a KV cache for a bidirectional network: its earlier keys change with every new token."""
    if not c.causal:
        raise ValueError("a KV cache needs causal attention: without the mask, appending a token changes the "
                         "hidden states, hence the keys and values, of every earlier position above the first "
                         "layer, so cached entries go stale; use Transformer.probs (full recomputation)")


# --- the model object --------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Transformer:
    """A seeded causal transformer as a specsample model (a pytree: weights are leaves).

    ``probs(tokens)`` gives the next-token distribution after every position of ``tokens``
    ([..., T] -> [..., T, V]): row t follows ``tokens[..., : t + 1]``. The cache methods work on
    one sequence (vmap them for lanes).
    """

    params: dict
    config: Config = dataclasses.field(metadata=dict(static=True))

    @classmethod
    def create(cls, seed: int, **config) -> "Transformer":
        """A network with random weights from ``seed`` and :class:`Config` fields as keywords."""
        c = _check_config(Config(**config))
        return cls(init(jax.random.key(int(seed)), c), c)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab

    def perturbed(self, seed: int, scale: float) -> "Transformer":
        """A draft: this network with weights moved by ``scale`` std (0: the same network)."""
        return Transformer(perturb(jax.random.key(int(seed)), self.params, scale), self.config)

    def with_temperature(self, temperature: float) -> "Transformer":
        return Transformer(self.params, _check_config(self.config._replace(temperature=float(temperature))))

    def bidirectional(self) -> "Transformer":
        """The same weights without the causal mask (to show why caching needs it)."""
        return Transformer(self.params, self.config._replace(causal=False))

    def _check_tokens(self, tokens):
        t = tokens.shape[-1]
        if t < 1 or t > self.config.max_len:
            raise ValueError(f"a sequence of {t} tokens does not fit this network (1 to max_len = "
                             f"{self.config.max_len}); build it with a larger max_len")

    def probs(self, tokens):
        """Teacher-forced next-token rows for every position (jit/vmap friendly).

        Called eagerly on a batch [N, T] it runs one jitted pass on a shape padded to a bucket
        (N to a power of two up to 1,024 and to a multiple of 1,024 above, so a large batch pads
        fewer than 1,024 rows; T to a multiple of 8; a causal row does not see later padding),
        so many calls of assorted shapes compile a handful of executables, not one per primitive
        and shape: a process that compiles thousands exhausts the kernel's memory-map limit.
        """
        if np.ndim(tokens) == 2 and not isinstance(tokens, jax.core.Tracer) and self.config.causal:
            host = np.asarray(tokens, np.int32)  # padded and cut on the host: no eager op to compile per shape
            self._check_tokens(host)
            n, t = host.shape
            big_n = max(64, 1 << max(0, n - 1).bit_length()) if n <= 1024 else -(-n // 1024) * 1024
            big_t = min(self.config.max_len, -(-t // 8) * 8)
            padded = np.zeros((big_n, big_t), np.int32)
            padded[:n, :t] = host
            # a new process loads the pass whole rather than trace it again (the stage pass and the exact
            # laws call this for each transformer case: a few tenths of a second each)
            rows = program_cache.call(_batch_probs, ("transformer-batch-probs",), self, padded)
            # device_put compiles nothing; jnp.asarray would compile a program per shape (jax's `stage`)
            return jax.device_put(np.asarray(rows)[:n, :t])
        tokens = jnp.asarray(tokens, jnp.int32)
        self._check_tokens(tokens)
        return self._probs(tokens)

    def _probs(self, tokens):
        fn = lambda x: _full(self.params, self.config, x)[0]  # noqa: E731
        for _ in range(tokens.ndim - 1):
            fn = jax.vmap(fn)
        return fn(tokens)

    def probs_counted(self, tokens):
        """:meth:`probs` of one sequence and the number of key projections it computed."""
        tokens = jnp.asarray(tokens, jnp.int32)
        self._check_tokens(tokens)
        rows, n = _full(self.params, self.config, tokens)
        return rows, int(n)

    def rows(self, tokens, start, count: int, length):
        """Rows ``start .. start + count - 1`` of the teacher-forced pass over a padded buffer
        ``tokens`` [T] whose first ``length`` entries are real (``start`` and ``length`` may be
        traced; ``count`` is static). One compiled pass serves every history length."""
        rows, _ = _full(self.params, self.config, jnp.asarray(tokens, jnp.int32), length)
        return jax.lax.dynamic_slice_in_dim(rows, start, count)

    def probs_np(self, tokens) -> np.ndarray:
        return np.asarray(self.probs(tokens), dtype=np.float64)

    def prefill(self, tokens):
        """A cache holding ``tokens`` [n]: (rows [n, V], cache, key projections computed)."""
        return self.extend(empty_cache(self.config), tokens)

    def extend(self, cache: KVCache, tokens):
        """Append ``tokens`` [n] to the cache: (rows [n, V] after each new token, cache, keys computed)."""
        check_cacheable(self.config)
        tokens = jnp.atleast_1d(jnp.asarray(tokens, jnp.int32))
        if not isinstance(cache.length, jax.core.Tracer) and int(cache.length) + tokens.shape[0] > self.config.max_len:
            raise ValueError(f"the cache holds {int(cache.length)} positions and max_len is {self.config.max_len}; "
                             f"{tokens.shape[0]} more do not fit")
        rows, new, n = _extend(self.params, self.config, cache, tokens)
        return rows, new, n


# --- counted generation: what a cache saves -------------------------------------------------


class Generation(NamedTuple):
    """Tokens generated after a prompt, and the key projections computed per layer."""

    tokens: tuple
    keys_per_layer: int


def n_naive(prompt: int, k: int) -> int:
    """Key projections per layer when each of k tokens reruns the full pass: k T + k (k - 1) / 2."""
    return k * prompt + k * (k - 1) // 2


def n_cached(prompt: int, k: int) -> int:
    """Key projections per layer with a cache: the prompt once, then each new token but the last: T + k - 1."""
    return prompt + k - 1


def generate_naive(model: Transformer, prompt, k: int) -> Generation:
    """Greedy generation of k tokens, a full teacher-forced pass per token (no cache)."""
    toks = [int(x) for x in np.asarray(prompt).ravel()]
    keys = 0
    for _ in range(k):
        rows, n = model.probs_counted(np.array(toks))
        keys += n
        toks.append(int(jnp.argmax(rows[-1])))
    return Generation(tuple(toks[len(toks) - k:]), keys // model.config.layers)


def generate_cached(model: Transformer, prompt, k: int) -> Generation:
    """Greedy generation of k tokens with a KV cache: one prefill, then one new position per step.

    The k-th token is emitted without being fed back, so its key is never computed.
    """
    rows, cache, keys = model.prefill(np.asarray(prompt).ravel())
    out = []
    for i in range(k):
        x = int(jnp.argmax(rows[-1]))
        out.append(x)
        if i < k - 1:
            rows, cache, n = model.extend(cache, jnp.array([x]))
            keys += n
    return Generation(tuple(out), int(keys) // model.config.layers)


def stale_cache_rows(model: Transformer, tokens) -> float:
    """Largest |row difference| between a cache fed one token at a time and full recomputation.

    0 (to float precision) for a causal network; for a bidirectional one (:meth:`bidirectional`)
    the cache keeps stale keys and the rows differ. The cache check is bypassed here on purpose.
    """
    c = model.config
    tokens = jnp.asarray(tokens, jnp.int32)
    cache = empty_cache(c)
    got = []
    for t in range(tokens.shape[0]):
        rows, cache, _ = _extend(model.params, c, cache, tokens[t:t + 1])
        got.append(rows[0])
    # a cache only ever sees earlier tokens: compare with the full pass over each prefix
    want = [_full(model.params, c, tokens, jnp.int32(t + 1))[0][t] for t in range(tokens.shape[0])]
    return float(jnp.max(jnp.abs(jnp.stack(got) - jnp.stack(want))))


def layer_keys(model: Transformer, tokens) -> jax.Array:
    """Keys of every layer in the full pass over ``tokens`` [T]: [layers, T, heads, head_dim].

    Under the causal mask the keys of the first t positions do not depend on what follows;
    without it, every layer above the first sees later tokens.
    """
    return _layer_keys(model.params, model.config, jnp.asarray(tokens, jnp.int32))


@functools.partial(jax.jit, static_argnums=1)
def _layer_keys(params, c: Config, tokens):
    # jitted: one program per shape, where the pass run eagerly compiled each of its primitives one by one
    return jnp.stack(_forward(params, c, tokens)[1])


# --- timing: why verification is parallel and generation is not ----------------------------


def time_generation(model: Transformer, prompt: int, k: int, repeats: int = 3) -> dict:
    """Seconds per generated token, naive (a full pass per token) against cached, best of ``repeats``.

    Greedy generation of ``k`` tokens after a prompt of ``prompt`` tokens; each step waits for
    its token (``block_until_ready``), as a real decode loop must.
    """
    ctx = np.arange(prompt) % model.vocab_size

    def naive():
        toks = list(ctx)
        for _ in range(k):
            toks.append(int(jnp.argmax(_full(model.params, model.config, jnp.array(toks, jnp.int32))[0][-1])))

    def cached():
        rows, cache, _ = _extend(model.params, model.config, empty_cache(model.config), jnp.array(ctx, jnp.int32))
        for _ in range(k):
            x = jnp.argmax(rows[-1]).astype(jnp.int32)[None]
            rows, cache, _ = _extend(model.params, model.config, cache, x)
            rows.block_until_ready()

    return {"prompt": prompt, "k": k, "naive_s_per_token": best_of(naive, repeats, warmup=True) / k,
            "cached_s_per_token": best_of(cached, repeats, warmup=True) / k}


def time_verification(model: Transformer, prompt: int, k: int, repeats: int = 5) -> dict:
    """One teacher-forced pass scoring k drafted positions against k sequential one-token cache steps.

    The pass is what speculative verification does (all k rows at once); the steps are what
    generation must do (each token depends on the one before).
    """
    ctx = jnp.array(np.arange(prompt) % model.vocab_size, jnp.int32)
    drafts = jnp.array(np.arange(k) % model.vocab_size, jnp.int32)
    _, base, _ = _extend(model.params, model.config, empty_cache(model.config), ctx)

    def parallel():
        _extend(model.params, model.config, base, drafts)[0].block_until_ready()

    def sequential():
        cache = base
        for i in range(k):
            rows, cache, _ = _extend(model.params, model.config, cache, drafts[i:i + 1])
            rows.block_until_ready()

    return {"prompt": prompt, "k": k, "one_pass_s": best_of(parallel, repeats, warmup=True),
            "sequential_s": best_of(sequential, repeats, warmup=True)}


@jax.jit
def _batch_probs(model: "Transformer", tokens):
    # sequences in batches of 256, not one vmap over all: 2.5-3x faster on a CPU at N = 3,072 (a batch's
    # activations stay in cache), and the same rows bit for bit (tests/test_transformer.py)
    return jax.lax.map(lambda row: _full(model.params, model.config, row)[0], tokens, batch_size=256)


def __getattr__(name):
    # expected_acceptance is an exact law and moved to specsample.laws.exact (models import no laws);
    # the old name, documented before the stage folders, still resolves, on first use only
    if name == "expected_acceptance":
        from ..laws.exact import expected_acceptance

        return expected_acceptance
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
