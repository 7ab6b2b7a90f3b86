"""The counting engine: millions of speculative rounds, counted on device.

Layout of the randomness (what makes runs reproducible)
-------------------------------------------------------
The unit of work is a *block*: ``lanes`` independent lanes, each producing
``per_lane`` sequences of the first ``length`` stream tokens. Within a block a lane runs
rounds back to back; when its sequence has ``length`` tokens it keeps the first
``length``, resets the context and starts the next, until it has ``per_lane`` sequences.
Stopping at a fixed number of *sequences* (never of rounds) keeps the kept sequences
i.i.d. draws of the scheme's output law; stopping at a round count would favour fast
sequences. Round r of block b of a pair uses the key ``kr = fold_in(fold_in(fold_in(key(seed),
b), pair), r)``: the uniforms ``uniform(kr, (n, lanes))`` for a :class:`UniformStep` scheme
(computed by :mod:`specsample.engine.rng`, equal to ``jax.random``'s), else ``split(kr, lanes)``,
a key per lane. So the counts depend on (seed, lanes, per_lane, number of blocks) only:
not on how many blocks one jitted call processes (the chunk), nor on how many devices
share them. ``STREAM_VERSION`` names this layout; a test pins the counts of one seed.

Lanes that carry state: a scheme whose step is a :class:`~specsample.schemes.StatefulStep` (neural
models with KV caches) runs on one pair; each lane keeps the pytree the step returns (its caches and
token history) in the loop carry and gets the step's initial state, built from the prompt (an
argument of the compiled chunk), whenever its sequence is complete. Its uniforms follow the
:class:`UniformStep` layout, so the stream is reproducible in the same way.

Blocks are processed by a ``lax.scan`` inside each device's share of a chunk; each device
returns its own counts (``shard_map`` over a 1-D mesh of all devices) and the host adds them
(no collective between the devices of one process), so memory is
O(lanes + cells) whatever the number of rounds. Per-chunk device counts are int32;
host totals are int64.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import threading
import time
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from . import cells, checkpoint as _ckpt, compile_cache, lane_groups, rng
from .cells import ROUND_START_MAX_CELLS, n_prefixes, prefix_id  # noqa: F401 - prefix_id: the engine API
from .. import program_cache
from ..models.tables import TableModel, all_sequences, pair_for_device, validate_table, window_index
from ..schemes import Scheme, StatefulStep, UniformStep, builtin_identity

DEFAULT_PRNG = "threefry2x32"
COMPILE_CACHE = compile_cache.enable()  # compiled chunks kept on disk between processes (None: off)
PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
JOINT_MAX_CELLS = 1 << 16
# bumped whenever the same seed would give other counts (a checkpoint of another stream is refused)
STREAM_VERSION = 2  # 2: alias draws, paired residuals, uniforms of all lanes per round
_INT32_SAFE = 2**31 - 1


class Counts(NamedTuple):
    """Host-side int64 totals of a run (leading pair axis when a batch of pairs ran).

    Attributes
    ----------
    sequences, rounds : int64[P]
        Sequences kept and rounds run, per pair.
    position : int64[P, L, V]
        Token counts at each of the first L stream positions.
    joint : int64[P, V**L] or None
        Counts of whole first-L sequences (row-major index), when V**L is small enough.
    transitions : int64[P, V**m, V] or None
        Next-token counts per target context, for n-gram targets (m = target order).
    accepted : int64[P, k + 1]
        Rounds by number of accepted drafts.
    emitted : int64[P, max_tokens + 1]
        Rounds by number of emitted tokens.
    drafted, draft_accepted : int64[P, V]
        Per drafted token: times its acceptance was tested, and accepted.
    rounds_per_sequence : int64[P, L + 1]
        Sequences by the number of rounds they took.
    invalid : int64[P]
        Emitted token ids outside [0, V), plus rounds whose ``n_emitted`` lies outside
        [1, max_tokens] (a broken scheme).
    round_start : int64[P, (V**L - 1) // (V - 1), k + 1] or None
        Rounds by the prefix they started after (row ``prefix_id(tokens)``, see
        :func:`prefix_id`) and their number of accepted drafts: the conditional law of a
        round given where it starts. Counted for stateful standard-rule runs whose joint is
        counted (:data:`ROUND_START_MAX_CELLS`).
    record : int64[P, R, F, min(lanes, 64)] or None
        Stateful runs: every round of the run's first block as it was played (its first 64 lanes,
        :data:`specsample.engine.cells.RECORD_LANES`), round r of each lane
        (:func:`specsample.engine.cells.record_fields` names the F fields; all zero past a lane's last
        round), whatever the chunk or the devices. The stage tests read them instead of playing rounds.
    """

    sequences: np.ndarray
    rounds: np.ndarray
    position: np.ndarray
    joint: Optional[np.ndarray]
    transitions: Optional[np.ndarray]
    accepted: np.ndarray
    emitted: np.ndarray
    drafted: np.ndarray
    draft_accepted: np.ndarray
    rounds_per_sequence: np.ndarray
    invalid: np.ndarray
    round_start: Optional[np.ndarray] = None
    record: Optional[np.ndarray] = None

    def pair(self, i: int) -> "Counts":
        """The counts of pair ``i`` of a batch (no leading axis)."""
        return Counts(*(None if f is None else f[i] for f in self))


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Everything that determines the counts of a run (static under jit)."""

    scheme: Scheme
    length: int
    vocab: int
    width: int  # context window carried per lane: max of the two models' orders
    target_order: int
    lanes: int
    per_lane: int
    joint: bool
    device_transitions: bool
    prompt_len: int = 0  # a stateful scheme's lanes start every sequence after this many tokens (traced)
    round_starts: bool = False  # count rounds by (prefix at their start, drafts accepted)

    @property
    def max_drafts(self) -> int:
        return self.scheme.k

    @property
    def stateful(self) -> bool:
        return isinstance(self.scheme.step, StatefulStep)


def _block(spec: RunSpec, keys, target: TableModel, draft: TableModel, prompt=None, platform: str = "cpu"):
    """All rounds of one block for a batch of pairs (keys[pair], tables with a pair axis); returns its counts.

    The P pairs' B lanes run as one set of P * B lanes; each lane counts into its own pair's
    cells. A lane that has finished its sequences idles (its updates are masked), so the
    block ends when the slowest pair's last lane does, and every pair's counts equal those
    of a block run for that pair alone.
    """
    B, W, L, V, T = spec.lanes, spec.width, spec.length, spec.vocab, spec.scheme.max_tokens
    n_pairs = keys.shape[0]
    N = n_pairs * B
    i = jnp.arange(T)
    pair_of_lane = jnp.arange(N, dtype=jnp.int32) // B
    if spec.stateful:  # one pair of (neural) models; each lane carries its state (caches) across rounds
        st = spec.scheme.step
        n_u, play = st.n, st.round
        state0 = st.init(target, draft, prompt, L)

        def draw(r):
            return rng.uniform(jax.random.fold_in(keys[0], r), (n_u, N))

        step = jax.vmap(lambda rand, s: play(rand, target, draft, s), in_axes=(-1, 0), out_axes=(-1, 0))
        fresh = jax.tree.map(lambda x: jnp.broadcast_to(x, (N,) + x.shape), state0)

        def restart(complete, new_state):
            # a lane that is done plays on, masked, and its state is never read again: it keeps the round's
            if st.restart is not None:
                return jax.vmap(st.restart)(complete, new_state, fresh)
            return jax.tree.map(lambda s0, s1: jnp.where(_lanes(complete, s1), s0, s1), fresh, new_state)
    elif isinstance(spec.scheme.step, UniformStep):
        # one draw per pair for all its lanes, lanes last: (n, B) vectorises; a key per lane does not
        n_u, play = spec.scheme.step.n, spec.scheme.step.round

        def draw(r):
            # [n, P, B] written in place, not a vmap then moveaxis (a scalar loop on CPU)
            u = rng.uniform_side_by_side(jax.vmap(lambda k: jax.random.fold_in(k, r))(keys), (n_u, B))
            return u.reshape(n_u, N)
    else:
        play = spec.scheme.step

        def draw(r):
            return jax.vmap(lambda k: jax.random.split(jax.random.fold_in(k, r), B))(keys).reshape(N)

    if not spec.stateful:
        # the tables of all pairs, one after another; lane l reads pair l // B through plain gathers
        flat_t, flat_d = target.flat_pairs(), draft.flat_pairs()

        def one_lane(rand, pair, ctx, t, d):
            if n_pairs == 1:  # one pair: plain tables, no per-lane row offset in any lookup
                return play(rand, t, d, ctx)
            return play(rand, t.at_pair(pair), d.at_pair(pair), ctx)

        lane_step = jax.vmap(lambda rand, pair, ctx: one_lane(rand, pair, ctx, flat_t, flat_d),
                             in_axes=(-1, 0, -1), out_axes=-1)
        # a round that builds rows of V floats per lane steps its lanes in groups that fit the cache (CPU)
        rand = jax.eval_shape(draw, jnp.zeros((), jnp.uint32))
        lane_args = (jax.ShapeDtypeStruct(rand.shape[:-1], rand.dtype), pair_of_lane[0], jnp.zeros(W, jnp.int32))
        group = lane_groups.group_size(one_lane, lane_args, (flat_t, flat_d), V, N, platform)
        lane_step = lane_groups.in_groups(lane_step, group)

        def step(rand, ctx_or_state):
            return lane_step(rand, pair_of_lane, ctx_or_state), ()

        fresh = ()

    layout, n_cells = cells.layout(spec)
    # every per-lane array below is laid out lanes last, [..., P * B]: XLA on CPU vectorises
    # along the minor axis, and the scatter's index vector is then a concatenation of rows
    lane = jnp.arange(N)
    base = lane // B * n_cells  # the first cell of each lane's pair
    copy = lane % cells.SPREAD

    trash = layout["trash"][0] + lane % cells.TRASH  # relative to the pair's first cell, as every index here

    def masked(index, mask):
        """A count at ``index`` where ``mask``, else in the lane's trash cell."""
        return jnp.where(mask, index, trash)

    def body(carry):
        # the round's uniforms were drawn by the previous iteration and sit in the carry: a
        # materialised array, so XLA cannot recompute the hash inside each of its consumers
        ctx, state, pos, code, rnd, done, r, counts, invalid, ahead, rec = carry
        active = done < spec.per_lane
        start_code = code  # the tokens of the sequence before this round
        out, new_state = step(ahead, state if spec.stateful else ctx)
        if spec.stateful:  # the round as it was played (cells.record_fields), for the stage tests
            fields = [out.n_accepted, out.n_emitted, active, *out.drafts[: spec.max_drafts], *out.tokens]
            row = jnp.stack(fields)[:, : rec.shape[-1]].astype(jnp.int32)  # the first RECORD_LANES lanes
            rec = jax.lax.dynamic_update_index_in_dim(rec, row, r.astype(jnp.int32), 0)
        n_em = jnp.clip(out.n_emitted, 1, T)
        emitted = (i[:, None] < n_em) & active
        bad = emitted & ((out.tokens < 0) | (out.tokens >= V))
        # a round that claims to emit no token, or more than max_tokens, is a broken scheme too
        bad_round = active & ((out.n_emitted < 1) | (out.n_emitted > T))
        tok = jnp.clip(out.tokens, 0, V - 1).astype(jnp.int32)
        in_seq = emitted & (pos + i[:, None] < L)
        updates = []  # (cell index, value) rows, all scattered at once below
        if spec.joint:
            for t in range(T):
                code = jnp.where(in_seq[t], code * V + tok[t], code)
        full = jnp.concatenate([ctx, tok], axis=0)  # [W + T, N]: the context, then this round's tokens
        window = jnp.zeros((T, N), jnp.int32)
        if spec.device_transitions:
            m = spec.target_order
            for j in range(m):  # the target's window before each emitted token, as a table row
                window = window * V + full[W - m + j : W - m + j + T]
            if "transitions" in layout:
                updates.append(masked(layout["transitions"][0] + window * V + tok, in_seq))
        if "tokens" in layout:  # a token past the sequence's end counts in the lane's trash cell
            at = jnp.minimum(pos + i[:, None], L - 1)  # each token's stream position
            updates.append(masked(*cells.token_updates(spec, layout["tokens"][0], at, window, tok, in_seq)))
        new_pos = pos + n_em
        complete = active & (new_pos >= L)
        if spec.joint:
            updates.append(masked(layout["joint"][0] + jnp.clip(code, 0, V**L - 1)[None], complete[None]))
        if spec.round_starts:  # the prefix this round started after: ``code`` holds its pos tokens
            first = (V ** jnp.minimum(pos, L - 1) - 1) // (V - 1)
            updates.append(masked((layout["round_start"][0] + (first + start_code) * (spec.max_drafts + 1)
                                   + jnp.clip(out.n_accepted, 0, spec.max_drafts))[None], active[None]))
        d = jnp.clip(out.drafts, 0, V - 1)
        updates.append(masked(*cells.draft_updates(spec, layout["drafts"][0], d, out.draft_accepted,
                                                   out.draft_tested & active)))
        k1 = spec.max_drafts + 1  # a count of accepted drafts out of [0, k] (a broken scheme) is its own bin
        n_acc = jnp.where((out.n_accepted >= 0) & (out.n_accepted < k1), out.n_accepted, k1)
        updates.append(masked(*cells.outcome_updates(spec, layout, copy, n_acc, n_em, active, complete, rnd)))
        invalid = invalid + jnp.sum(bad, axis=0) + bad_round
        counts = cells.scatter_add(counts, base + jnp.concatenate(updates, axis=0))
        # the lane's context: the last W tokens of its current sequence, full[n_em : n_em + W]
        shifted = jnp.stack([jnp.select([n_em == n for n in range(1, T + 1)], [full[n + w] for n in range(1, T + 1)])
                             for w in range(W)]) if W else ctx
        ctx = jnp.where(complete, 0, jnp.where(active, shifted, ctx))
        pos = jnp.where(complete, 0, jnp.where(active, new_pos, pos))
        code = jnp.where(complete, 0, code)
        rnd = jnp.where(complete, 0, rnd + active)
        # a lane's state: the round's, back to the prompt's when its sequence is complete
        state = restart(complete, new_state) if spec.stateful else state
        # the next round's uniforms are drawn last: their counter waits on this round's counts (plus a zero,
        # as no count is negative), so every reader of this round's uniforms runs first and XLA writes the
        # new ones over them in place; drawn early, both were copied each round (2-4 % of a table round)
        after_counts = jnp.minimum(counts[0], 0).astype(jnp.uint32)
        return ctx, state, pos, code, rnd, done + complete, r + 1, counts, invalid, draw(r + 1 + after_counts), rec

    z = jnp.zeros(N, jnp.int32)
    r0 = jnp.zeros((), jnp.uint32)
    # a stateful block records its rounds (every round of a lane emits a token: per_lane * L rounds at most)
    rec = jnp.zeros(cells.record_shape(spec), jnp.int32) if spec.stateful else ()
    init = (jnp.zeros((W, N), jnp.int32), fresh, z, z, z, z, r0, jnp.zeros(n_pairs * n_cells, jnp.int32), z, draw(r0),
            rec)
    *_, counts, invalid, _, rec = jax.lax.while_loop(lambda c: jnp.any(c[5] < spec.per_lane), body, init)
    acc = cells.unpack(spec, layout, counts.reshape(n_pairs, n_cells))
    acc["invalid"] = invalid.reshape(n_pairs, B).sum(axis=1)
    if spec.stateful:
        acc["record"] = rec[None]
    return acc


def _lanes(mask, x):
    """A per-lane mask [N] shaped to broadcast against a lanes-first state leaf ``x`` [N, ...]."""
    return mask.reshape(mask.shape + (1,) * (x.ndim - 1))


def _chunk_fn(spec: RunSpec, mesh: Mesh):
    """A jitted function: (base key, block ids, blocks in run, target, draft, prompt) -> summed counts."""
    platform = mesh.devices.flat[0].platform

    def per_device(base_key, block_ids, n_blocks, target, draft, prompt):
        n_pairs = 1 if spec.stateful else target.table.shape[0]

        def one_block(acc, b):
            def real(acc):
                bkey = jax.random.fold_in(base_key, b)
                keys = jax.vmap(jax.random.fold_in, (None, 0))(bkey, jnp.arange(n_pairs, dtype=jnp.uint32))
                # a batch of pairs runs in one loop, as long as its slowest pair (similar pairs finish together)
                counts = _block(spec, keys, target, draft, prompt, platform)
                if "record" in counts:  # the run's first block alone keeps its rounds: the sum over blocks is them
                    counts["record"] = jnp.where(b == 0, counts["record"], 0)
                return jax.tree.map(jnp.add, acc, counts)

            # a block past the run's end is skipped outright, so a chunk may be longer than the run
            return jax.lax.cond(b < n_blocks, real, lambda a: a, acc), None

        acc, _ = jax.lax.scan(one_block, cells.zeros(spec, n_pairs), block_ids)
        if across_processes:
            return jax.tree.map(lambda x: jax.lax.psum(x, "d"), acc)
        return jax.tree.map(lambda x: x[None], acc)  # this device's row of the stacked counts

    # Within one process the devices never wait for each other: each returns its own counts
    # and the host adds them. A psum between CPU devices is a rendezvous that XLA aborts
    # (a fatal check, no report) when one device thread is starved for 40 s on a busy machine.
    # Across processes the sum needs the collective, so it stays there.
    across_processes = jax.process_count() > 1
    sharded = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P("d"), P(), P(), P(), P()),
                            out_specs=P() if across_processes else P("d"), check_vma=False)
    return jax.jit(sharded)


_CACHE: dict = {}


def _compiled(spec: RunSpec, mesh: Mesh):
    key = (spec, mesh.devices.tobytes() if hasattr(mesh.devices, "tobytes") else id(mesh))
    fn = _CACHE.get(key)
    if fn is None:
        fn = _CACHE[key] = _chunk_fn(spec, mesh)
    return fn


def _as_batch(model, name: str) -> TableModel:
    if not isinstance(model, TableModel):
        hint = (" (neural models run with a scheme whose lanes carry their KV caches: scheme 'cached')"
                if hasattr(model, "vocab_size") else "")
        raise TypeError(f"{name} must be a specsample.models.TableModel, got {type(model).__name__}{hint}")
    table = validate_table(model.table, f"{name} table")
    if table.ndim == 2:
        table = table[None]
    v = table.shape[-1]
    if table.ndim != 3 or table.shape[1] != v**model.order:
        raise ValueError(f"{name} table has shape {table.shape}; expected (pairs, V**order, V) "
                         f"with order {model.order}")
    return TableModel(table, model.order)


class _Prepared(NamedTuple):
    spec: RunSpec
    fn: Callable
    base: jax.Array
    target: TableModel
    draft: TableModel
    host_target: TableModel
    n_blocks: int
    blocks_per_step: int
    prompt: tuple  # the tokens a stateful scheme's sequences start after (an argument: no recompile per prompt)
    identity: Optional[tuple] = None  # what the chunk is built from, for a saved program (program_cache)
    n_devices: int = 1  # the mesh's: each takes one contiguous slice of a chunk's block ids

    def call(self, ids, n_blocks):
        """Counts of blocks ``ids`` (those at or past ``n_blocks`` do nothing)."""
        return program_cache.call(self.fn, self.identity, self.base, ids, n_blocks, self.target, self.draft,
                                  jnp.asarray(self.prompt, jnp.int32))


def _identity(spec: RunSpec, mesh: Mesh) -> Optional[tuple]:
    """What a chunk function is built from, when a name describes its scheme (specsample's own) and the
    mesh is the default one: the scheme's name and k, every other field of the spec, the mesh's devices.
    None otherwise."""
    scheme = builtin_identity(spec.scheme)
    devices = list(mesh.devices.flat)
    if scheme is None or devices != jax.devices()[: len(devices)]:  # a saved program runs on the first devices
        return None
    return ("engine-chunk", scheme, repr(dataclasses.replace(spec, scheme=None)),
            tuple((d.platform, d.id) for d in mesh.devices.flat))


def _check_prompt(prompt, vocab: int) -> tuple:
    p = np.asarray(prompt)
    if p.ndim != 1 or p.size < 1 or not np.issubdtype(p.dtype, np.integer):
        raise ValueError(f"prompt must be a non-empty 1-D sequence of token ids, got {prompt!r}")
    if p.min() < 0 or p.max() >= vocab:
        raise ValueError(f"prompt token ids must lie in [0, {vocab}), got {p.tolist()}")
    return tuple(int(x) for x in p)


def _joint(vocab: int, length: int, joint) -> bool:
    """Whether to count whole sequences: asked for, or by default when V**L is small."""
    size = vocab**length
    joint = size <= JOINT_MAX_CELLS if joint is None else bool(joint)
    if joint and size > 8 * JOINT_MAX_CELLS:
        raise ValueError(f"a joint over V**L = {size} cells is too large; pass joint=False")
    return joint


def _prepare_stateful(scheme, target, draft, prompt, *, sequences, length, lanes, per_lane, joint):
    """The spec and device models of a stateful scheme (one pair of neural models, a prompt)."""
    for name, m in (("target", target), ("draft", draft)):
        if not hasattr(m, "vocab_size") or isinstance(m, TableModel):
            raise TypeError(f"scheme {scheme.name!r} carries state across rounds and runs on neural models "
                            f"(specsample.models.transformer.Transformer); the {name} is a {type(m).__name__}")
    v = target.vocab_size
    if draft.vocab_size != v:
        raise ValueError(f"target has V={v} tokens but draft has V={draft.vocab_size}; they must share a vocabulary")
    prompt = _check_prompt([0] if prompt is None else prompt, v)
    joint = _joint(v, length, joint)
    # rounds by starting prefix need the code of the tokens so far, which the joint keeps
    starts = (joint and getattr(scheme.step, "rule", None) == "standard" and v >= 2
              and n_prefixes(v, length) * (scheme.k + 1) <= ROUND_START_MAX_CELLS)
    spec = RunSpec(scheme, int(length), v, 0, 0, int(lanes), int(per_lane), joint, False, len(prompt), starts)
    return spec, target, draft, prompt


def check_prng(prng: str) -> str:
    """``prng`` if it names a JAX PRNG implementation the engine draws with (:data:`PRNG_IMPLS`), else a
    one-line error listing them."""
    if prng not in PRNG_IMPLS:
        raise ValueError(f"unknown prng {prng!r}; choose one of {', '.join(PRNG_IMPLS)}")
    return prng


def _prepare(scheme, target, draft, *, sequences, length, seed, lanes, per_lane, joint, prng,
             blocks_per_call, devices, prompt=None) -> _Prepared:
    """Validate everything and build (or fetch) the compiled chunk function."""
    if not isinstance(scheme, Scheme):
        raise TypeError(f"scheme must be a specsample Scheme, got {type(scheme).__name__}")
    for name, val in (("sequences", sequences), ("length", length), ("lanes", lanes),
                      ("per_lane", per_lane), ("k", scheme.k), ("max_tokens", scheme.max_tokens)):
        if int(val) != val or val < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {val}")
    check_prng(prng)
    if isinstance(scheme.step, StatefulStep):
        spec, dev_target, dev_draft, prompt = _prepare_stateful(
            scheme, target, draft, prompt, sequences=sequences, length=length, lanes=lanes, per_lane=per_lane,
            joint=joint)
        return _finish_prepare(spec, 1, dev_target, dev_draft, dev_target, sequences, seed, prng,
                               blocks_per_call, devices, prompt)
    if prompt is not None:
        raise ValueError(f"a prompt is for schemes whose lanes carry state (neural models); scheme "
                         f"{scheme.name!r} runs on tables, whose streams start from the context 0")
    tgt, drf = _as_batch(target, "target"), _as_batch(draft, "draft")
    if tgt.table.shape[-1] != drf.table.shape[-1]:
        raise ValueError(f"target has V={tgt.table.shape[-1]} tokens but draft has V={drf.table.shape[-1]}; "
                         "they must share a vocabulary")
    if tgt.table.shape[0] != drf.table.shape[0]:
        raise ValueError(f"target batch has {tgt.table.shape[0]} pairs but draft has {drf.table.shape[0]}")
    v = tgt.table.shape[-1]
    joint = _joint(v, length, joint)
    spec = RunSpec(scheme, int(length), v, max(tgt.order, drf.order), tgt.order, int(lanes), int(per_lane),
                   joint, (not joint) and tgt.order > 0)
    dev_target, dev_draft = pair_for_device(tgt, drf)
    if scheme.prepare is not None:  # tables the scheme's rounds read (a tree's residual chains)
        dev_target, dev_draft = scheme.prepare(dev_target, dev_draft)
    return _finish_prepare(spec, tgt.table.shape[0], dev_target, dev_draft, tgt, sequences, seed, prng,
                           blocks_per_call, devices, ())


def _finish_prepare(spec, n_pairs, dev_target, dev_draft, host_target, sequences, seed, prng, blocks_per_call,
                    devices, prompt: tuple) -> _Prepared:
    lanes, per_lane, length, scheme = spec.lanes, spec.per_lane, spec.length, spec.scheme
    _, n_cells = cells.layout(spec)
    if n_pairs * n_cells >= 2**31:  # a lane's count cell is an int32 index into all pairs' cells
        raise ValueError(f"{n_pairs} pairs x {n_cells} count cells per pair is too many for one run "
                         f"(at most 2^31 cells); run fewer pairs at a time")
    per_block = lanes * per_lane
    n_blocks = -(-int(sequences) // per_block)
    devices = list(jax.devices() if devices is None else devices)
    mesh = Mesh(np.array(devices), ("d",))
    n_dev = len(devices)
    # int32 safety on device: a chunk's largest per-pair total (tokens or rounds) stays < 2^31
    max_blocks = max(1, _INT32_SAFE // (per_block * max(length, scheme.max_tokens) * 2 * n_dev))
    # the chunk does not depend on the run's length, so runs of any length share one compiled
    # call (a block past the run's end does nothing: its loop ends before its first round)
    # neural rounds are slow: smaller chunks keep progress (and checkpoints) frequent
    per_call = (1 << 14) if spec.stateful else (1 << 18)
    bpc = max(1, min(blocks_per_call or max(1, per_call // per_block), max_blocks))
    return _Prepared(spec, _compiled(spec, mesh), jax.random.key(int(seed), impl=prng), dev_target, dev_draft,
                     host_target, n_blocks, bpc * n_dev, prompt, _identity(spec, mesh), n_dev)


def warm(scheme: Scheme, target: TableModel, draft: TableModel, **kwargs) -> None:
    """Compile the engine for these arguments (same keywords as :func:`run`) without sampling.

    Safe to call from several threads at once, which lets XLA compile in parallel.
    """
    defaults = {name: par.default for name, par in inspect.signature(run).parameters.items()
                if par.default is not inspect.Parameter.empty and name in _PREPARE_ARGS}
    opts = {**defaults, **kwargs}
    opts["prng"] = opts["prng"] or DEFAULT_PRNG
    prep = _prepare(scheme, target, draft, **opts)
    ids = jnp.arange(prep.blocks_per_step, dtype=jnp.uint32)
    jax.block_until_ready(prep.call(ids, jnp.uint32(0)))


def chunk_ids(start: int, step: int, n_devices: int) -> np.ndarray:
    """Block ids of the chunk of ``step`` blocks from ``start``, dealt to the devices in turn.

    Device d takes the d-th contiguous slice of the ids, which holds blocks start + d, start + d +
    n_devices, ...: a run shorter than a chunk (a quick battery's case: 8 blocks in a chunk of 16)
    keeps every device busy, where consecutive slices had left the last devices only blocks past the
    run's end. A block's counts depend on its id alone and the totals are integer sums, so the counts
    are those of any other dealing.
    """
    return (start + np.arange(step, dtype=np.uint32).reshape(step // n_devices, n_devices).T).ravel()


_PREPARE_ARGS = ("seed", "lanes", "per_lane", "joint", "prng", "blocks_per_call", "devices", "prompt")


def run(
    scheme: Scheme,
    target: TableModel,
    draft: TableModel,
    *,
    sequences: int,
    length: int,
    seed: int = 0,
    lanes: int = 1024,
    per_lane: int = 16,
    joint: bool | None = None,
    prng: str | None = None,
    blocks_per_call: int | None = None,
    devices=None,
    progress: Callable[[int, int], None] | None = None,
    checkpoint: str | None = None,
    checkpoint_every: float = 60.0,
    prompt=None,
) -> Counts:
    """Run ``scheme`` on a pair (or a batch of pairs) and count what it emits.

    Parameters
    ----------
    scheme : Scheme
    target, draft : TableModel
        One pair, or a batch (tables with a leading pair axis). Probabilities are
        validated here and run in float32 on the device.
    sequences : int
        Sequences of the first ``length`` tokens to keep per pair; rounded up to whole
        blocks of ``lanes * per_lane``.
    length : int
        L, the number of stream tokens kept per sequence.
    seed : int
    lanes, per_lane : int
        Block shape; part of the definition of the random stream.
    joint : bool, optional
        Count whole sequences (V**L cells). Default: when V**L <= 65536.
    prng : str, optional
        JAX PRNG implementation for this run's typed keys (default
        ``DEFAULT_PRNG``); JAX's global configuration is left alone.
    blocks_per_call : int, optional
        Blocks per device per jitted call (the chunk); does not change the counts.
    devices : list of jax devices, optional
        Devices to shard blocks over (default: all).
    progress : callable(done, total), optional
        Called after each chunk with sequences done and the total.
    checkpoint : str, optional
        Path of an ``.npz`` file holding the totals so far and the next block. Written
        atomically at most every ``checkpoint_every`` seconds and at the end; a run started
        with the same arguments resumes from it and ends with exactly the counts of an
        uninterrupted run (blocks are deterministic). A checkpoint of other arguments is an
        error, never silently mixed in.
    prompt : sequence of int, optional
        For a scheme whose lanes carry state (:class:`~specsample.schemes.StatefulStep`, on
        neural models such as :class:`~specsample.models.transformer.Transformer`): the tokens every
        sequence starts after (default ``[0]``). Its counts are of one pair.

    Returns
    -------
    Counts
        With a leading pair axis of length 1 for a single pair.
    """
    prep = _prepare(scheme, target, draft, sequences=sequences, length=length, seed=seed, lanes=lanes,
                    per_lane=per_lane, joint=joint, prng=prng or DEFAULT_PRNG,
                    blocks_per_call=blocks_per_call, devices=devices, prompt=prompt)
    per_block = lanes * per_lane
    step = prep.blocks_per_step
    signature = _signature(prep, seed, prng or DEFAULT_PRNG)
    start0, totals = _load_checkpoint(checkpoint, signature) if checkpoint else (0, None)
    if checkpoint and jax.process_count() > 1:
        _same_on_every_process(start0, checkpoint)
    last_save = time.monotonic()
    for start in range(start0, prep.n_blocks, step):
        ids = jnp.asarray(chunk_ids(start, step, prep.n_devices))
        out = _host_sum(prep.call(ids, jnp.uint32(prep.n_blocks)))
        totals = out if totals is None else jax.tree.map(np.add, totals, out)
        done = min(start + step, prep.n_blocks)
        if checkpoint:
            _PENDING[checkpoint] = (signature, done, totals)  # what an interrupt saves (save_pending)
            if time.monotonic() - last_save >= checkpoint_every or done == prep.n_blocks:
                _save_pending(checkpoint)
                last_save = time.monotonic()
        if progress is not None:
            progress(done * per_block, prep.n_blocks * per_block)
    n_pairs = 1 if prep.spec.stateful else prep.target.table.shape[0]
    return _finish(prep.spec, totals, prep.n_blocks * per_block, n_pairs)


def _host_sum(out) -> dict:
    """A chunk's counts as int64 numpy totals: per-device rows added here, on the host."""
    if jax.process_count() > 1:  # already summed across processes (and devices) by psum
        return jax.tree.map(lambda x: np.asarray(x, dtype=np.int64), out)
    return jax.tree.map(lambda x: np.asarray(x, dtype=np.int64).sum(axis=0), out)


def _signature(prep: _Prepared, seed, prng: str) -> str:
    """What determines the counts: a checkpoint only resumes a run with the same signature.

    The chunk (blocks per step) is part of it because resumption continues chunk by chunk.
    """
    h = hashlib.sha256()
    h.update(f"stream {STREAM_VERSION}".encode())
    spec = prep.spec
    scheme = (spec.scheme.name, spec.scheme.k, spec.scheme.max_tokens, _describe(spec.scheme.step))
    if spec.scheme.prepare is not None:  # tables the rounds read instead of rows: other draws, other counts
        scheme += (_describe(spec.scheme.prepare),)
    h.update(repr((scheme, spec.length, spec.vocab, spec.width, spec.lanes, spec.per_lane,
                   spec.joint, int(seed), prng, prep.n_blocks, prep.blocks_per_step, prep.prompt)).encode())
    if spec.stateful:  # neural models: every weight, and the (static) shape of each network
        h.update(b"first block recorded")  # its totals hold Counts.record (an older checkpoint's do not)
        for model in (prep.target, prep.draft):
            program_cache.hash_model(h, model)
        return h.hexdigest()
    h.update(np.ascontiguousarray(prep.host_target.table, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(np.asarray(prep.draft.table), dtype=np.float32).tobytes())
    return h.hexdigest()


def _describe(fn) -> str:
    """A text naming a step's code and bound parameters, stable across processes (no addresses).

    Two schemes with one name but other parameters (multidraft with 2 or 3 chains, say) get
    other texts, so their checkpoints are not mixed. Values a closure captures are not seen.
    """
    if isinstance(fn, UniformStep):
        return f"UniformStep({_describe(fn.round)}, n={fn.n})"
    if isinstance(fn, StatefulStep):  # its dataclass repr would name the functions by address: a new process differs
        return (f"StatefulStep({_describe(fn.round)}, n={fn.n}, init={_describe(fn.init)}, rule={fn.rule!r}"
                + (f", restart={_describe(fn.restart)})" if fn.restart is not None else ")"))
    if isinstance(fn, functools.partial):
        args = [_describe(a) for a in fn.args] + [f"{k}={_describe(v)}" for k, v in sorted(fn.keywords.items())]
        return f"{_describe(fn.func)}({', '.join(args)})"
    if callable(fn) and hasattr(fn, "__qualname__"):
        return f"{getattr(fn, '__module__', '?')}.{fn.__qualname__}"
    return repr(fn)


_PENDING: dict = {}  # checkpoint path -> (signature, next block, totals) not yet written
_SAVE_LOCK = threading.Lock()


def _save_pending(path: str) -> bool:
    """Write the latest totals of ``path`` if they are not on disk yet; True if written."""
    with _SAVE_LOCK:
        item = _PENDING.pop(path, None)
        if item is None:
            return False
        if jax.process_index() == 0:  # every process holds the same totals; one writes them
            _save_checkpoint(path, *item)
        return True


def save_pending_checkpoints() -> list:
    """Write every checkpoint whose latest totals are not on disk yet; returns their paths.

    The command line calls this when interrupted, so a run stopped by Ctrl-C keeps every
    chunk it finished (a run resumed from it ends with the counts of an uninterrupted run).
    """
    return [p for p in list(_PENDING) if _save_pending(p)]


def _save_checkpoint(path: str, signature: str, next_block: int, totals: dict) -> None:
    _ckpt.save(path, signature, {"next_block": next_block, **{f"t_{k}": v for k, v in totals.items()}})


def _same_on_every_process(next_block: int, path: str) -> None:
    """Multi-process runs resume only if every process read the same checkpoint."""
    from jax.experimental import multihost_utils

    first = int(multihost_utils.broadcast_one_to_all(np.int32(next_block)))
    if first != next_block:
        raise ValueError(f"process {jax.process_index()} found checkpoint {path!r} at block {next_block} but "
                         f"process 0 at block {first}; put checkpoints on a filesystem every process shares")


def _load_checkpoint(path: str, signature: str):
    saved = _ckpt.load(path, signature)
    if saved is None:
        return 0, None
    return int(saved["next_block"]), {k[2:]: v.astype(np.int64) for k, v in saved.items() if k.startswith("t_")}


def _finish(spec: RunSpec, t: dict, n_seq: int, n_pairs: int) -> Counts:
    v, L = spec.vocab, spec.length
    joint = t.get("joint")
    transitions = t.get("transitions")
    if joint is not None:
        grid = joint.reshape((n_pairs,) + (v,) * L)
        position = np.stack([grid.sum(axis=tuple(a for a in range(1, L + 1) if a != pos + 1))
                             for pos in range(L)], axis=1)
        if spec.target_order > 0:
            transitions = transitions_from_joint(joint, v, L, spec.target_order)
    else:
        position = t["position"].reshape(n_pairs, L, v)
        if transitions is not None:
            transitions = transitions.reshape(n_pairs, v**spec.target_order, v)
    return Counts(
        sequences=np.full(n_pairs, n_seq, dtype=np.int64),
        rounds=t["rounds"],
        position=position,
        joint=joint,
        transitions=transitions,
        accepted=t["accepted"],
        emitted=t["emitted"],
        drafted=t["drafted"],
        draft_accepted=t["draft_accepted"],
        rounds_per_sequence=t["rounds_per_sequence"],
        invalid=t["invalid"],
        round_start=(t["round_start"].reshape(n_pairs, n_prefixes(v, L), spec.max_drafts + 1)
                     if "round_start" in t else None),
        record=t.get("record"),
    )


def transitions_from_joint(joint: np.ndarray, vocab: int, length: int, order: int) -> np.ndarray:
    """Per-context next-token counts (contexts of the given order) implied by joint counts."""
    seqs = all_sequences(vocab, length)
    full = np.concatenate([np.zeros((len(seqs), order), np.int64), seqs], axis=1)
    ctx = window_index(full, order, vocab, np)[:, :length]  # [cells, L]
    flat = ctx * vocab + seqs
    out = np.zeros(joint.shape[:-1] + (vocab**order * vocab,), dtype=np.int64)
    for pos in range(length):
        np.add.at(out, (..., flat[:, pos]), joint)
    return out.reshape(joint.shape[:-1] + (vocab**order, vocab))
