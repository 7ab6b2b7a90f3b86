"""Standard speculative sampling with neural models and KV caches, and its cache controls.

The round (Leviathan et al. 2023; Chen et al. 2023) is the standard rule of
:mod:`specsample.schemes.standard`; what is new is where the rows come from. Each lane keeps
its token history and both models' KV caches (:class:`CachedState`) from round to round:

1. **draft**: feed the draft cache the history tokens it has not seen (one, or two after a
   round that accepted every draft: the k-th draft was never fed), then draft x_1..x_k with
   k - 1 single-token extends; the rows that drafted them are the q rows of the ratio test;
2. **verify**: one multi-token extend of the target cache by (last token, x_1..x_k) gives
   the k + 1 target rows at once;
3. accept while ``u_i q_i(x_i) < p_i(x_i)``; the last token comes from the residual
   ``norm(max(0, p_j - q_j))`` at the first rejection j, or from p's row k (the bonus);
4. **roll back** both caches to the accepted prefix: the target keeps everything but the
   last token, the draft keeps the accepted drafts it has seen. The last token enters both
   caches at the start of the next round.

A rollback bug shows only in the *next* round, which is why these schemes carry state. The
cache-free twin :func:`recompute` plays the same round from the same uniforms with a
teacher-forced pass over the whole history at every step (no cache to get wrong); the two
emit the same tokens up to float32 ties (:func:`differential_check`).

Controls (``control:`` names) differ from :func:`cached` in one place each:

* ``target-cache-not-rolled-back``: rejected drafts stay in the target's cache, so the next
  round's rows condition on them (and rotary positions keep counting): the output law moves;
* ``draft-cache-not-rolled-back``: rejected drafts stay in the draft's cache. The same
  wrong q rows draft and score the drafts, so the output law is still p (speculative sampling
  is lossless for any q); what moves is acceptance, which the battery's rounds-per-sequence
  test sees ("acceptance collapsed");
* ``last-token-not-in-draft-cache``: the resampled or bonus token is fed to the draft to get
  the next row, but its key and value are never kept: the draft forgets every such token;
* ``bonus-not-in-target-cache``: after a round that accepted every draft, the verify pass feeds
  the target the k-th draft again instead of the pending bonus token, so the bonus never enters
  the target's cache. Only rounds after a full acceptance go wrong: the windows of the V = 2
  transformer cases (L = 2k + 3) hold them at every k.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ..models.transformer import KVCache, empty_cache
from .base import Scheme, StatefulStep, emit, leading_true, residual, sample_weights
from .standard import split_uniforms, standard_law


class CachedState(NamedTuple):
    """A lane between rounds: its history and both caches.

    ``tokens[:n]`` is the prompt then every token emitted so far (the rest is scratch);
    the target cache holds ``tokens[:n - 1]``; the draft cache holds all but the last
    ``draft_pending`` (1 or 2) history tokens.
    """

    tokens: jax.Array  # int32 [prompt + length + k + 2]
    n: jax.Array  # int32
    target_cache: KVCache
    draft_cache: KVCache
    draft_pending: jax.Array  # int32


class History(NamedTuple):
    """A lane of the cache-free round: its history ``tokens[:n]`` only."""

    tokens: jax.Array
    n: jax.Array


def _buffer(prompt, length: int, k: int):
    p = jnp.asarray(prompt, jnp.int32)
    return jnp.zeros(p.shape[0] + length + k + 2, jnp.int32).at[: p.shape[0]].set(p)


SLOT_MULTIPLE = 8  # cache slots come in whole groups of 8: a row of scores fills whole SIMD registers


def whole_slots(n: int) -> int:
    """``n`` cache slots rounded up to a multiple of :data:`SLOT_MULTIPLE`.

    A round's attention scores and their softmax run along the slots, the innermost axis: at 14
    slots XLA's CPU loops ended in a remainder, and the bench's V = 32, k = 4 pair (L = 6) ran 1.1 x as
    fast with 16 slots (its k = 8 twin: 18 or 24 slots alike, 32 slower). Slots past what a round
    writes stay masked, with weight exactly 0: the same counts (the quick ``cached`` and
    ``tree-cached`` reports unchanged)."""
    return -(-int(n) // SLOT_MULTIPLE) * SLOT_MULTIPLE


def cache_size(prompt_len: int, length: int, k: int, rolled_back: bool = True) -> int:
    """Positions a lane's cache needs, in :func:`whole_slots`.

    Rolled back: a round starts with fewer than ``length`` tokens emitted after the prompt and writes
    at most k + 1 entries past them, so the token buffer's size (prompt + length + k + 2) is enough.
    A cache that is never rolled back (the rollback controls) keeps up to k + 1 entries per round
    over at most ``length`` rounds. The size matters: every round attends over, and copies, the
    whole cache (the 19-token V = 2 case at k = 8 ran 10x slower with the second size).
    """
    return whole_slots(prompt_len + length + k + 2 if rolled_back else prompt_len + (length + 1) * (k + 1))


def init_cached(target, draft, prompt, length: int, *, k: int, rolled_back: bool = True) -> CachedState:
    """Both caches prefilled with the prompt but its last token (fed by the first round)."""
    return prefilled_state(target, draft, prompt, length, k, cache_size(len(prompt), length, k, rolled_back))


def prefilled_state(target, draft, prompt, length: int, k: int, size: int) -> CachedState:
    """A lane's state before its first round: caches of ``size`` slots holding the prompt but its last
    token, a token buffer for ``length`` tokens and one round's k + 1 of scratch."""
    prompt = jnp.asarray(prompt, jnp.int32)
    caches = []
    for model in (target, draft):
        cache = empty_cache(model.config, size)
        if prompt.shape[0] > 1:
            _, cache, _ = model.extend(cache, prompt[:-1])
        caches.append(cache)
    return CachedState(_buffer(prompt, length, k), jnp.int32(prompt.shape[0]), caches[0], caches[1], jnp.int32(1))


def restart_cached(complete, state: CachedState, fresh: CachedState) -> CachedState:
    """A lane's state for its next round (:class:`~specsample.schemes.base.StatefulStep`'s ``restart``):
    where ``complete``, the lengths and counters of ``fresh``, the arrays as the round left them.

    A round reads a cache only below its length and the token buffer only below its count, plus the
    entries it writes itself, and writes nothing below the prompt's; what lies past them is masked with
    weight exactly 0. So a restarted lane reads what a fresh one does: the same rows, the same tokens.
    """

    def pick(a, b):
        return jnp.where(complete, a, b)

    def cache(c: KVCache, c0: KVCache) -> KVCache:
        return KVCache(c.keys, c.values, pick(c0.length, c.length))

    return CachedState(state.tokens, pick(fresh.n, state.n), cache(state.target_cache, fresh.target_cache),
                       cache(state.draft_cache, fresh.draft_cache), pick(fresh.draft_pending, state.draft_pending))


def cached_round(u, target, draft, state: CachedState, *, k: int, roll_target: bool = True,
                 roll_draft: bool = True, keep_last: bool = True, bonus_to_target: bool = True):
    """One standard round with KV caches (module docstring); the flags are the controls' bugs."""
    u_draft, u_accept, u_final = split_uniforms(u, k)
    n, pend = state.n, state.draft_pending
    # 1. draft: the pending history tokens in one extend (a fixed window of 2, the extra one
    #    dropped by the rollback), then one extend per draft but the last
    d_start = state.draft_cache.length
    rows, dc, _ = draft.extend(state.draft_cache, jax.lax.dynamic_slice(state.tokens, (n - pend,), (2,)))
    fed = d_start + pend - (0 if keep_last else 1)  # the control forgets the last token's key and value
    dc = dc.rollback(fed)

    # a scan, not a Python loop: one extend in the program whatever k (k = 8 compiles in 2.9-3.5 s, not 4.6-5.4)
    def draft_one(carry, u_i):
        dc, q_i = carry
        x = sample_weights(q_i, u_i)
        r, dc, _ = draft.extend(dc, x[None])
        return (dc, r[0]), (x, q_i)

    (dc, q_last), (xs, qs) = jax.lax.scan(draft_one, (dc, jnp.where(pend == 2, rows[1], rows[0])), u_draft[: k - 1])
    drafts = jnp.concatenate([xs, sample_weights(q_last, u_draft[k - 1])[None]])
    q = jnp.concatenate([qs, q_last[None]])
    # 2. verify: the k + 1 target rows in one pass over the last token and the drafts
    t_start = state.target_cache.length
    last = state.tokens[n - 1]
    if not bonus_to_target:  # the control: after a full acceptance the k-th draft is fed again, not the bonus
        last = jnp.where(pend == 2, state.tokens[n - 2], last)
    p, tc, _ = target.extend(state.target_cache, jnp.concatenate([last[None], drafts]))
    # 3. accept / reject, last token (as in specsample.schemes.standard)
    idx = jnp.arange(k)
    j = leading_true(u_accept * q[idx, drafts] < p[idx, drafts])
    q_j = jnp.where(j < k, q[jnp.minimum(j, k - 1)], 0.0)  # row k: the bonus, from p itself
    out = emit(drafts, j, sample_weights(residual(p[j], q_j), u_final))
    # 4. roll back to the accepted prefix; the last token is pending for both caches
    if roll_target:
        tc = tc.rollback(t_start + 1 + j)
    if roll_draft:
        dc = dc.rollback(fed + jnp.minimum(j, k - 1))
    tokens = jax.lax.dynamic_update_slice(state.tokens, out.tokens, (n,))
    new = CachedState(tokens, n + out.n_emitted, tc, dc, jnp.where(j == k, 2, 1).astype(jnp.int32))
    return out, new


def init_history(target, draft, prompt, length: int, *, k: int) -> History:
    prompt = jnp.asarray(prompt, jnp.int32)
    return History(_buffer(prompt, length, k), jnp.int32(prompt.shape[0]))


def restart_history(complete, state: History, fresh: History) -> History:
    """:func:`restart_cached` for a cache-free lane: its count, not its buffer (read only below the count)."""
    return History(state.tokens, jnp.where(complete, fresh.n, state.n))


def recompute_round(u, target, draft, state: History, *, k: int):
    """The same round without caches: every row from a teacher-forced pass over the history."""
    u_draft, u_accept, u_final = split_uniforms(u, k)
    n, buf = state.n, state.tokens

    def draft_one(buf, iu):  # the draft's row after history + x_1..x_i: a full pass each (no cache)
        i, u_i = iu
        q_i = draft.rows(buf, n - 1 + i, 1, n + i)[0]
        x = sample_weights(q_i, u_i)
        return buf.at[n + i].set(x), (x, q_i)

    buf, (drafts, q) = jax.lax.scan(draft_one, buf, (jnp.arange(k), u_draft))  # one pass in the program, as above
    p = target.rows(buf, n - 1, k + 1, n + k)  # the k + 1 verification rows, one pass
    idx = jnp.arange(k)
    j = leading_true(u_accept * q[idx, drafts] < p[idx, drafts])
    q_j = jnp.where(j < k, q[jnp.minimum(j, k - 1)], 0.0)
    out = emit(drafts, j, sample_weights(residual(p[j], q_j), u_final))
    return out, History(jax.lax.dynamic_update_slice(state.tokens, out.tokens, (n,)), n + out.n_emitted)


def _scheme(name, k, round_fn, init_fn, description, lossless=True, restart=restart_cached, **hooks) -> Scheme:
    k = int(k)
    return Scheme(
        name=name,
        k=k,
        max_tokens=k + 1,
        step=StatefulStep(functools.partial(round_fn, k=k, **hooks), 2 * k + 1,
                          functools.partial(init_fn, k=k), rule="standard", restart=restart),
        accepted_law=standard_law(k),
        lossless=lossless,
        description=description,
    )


def cached(k: int = 4) -> Scheme:
    """Standard speculative sampling over neural models with KV caches (rolled back each round)."""
    return _scheme("cached", k, cached_round, init_cached,
                   "standard rule with target and draft KV caches, rolled back to the accepted prefix")


def recompute(k: int = 4) -> Scheme:
    """Standard speculative sampling over neural models, every row recomputed (no cache)."""
    return _scheme("recompute", k, recompute_round, init_history,
                   "standard rule, every row from a teacher-forced pass over the history (no cache)",
                   restart=restart_history)


_CACHE_CONTROLS = {
    "target-cache-not-rolled-back": (dict(roll_target=False),
                                     "rejected drafts left in the target's KV cache (no rollback)"),
    "draft-cache-not-rolled-back": (dict(roll_draft=False),
                                    "rejected drafts left in the draft's KV cache (acceptance drops)"),
    "last-token-not-in-draft-cache": (dict(keep_last=False),
                                      "the resampled/bonus token is never written into the draft's cache"),
    "bonus-not-in-target-cache": (dict(bonus_to_target=False),
                                  "after a full acceptance the bonus never enters the target's cache"),
}


def _control(name: str):
    hooks, description = _CACHE_CONTROLS[name]

    # a cache that is never rolled back grows by k + 1 a round: the control's lanes get the room
    init = functools.partial(init_cached, rolled_back=hooks.get("roll_target", True) and hooks.get("roll_draft", True))

    def make(k: int = 4) -> Scheme:
        return _scheme(f"control:{name}", k, cached_round, init, description, lossless=False, **hooks)

    make.__name__ = name.replace("-", "_")
    make.__doc__ = f"Negative control (KV caches): {description}."
    return make


CACHE_CONTROLS = {f"control:{name}": _control(name) for name in _CACHE_CONTROLS}


class DifferentialResult(NamedTuple):
    """Rounds played by both implementations from the same history and uniforms, and how many differed."""

    rounds: int
    differing: int

    @property
    def fraction(self) -> float:
        return self.differing / self.rounds if self.rounds else float("nan")


@functools.partial(jax.jit, static_argnames=("k", "length", "rounds", "lanes"))
def _differential(target, draft, prompt, key, *, k, length, rounds, lanes):
    fresh = init_cached(target, draft, prompt, length, k=k)
    states = jax.tree.map(lambda x: jnp.broadcast_to(x, (lanes,) + x.shape), fresh)
    with_cache = jax.vmap(functools.partial(cached_round, k=k), in_axes=(0, None, None, 0))
    without = jax.vmap(functools.partial(recompute_round, k=k), in_axes=(0, None, None, 0))
    i = jnp.arange(k + 1)

    def body(states, r):
        u = jax.random.uniform(jax.random.fold_in(key, r), (lanes, 2 * k + 1))
        a, new = with_cache(u, target, draft, states)
        b, _ = without(u, target, draft, History(states.tokens, states.n))  # the same history
        differ = (a.n_emitted != b.n_emitted) | jnp.any((i < a.n_emitted[:, None]) & (a.tokens != b.tokens), axis=1)
        done = new.n >= prompt.shape[0] + length
        new = jax.tree.map(lambda s, s0: jnp.where(done.reshape((-1,) + (1,) * (s.ndim - 1)), s0, s), new, fresh)
        return new, jnp.sum(differ)

    _, differing = jax.lax.scan(body, states, jnp.arange(rounds, dtype=jnp.uint32))
    return jnp.sum(differing)


def differential_check(target, draft, prompt=(0,), *, k: int = 4, length: int = 8, rounds: int = 64,
                       lanes: int = 256, seed: int = 0) -> DifferentialResult:
    """Play :func:`cached_round` and :func:`recompute_round` from the same uniforms and history.

    ``lanes`` lanes run ``rounds`` rounds of the cached scheme (a lane starts again after the
    prompt once it has ``length`` tokens); at every round the cache-free round is played from
    the same history with the same 2k + 1 uniforms, and the round counts as differing when the
    emitted tokens do. Rows from a cache and from a full pass agree to float32 rounding, so
    only a uniform within about 1e-7 of a decision boundary can tell them apart: expect 0.
    """
    k, length, rounds, lanes = int(k), int(length), int(rounds), int(lanes)
    prompt = jnp.asarray(prompt, jnp.int32)
    n = _differential(target, draft, prompt, jax.random.key(int(seed)), k=k, length=length, rounds=rounds,
                      lanes=lanes)
    return DifferentialResult(rounds * lanes, int(n))
