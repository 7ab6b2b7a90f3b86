"""The scheme interface: one speculative round for one lane, as pure functions.

A scheme is a small NamedTuple built by a factory that closes over its parameters (the
draft length k and anything else), in the style of optax's GradientTransformation. The
engine vmaps ``step`` over lanes and jits it; the scheme never sees the batch.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..models.tables import draw_weights


class RoundOutput(NamedTuple):
    """What one round of one lane produced.

    Attributes
    ----------
    tokens : int32[max_tokens]
        Emitted tokens; entries at and beyond ``n_emitted`` are ignored.
    n_emitted : int32[]
        Tokens emitted this round, 1 <= n_emitted <= max_tokens.
    n_accepted : int32[]
        Drafts accepted this round, 0 <= n_accepted <= k.
    drafts : int32[n_drafts]
        Drafted tokens whose acceptance the round may have tested.
    draft_tested, draft_accepted : bool[n_drafts]
        Whether each draft's acceptance test ran, and whether it passed.
    """

    tokens: jax.Array
    n_emitted: jax.Array
    n_accepted: jax.Array
    drafts: jax.Array
    draft_tested: jax.Array
    draft_accepted: jax.Array


StepFn = Callable[[jax.Array, object, object, jax.Array], RoundOutput]
LawFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


class Scheme(NamedTuple):
    """A draft-and-verify rule.

    Attributes
    ----------
    name : str
    k : int
        Draft length (drafts per round).
    max_tokens : int
        Static upper bound on tokens emitted per round (k + 1 for the standard scheme).
    step : callable
        ``step(key, target, draft, context) -> RoundOutput`` for one lane. ``context`` is
        an int32 vector of the most recent tokens (length >= both models' orders); the
        models honour :class:`specsample.models.interface.Model` (required methods, optional
        fast-path attributes that a round reads with a fallback), so a step may wrap them. A
        :class:`UniformStep` (a round written as a function of its uniforms) is a step
        too, and the engine runs it faster.
    accepted_law : callable or None
        ``(p, q) -> law`` of accepted drafts per round (length k + 1) for context-free
        float64 pairs, when the scheme has such a theory.
    token_acceptance : callable or None
        ``(p, q) -> rates``: probability that a drafted token x is accepted when tested.
    lossless : bool
        False for negative controls: the battery must reject them.
    description : str
    target_law : callable or None
        Maps the target's probability table to the law the output must follow, when that
        is not p itself (greedy decoding: one-hot on the argmax).
    rule : str or None
        The verification rule whose stage laws each round claims (``"standard"``: drafts from
        q, acceptance min(1, p / q), residual at the first rejection, bonus from p), so the
        battery's stage pass can say which stage a failure comes from
        (:mod:`specsample.battery.diagnosis`). None: no stage laws (multi-draft and block rules).
    prepare : callable or None
        ``(target, draft) -> (target, draft)``, run on the host on the device models of table
        pairs before any round: tables the step reads instead of building rows per lane (a token
        tree's residual chains, :mod:`specsample.models.tree_chains`). A step must give the same law
        with or without them. None: nothing to prepare.
    """

    name: str
    k: int
    max_tokens: int
    step: StepFn
    accepted_law: Optional[LawFn] = None
    token_acceptance: Optional[LawFn] = None
    lossless: bool = True
    description: str = ""
    target_law: Optional[Callable[[np.ndarray], np.ndarray]] = None
    rule: Optional[str] = None
    prepare: Optional[Callable] = None


@dataclasses.dataclass(frozen=True)
class UniformStep:
    """A step whose randomness is ``n`` U[0, 1) numbers: ``round(u, target, draft, context)``.

    Calling it with a key is the ``step`` contract: ``step(key, ...) ==
    round(jax.random.uniform(key, (n,)), ...)``. The engine recognises it and draws the
    uniforms of all lanes in one call, laid out lanes-last ``(n, lanes)``, which on CPU is
    2-3x faster than a key per lane (a per-lane draw of a few numbers does not vectorise).
    Replacing a scheme's ``step`` by a plain function simply takes the per-lane key path.
    """

    round: Callable
    n: int

    def __call__(self, key, target, draft, context) -> RoundOutput:
        return self.round(jax.random.uniform(key, (self.n,)), target, draft, context)


@dataclasses.dataclass(frozen=True)
class StatefulStep:
    """A round whose lanes carry state from round to round: models with KV caches.

    ``round(u, target, draft, state) -> (RoundOutput, state)`` plays one round from ``n``
    uniforms; ``init(target, draft, prompt, length) -> state`` is a lane's state at the start
    of every sequence (``prompt``: the int32 tokens every sequence starts after, ``length``:
    the tokens the engine keeps per sequence, so caches can be sized). The state is any
    pytree of arrays (caches, a token buffer); the engine keeps one per lane in its loop and
    resets it when a sequence is complete, so what a round leaves in the caches is what the
    next round starts from, and a cache bug shows in the counts like any other.

    ``rule`` names the verification rule the round implements, when its rounds follow a law
    specsample can compute exactly (``"standard"``: draft k tokens from q, accept with
    ``u < p / q``, resample the residual, bonus from p). The battery then also tests the
    number of rounds each sequence takes, which is how a draft-side cache bug shows: it
    leaves the output law alone (the same wrong q rows draft and score the drafts) and only
    lowers acceptance. A stateless :class:`UniformStep` is the trivial case (no state).

    ``restart(complete, state, fresh) -> state`` (optional, per lane): the state a lane plays its
    next round from, given the state its round left (``state``), the state ``init`` gave
    (``fresh``) and whether its sequence is now complete (a bool). It must equal ``fresh`` where
    ``complete`` as far as any later round can read, and ``state`` elsewhere. None: the fresh state
    is copied in, leaf by leaf. A cache read only below its length needs only its length reset
    (:func:`~specsample.schemes.cached.restart_cached`): copying every cache in held the bench's
    ``cached`` pair at 0.92-0.95 of the speed.
    """

    round: Callable
    n: int
    init: Callable
    rule: Optional[str] = None
    restart: Optional[Callable] = None

    def __call__(self, key, target, draft, state):
        return self.round(jax.random.uniform(key, (self.n,)), target, draft, state)


# --- building blocks shared by schemes (and by user schemes) -------------------------


def fenced(fn: Callable, anchor) -> object:
    """``fn()``, computed whole and stored before anything reads it: a fence against fusion.

    XLA on CPU fuses an elementwise producer into every consumer, so a value that many
    outputs read (a tree walk's state, say) is computed again inside each of them, and it
    removes ``jax.lax.optimization_barrier`` before fusion. A loop's result is a stored
    buffer, so ``fn`` runs as the body of a ``while_loop`` that stops after one pass. Its trip
    count comes from ``anchor`` (any array of the program, e.g. a probability table: ``1 + (a <
    -1)`` with ``a`` its first element), which XLA cannot see through, so it cannot unroll the
    loop away; the body does not read the loop's carry, so a second pass would change nothing.
    The value is ``fn()``'s to the bit. On a token tree this made the walk 2-3 x faster.
    """
    one = 1 + (jnp.ravel(jnp.asarray(anchor))[0] < -1).astype(jnp.int32)
    shapes = jax.eval_shape(fn)
    init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    _, out = jax.lax.while_loop(lambda c: c[0] < one, lambda c: (c[0] + 1, fn()), (jnp.zeros((), jnp.int32), init))
    return out


def sample_weights(weights: jax.Array, u: jax.Array) -> jax.Array:
    """Inverse-CDF draw from non-negative, unnormalised ``weights`` with a uniform ``u``.

    Never returns an index of weight zero (when some weight is positive), whatever the
    rounding of the cumulative sum (see :func:`specsample.models.tables.draw_weights`).
    """
    return draw_weights(weights, u)


def draft_tokens(u: jax.Array, draft, context: jax.Array, k: int) -> jax.Array:
    """Draft k tokens autoregressively from ``draft`` after ``context`` (int32[k]).

    A draft with context (order >= 1) draws its chain in a ``lax.scan``, a step per token: written
    out, XLA on CPU fused each draw's lookups with every draw before it, recomputing the chain in
    each fusion (an order-2 draft at k = 8 ran at less than half this speed). A context-free
    draft's draws are independent and stay written out. The same tokens either way.
    """
    m = draft.order
    if k == 0:
        return jnp.zeros(0, jnp.int32)
    if m == 0:
        # materialised once: left to fusion, XLA recomputed each draw (uniform to alias lookup) inside both
        # probability lookups that read it (the standard rule at V = 64, k = 4: 1.04-1.06 x the rounds/s)
        return jax.lax.optimization_barrier(jnp.stack([draft.sample(context[:0], u[i]) for i in range(k)]))

    def step(window, ui):  # the window as a tuple of tokens: a batch of lanes carries m contiguous rows
        x = draft.sample(jnp.stack(window), ui)
        return window[1:] + (x,), x

    w = context.shape[-1]
    return jax.lax.scan(step, tuple(context[w - m + j] for j in range(m)), u[:k])[1]


def target_rows(target, context: jax.Array, drafts: jax.Array) -> jax.Array:
    """The target's k + 1 distributions in one teacher-forced call (the parallel pass).

    Row i is p(. | context, x_1..x_i); row k gives the bonus token.
    """
    w = context.shape[-1]
    return target.probs(jnp.concatenate([context[w - target.order :], drafts]))


def leading_true(mask: jax.Array, anchor=None) -> jax.Array:
    """Number of leading True entries (the accepted prefix): the first False, or all of them.

    A running AND over the entries (an ``argmin`` past 64 of them), computed behind a :func:`fenced`:
    the count feeds every output of a round, and XLA on CPU would otherwise compute the acceptance
    tests again inside each of them; an ``argmin`` is a reduction that XLA runs lane by lane, with
    those tests inside it (a standard round at V = 8, k = 8 ran at two thirds of this speed).

    ``anchor`` gives the fence its trip count (default: ``mask``). Pass an array that is the same in
    every lane of the engine (a probability table, a network's weights): a count read from the mask
    differs lane by lane under the engine's ``vmap``, which then runs the fence's loop lane by lane
    (a predicate per lane, a select of the carry, a reduction per trip). A standard round at V = 64,
    k = 4 ran 1.01-1.12 x as fast with the target's table as anchor; the count is the same.
    """
    n = mask.shape[-1]
    if n == 0:
        return jnp.zeros(mask.shape[:-1], jnp.int32)
    if n > 64:
        return jnp.where(jnp.all(mask), n, jnp.argmin(mask)).astype(jnp.int32)

    def count():
        run, total = True, jnp.zeros(mask.shape[:-1], jnp.int32)
        for i in range(n):
            run = run & mask[..., i]
            total = total + run
        return total

    return fenced(count, mask if anchor is None else anchor)


def residual(p_row: jax.Array, q_row: jax.Array) -> jax.Array:
    """Unnormalised residual max(0, p - q), falling back to p where it vanishes.

    The fallback matters only when p == q (0/0 in the normalised form), where a
    rejection cannot happen anyway; it keeps the arithmetic free of NaN.
    """
    r = jnp.maximum(p_row - q_row, 0.0)
    return jnp.where(jnp.sum(r) > 0, r, p_row)


def emit(drafts: jax.Array, n_accepted: jax.Array, last: jax.Array, tested: jax.Array | None = None,
         accepted: jax.Array | None = None, anchor=None) -> RoundOutput:
    """Assemble a round: the accepted drafts, then ``last`` (a resampled or bonus token).

    ``anchor`` (an array the same in every lane, e.g. the target's table: see :func:`fenced`): the
    tokens are written as one select a slot, from ``last`` stored behind a fence. Without it they are
    a scatter into the drafts. Both give the same tokens. XLA on CPU lays the scatter's result out lane
    by lane, and the engine's counting then reads it transposed. Unfenced, the selects computed the last
    token again in each slot (at V = 8, k = 8 nine fusions of 8 us). Fenced, the standard rule ran
    1.0-1.1 x at V = 64, k = 4 and 1.08 x at V = 8, k = 8, ``greedy`` 1.30-1.37 x and ``block``
    1.01-1.03 x. The table rules pass their table; the KV-cache rules, whose models carry none, keep the
    scatter.
    """
    k = drafts.shape[0]
    if anchor is None:
        tokens = jnp.concatenate([drafts, jnp.zeros(1, jnp.int32)]).at[n_accepted].set(last)
    else:  # ``.at[n_accepted]``'s slot: a negative count wraps, as in indexing
        slot = jnp.where(n_accepted < 0, n_accepted + k + 1, n_accepted)
        last, slot = fenced(lambda: (last, slot), anchor)
        tokens = jnp.stack([jnp.where(slot == i, last, drafts[i] if i < k else 0) for i in range(k + 1)])
    i = jnp.arange(k)
    return RoundOutput(
        tokens=tokens,
        n_emitted=(n_accepted + 1).astype(jnp.int32),
        n_accepted=n_accepted.astype(jnp.int32),
        drafts=drafts,
        draft_tested=i <= n_accepted if tested is None else tested,
        draft_accepted=i < n_accepted if accepted is None else accepted,
    )
