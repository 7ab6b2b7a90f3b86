"""Where a block's counts live on the device: one flat vector of cells per pair, one scatter per round.

The engine's loop (:mod:`specsample.engine.lanes`) turns each round of each lane into indices of these
cells, adds 1 at every index in one scatter, and unpacks the cells into named totals when its block
ends. The layout is the engine's business only: :class:`~specsample.engine.lanes.Counts` is what
leaves the device.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def zeros(spec, n_pairs: int = 1):
    """Zero totals of one chunk, with a leading pair axis."""
    v, L, t = spec.vocab, spec.length, spec.scheme.max_tokens
    shapes = dict(
        rounds=(),
        accepted=(spec.max_drafts + 1,),
        emitted=(t + 1,),
        drafted=(v,),
        draft_accepted=(v,),
        rounds_per_sequence=(L + 1,),
        invalid=(),
    )
    if spec.joint:
        shapes["joint"] = (v**L,)
    else:
        shapes["position"] = (L * v,)
    if spec.device_transitions:
        shapes["transitions"] = (v**spec.target_order * v,)
    if spec.round_starts:
        shapes["round_start"] = (n_prefixes(v, L) * (spec.max_drafts + 1),)
    if spec.stateful:
        shapes["record"] = record_shape(spec)
    return {name: jnp.zeros((n_pairs,) + s, jnp.int32) for name, s in shapes.items()}


def record_fields(k: int, max_tokens: int) -> tuple:
    """The fields of a recorded round (:attr:`specsample.engine.lanes.Counts.record`), in order: its
    accepted drafts and emitted tokens, whether the lane was still sampling (1) or done (0), then its k
    drafts and its ``max_tokens`` tokens (where its sequence stood follows from the rounds before it)."""
    return ("n_accepted", "n_emitted", "active") + tuple(f"draft{i}" for i in range(k)) + \
        tuple(f"token{i}" for i in range(max_tokens))


RECORD_LANES = 64  # lanes of a stateful run's first block whose rounds are kept (the battery's block is 64 wide)


def record_shape(spec) -> tuple:
    """(rounds, fields, lanes) of a stateful block's record: each round emits a token, so a lane's
    ``per_lane`` sequences of L tokens take at most ``per_lane * L`` rounds; the first
    :data:`RECORD_LANES` lanes are kept, so a run of wide blocks carries no larger record."""
    fields = len(record_fields(spec.max_drafts, spec.scheme.max_tokens))
    return spec.per_lane * spec.length, fields, min(spec.lanes, RECORD_LANES)


# Small histograms keep this many copies, lane l adding to copy l % SPREAD: a scatter's
# updates to one cell form a serial read-modify-write chain, and this breaks it up.
SPREAD = 16
TRASH = 64  # cells that masked-out updates go to, lane l to cell l % TRASH (never read)


def layout(spec) -> tuple[dict, int]:
    """Where every count lives in one flat vector of cells per pair: ``name -> (offset, size)``,
    and the number of cells.

    Scatter is serial on CPU and each scatter op has its own overhead, so a round makes
    one scatter of all its updates, each adding 1 (a histogram by comparison costs more here:
    XLA splits each into several reductions). Drafts are counted as ``2 x + accepted``: one
    update per tested draft gives both ``drafted`` and ``draft_accepted``. A round's
    ``outcome`` (drafts accepted, tokens emitted, and the rounds its lane's sequence took
    when the round completes it, where the cells are few: :func:`merged_ending`) is one update
    that gives all three histograms, and rounds need no cells of their own: every round counts
    once in it. The small histograms keep ``SPREAD`` copies, summed when the block ends. An update
    that must not count goes to the lane's ``trash`` cell, never read (an index of its own: see
    :func:`scatter_add`). Invalid tokens are not cells: each lane adds them up in the loop.

    Where the cells are few, one update counts more: an n-gram run's token by (position, window, token)
    (:func:`by_position_and_context`), and two tokens or two drafts of a round side by side
    (:func:`token_shape`, :func:`paired_drafts`). The scatter is a serial loop over the updates: at
    V = 8, k = 8 a round made 19 of them, and half as many ran 12 % faster.
    """
    v, L = spec.vocab, spec.length
    sizes = {"joint": v**L} if spec.joint else {"tokens": math.prod(token_shape(spec))}
    if spec.device_transitions and not by_position_and_context(spec):
        sizes["transitions"] = v**spec.target_order * v
    if spec.round_starts:
        sizes["round_start"] = n_prefixes(v, L) * (spec.max_drafts + 1)
    sizes["drafts"] = (2 * v + 1) ** 2 if paired_drafts(spec) else 2 * v
    merged = merged_ending(spec)
    sizes["outcome"] = SPREAD * outcome_bins(spec) * (ending_bins(spec) if merged else 1)
    if not merged:
        sizes["rounds_per_sequence"] = SPREAD * (L + 1)
    sizes["trash"] = TRASH
    where, offset = {}, 0
    for name, size in sizes.items():
        where[name] = (offset, size)
        offset += size
    return where, offset


MERGED_MAX_CELLS = 1 << 14  # an n-gram run counts (position, context, token) in one update up to this many cells


def by_position_and_context(spec) -> bool:
    """Whether an n-gram run counts each token once, in a cell of (its position, the target's window
    before it, the token), rather than once by position and once by window: one scatter update instead
    of two, and both totals are sums of these cells. When there are few enough of them (not with a joint,
    which gives the positions already)."""
    return (spec.device_transitions and not spec.joint
            and spec.length * spec.vocab ** (spec.target_order + 1) <= MERGED_MAX_CELLS)


# two tokens (or drafts) of a round count in one update up to this many cells: 2^15 pairs them at V = 64
# (L <= 7), whose 42k cells a pair (168 kB) stay in L2; there 7 updates a round instead of 11 ran 5 % faster
PAIRED_MAX_CELLS = 1 << 15


def token_shape(spec) -> tuple:
    """Shape of a run's token cells (no joint): (position, window, token, next token). The window axis has
    the target's V**m windows when :func:`by_position_and_context`, else 1. Without windows, the last axis
    is V + 1 where the cells are few: a round's tokens count two at a time, slot 2j with slot 2j + 1 (V:
    none); else it is 1. (Pairs of n-gram tokens were measured no faster.)"""
    v, L = spec.vocab, spec.length
    windows = v**spec.target_order if by_position_and_context(spec) else 1
    paired = windows == 1 and L * v * (v + 1) <= PAIRED_MAX_CELLS
    return L, windows, v, v + 1 if paired else 1


def paired_drafts(spec) -> bool:
    """Whether a round's drafts count two at a time, as (2 x + accepted, or 2V: untested) side by side."""
    return (2 * spec.vocab + 1) ** 2 <= PAIRED_MAX_CELLS


def token_updates(spec, offset: int, at, window, tok, counted) -> tuple:
    """Cells (from the pair's first) and masks of a round's token counts, every lane at once ([T, N]
    arrays: each token's position, target window (its table row; read only where the cells have
    windows), token, and whether it counts; ``counted`` is a prefix of the slots, as a round's emitted
    tokens are)."""
    _, windows, v, nxt = token_shape(spec)
    cell = offset + ((at * windows + (window if windows > 1 else 0)) * v + tok) * nxt
    if nxt == 1:
        return cell, counted
    second = jnp.where(counted[1::2], tok[1::2], v)
    if tok.shape[0] % 2:  # the last slot has no partner
        second = jnp.concatenate([second, jnp.full_like(second[:1], v)])
    return cell[0::2] + second, counted[0::2]


def draft_updates(spec, offset: int, drafts, accepted, tested) -> tuple:
    """Cells and masks of a round's draft counts ([D, N] arrays): ``2 x + accepted`` per tested draft,
    two at a time when :func:`paired_drafts` (2V in a slot: not tested)."""
    x = 2 * drafts + accepted
    if not paired_drafts(spec):
        return offset + x, tested
    none = 2 * spec.vocab
    x = jnp.where(tested, x, none)
    if x.shape[0] % 2:  # the last slot has no partner
        x = jnp.concatenate([x, jnp.full_like(x[:1], none)])
        tested = jnp.concatenate([tested, jnp.zeros_like(tested[:1])])
    return offset + x[0::2] * (none + 1) + x[1::2], tested[0::2] | tested[1::2]


def ending_bins(spec) -> int:
    """Bins of a round's outcome for its lane's sequence: complete after 0..L rounds, or L + 1 (not complete)."""
    return spec.length + 2


# a round's outcome and its sequence's end share an update up to this many cells (256 kB a pair): at
# V = 64, k = 4 a lane's 7 updates a round became 6; a long sequence keeps two (at k = 4, L > 111)
ENDING_MAX_CELLS = 1 << 16


def merged_ending(spec) -> bool:
    """Whether one update counts a round's outcome and, when the round completes its lane's sequence, the
    rounds that sequence took (:func:`ending_bins` beside each outcome bin); else the second is an update of
    its own."""
    return SPREAD * outcome_bins(spec) * ending_bins(spec) <= ENDING_MAX_CELLS


def outcome_updates(spec, layout: dict, copy, n_accepted, n_emitted, active, complete, rounds) -> tuple:
    """Cells and masks of a round's outcome and its sequence's end ([1 or 2, N] arrays): ``n_accepted`` in
    0..k + 1, ``n_emitted`` in 1..T, ``rounds`` the rounds the lane's sequence took before this one."""
    L = spec.length
    took = jnp.minimum(rounds + 1, L)
    outcome = copy * outcome_bins(spec) + n_accepted * (spec.scheme.max_tokens + 1) + n_emitted
    if merged_ending(spec):
        cell = layout["outcome"][0] + outcome * ending_bins(spec) + jnp.where(complete, took, L + 1)
        return cell[None], active[None]
    ended = layout["rounds_per_sequence"][0] + copy * (L + 1) + took
    return jnp.stack([layout["outcome"][0] + outcome, ended]), jnp.stack([active, complete])


def outcome_bins(spec) -> int:
    """Bins of a round's outcome: drafts accepted (0..k, or k + 1: out of range) x tokens emitted (0..T)."""
    return (spec.max_drafts + 2) * (spec.scheme.max_tokens + 1)


ROUND_START_MAX_CELLS = 1 << 23  # rounds by starting prefix are counted up to this many cells


def n_prefixes(vocab: int, length: int) -> int:
    """Prefixes of fewer than ``length`` tokens over ``vocab`` tokens: (V**L - 1) / (V - 1)."""
    return sum(vocab**m for m in range(length))


def prefix_id(tokens, vocab: int) -> int:
    """Row of :attr:`specsample.engine.lanes.Counts.round_start` for the rounds that start after ``tokens``: all shorter
    prefixes first, then this length's in base-V order (first token most significant)."""
    code = 0
    for t in tokens:
        code = code * vocab + int(t)
    return n_prefixes(vocab, len(tokens)) + code


def unpack(spec, layout: dict, cells) -> dict:
    """The named totals (leading pair axis) from the cells of a block, ``cells[pair, cell]``."""
    n_pairs = cells.shape[0]
    acc = {}
    for name, (offset, size) in layout.items():
        acc[name] = cells[:, offset : offset + size]
    k, t, L = spec.max_drafts, spec.scheme.max_tokens, spec.length
    if "tokens" in acc:
        acc.update(_unpack_tokens(spec, acc.pop("tokens")))
    merged = merged_ending(spec)
    both = acc.pop("outcome").reshape(n_pairs, SPREAD, k + 2, t + 1, ending_bins(spec) if merged else 1).sum(axis=1)
    outcome = both.sum(axis=3)
    if merged:  # the last bin: rounds that completed no sequence
        acc["rounds_per_sequence"] = both[..., : L + 1].sum(axis=(1, 2))
    else:
        acc["rounds_per_sequence"] = acc["rounds_per_sequence"].reshape(n_pairs, SPREAD, L + 1).sum(axis=1)
    acc.pop("trash")
    acc["accepted"] = outcome[:, : k + 1].sum(axis=2)
    acc["emitted"] = outcome.sum(axis=1)
    acc["rounds"] = acc["emitted"].sum(axis=1)
    drafts = acc.pop("drafts")
    if paired_drafts(spec):  # a draft counts in its slot's row or column; 2V: none
        side = drafts.reshape(n_pairs, 2 * spec.vocab + 1, 2 * spec.vocab + 1)
        drafts = side[:, :-1, :].sum(axis=2) + side[:, :, :-1].sum(axis=1)
    drafts = drafts.reshape(n_pairs, spec.vocab, 2)
    acc["drafted"] = drafts[..., 0] + drafts[..., 1]
    acc["draft_accepted"] = drafts[..., 1]
    return acc


def _unpack_tokens(spec, cells) -> dict:
    """``position`` [P, L * V] (and ``transitions`` [P, V**m, V] when the cells have windows) from the token
    cells [P, ...] of :func:`token_shape`."""
    n_pairs, v = cells.shape[0], spec.vocab
    L, windows, _, nxt = token_shape(spec)
    cube = cells.reshape(n_pairs, L, windows, v, nxt)
    first = cube.sum(axis=4)  # [P, L, W, V]: each cell's first token
    position = first.sum(axis=2)
    out = {}
    if nxt > 1:  # each cell's second token, one position on
        second = cube[..., :v].sum(axis=(2, 3))  # [P, L, V]
        position = position + jnp.pad(second[:, :-1], ((0, 0), (1, 0), (0, 0)))
    if windows > 1:
        out["transitions"] = first.sum(axis=1).reshape(n_pairs, -1)
    out["position"] = position.reshape(n_pairs, L * v)
    return out


def scatter_add(cells, index):
    """``cells[index] += 1`` for every entry (one serial scatter on CPU; kept lean on purpose).

    The caller keeps every index in range and sends masked-out entries to cells nobody reads,
    a cell per lane (not a common one: a run of read-modify-writes to one cell is a serial
    dependency chain). The indices are materialised first (an optimisation barrier), so
    XLA does not fuse their arithmetic into the scatter's serial loop. Adding a constant
    (no array of values) saved about 5% of a standard round at V = 64, k = 4.
    """
    idx = jax.lax.optimization_barrier(index.ravel())
    return cells.at[idx].add(1, indices_are_sorted=False, unique_indices=False, mode="promise_in_bounds")
