"""The stage pass: rounds played where every slot's rows are known, then tested stage by stage.

A scheme (or host sampler) that claims the standard rule is played for a batch of single rounds
from random contexts of a table pair; each round's drafts, tokens and accepted count, with the
rows of both models at every slot, go to :func:`specsample.battery.diagnosis.stage_tests`. The stage
tests join the case's tests (and its Holm family); when a case fails, the stages that deviate
name the broken part of the round (:attr:`specsample.battery.report.CaseResult.diagnosis`).
"""

from __future__ import annotations

import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import diagnosis
from .memory import rounds_per_call
from ..models.tables import TableModel, pair_for_device
from .report import TestResult
from .. import program_cache
from ..schemes import Scheme, StatefulStep, program_identity

STAGE_ROUNDS = 1 << 15  # rounds a case's stage pass plays (a few hundred per group at V = 8, order 2)


def claimed_rule(scheme: Scheme) -> Optional[str]:
    """The verification rule whose stage laws a scheme claims (``"standard"``), or None."""
    return getattr(scheme, "rule", None) or getattr(scheme.step, "rule", None)


def _contexts(rng, n: int, vocab: int, width: int) -> np.ndarray:
    return rng.integers(0, vocab, (n, width)).astype(np.int32)


def _window_keys(full: np.ndarray, width: int, order: int, vocab: int, slots: int) -> np.ndarray:
    """Row index (last ``order`` tokens) of the window before each of ``slots`` slots: [N, slots]."""
    keys = np.zeros((full.shape[0], slots), np.int64)
    for i in range(slots):
        for j in range(order):
            keys[:, i] = keys[:, i] * vocab + full[:, width - order + i + j]
    return keys


_PLAY: dict = {}


def _player(scheme: Scheme):
    """A jitted batch of single rounds (cached per scheme object); for specsample's own schemes, loaded
    whole in a new process (:mod:`specsample.program_cache`) rather than traced again for every shape."""
    key = id(scheme.step)
    if key not in _PLAY:
        play = jax.jit(jax.vmap(scheme.step, in_axes=(0, None, None, 0)))
        _PLAY[key] = (scheme.step, program_cache.bound(play, program_identity(scheme, "stage-rounds")))
    return _PLAY[key][1]


def play_table(scheme: Scheme, target: TableModel, draft: TableModel, n_rounds: int = STAGE_ROUNDS,
               seed: int = 0) -> diagnosis.Rounds:
    """``n_rounds`` single rounds of a table scheme, each from a uniformly random context window."""
    t = TableModel(np.asarray(target.table, np.float64), target.order)
    d = TableModel(np.asarray(draft.table, np.float64), draft.order)
    vocab, k = t.table.shape[-1], scheme.k
    width = max(t.order, d.order)
    rng = np.random.default_rng(seed)
    ctx = _contexts(rng, n_rounds, vocab, width)
    dev_t, dev_d = pair_for_device(t, d)
    keys = jax.random.split(jax.random.key(seed), n_rounds)
    out = jax.device_get(_player(scheme)(keys, dev_t, dev_d, jnp.asarray(ctx)))
    drafts = np.asarray(out.drafts, np.int64)[:, :k]
    full = np.concatenate([ctx.astype(np.int64), np.clip(drafts, 0, vocab - 1)], axis=1)
    return diagnosis.Rounds(
        drafts=drafts,
        tokens=np.asarray(out.tokens, np.int64),
        n_accepted=np.asarray(out.n_accepted, np.int64),
        p_key=_window_keys(full, width, t.order, vocab, k + 1),
        q_key=_window_keys(full, width, d.order, vocab, k),
        p_rows=t.table.reshape(-1, vocab),
        q_rows=d.table.reshape(-1, vocab),
    )


def play_host(call, target: TableModel, draft: TableModel, k: int, n_rounds: int = STAGE_ROUNDS, seed: int = 0,
              batch: int = 4096, deadline: Optional[float] = None) -> diagnosis.Rounds:
    """Single rounds of a host sampler (``call(drafts, q_rows, p_rows) -> (tokens, n_emitted)``, a
    :class:`specsample.host.run._Caller`) on drafts specsample draws from q after random contexts.

    The drafts are not the sampler's, so its drafting stage is not tested; acceptance, rejection
    and bonus are, with the rows it was given. Past ``deadline`` (``time.perf_counter()``) no further
    batch starts after the first; the rounds played so far are returned.
    """
    t, d = np.asarray(target.table, np.float64), np.asarray(draft.table, np.float64)
    vocab = t.shape[-1]
    width = max(target.order, draft.order)
    rng = np.random.default_rng(seed)
    ctx = _contexts(rng, n_rounds, vocab, width).astype(np.int64)
    full = np.concatenate([ctx, np.zeros((n_rounds, k), np.int64)], axis=1)
    rows_q = d.reshape(-1, vocab)
    for i in range(k):  # draft autoregressively from q (float64 inverse CDF), one cumulative row per window
        # (a row per round was n_rounds x V floats twice over: 8.6 GiB at V = 32,768 and 16,384 rounds)
        key = _window_keys(full[:, i : i + width + 1], width, draft.order, vocab, 1)[:, 0]
        u = rng.random(n_rounds)
        for w in np.unique(key):
            at = np.flatnonzero(key == w)
            cdf = np.cumsum(rows_q[w])
            full[at, width + i] = np.minimum(np.searchsorted(cdf, u[at] * cdf[-1], side="right"), vocab - 1)
    drafts = full[:, width:]
    p_key = _window_keys(full, width, target.order, vocab, k + 1)
    q_key = _window_keys(full, width, draft.order, vocab, k)
    p_rows, q_rows = t.reshape(-1, vocab), d.reshape(-1, vocab)
    tokens = np.zeros((n_rounds, k + 1), np.int64)
    n_em = np.zeros(n_rounds, np.int64)
    batch = rounds_per_call(k, vocab, batch)  # 4,096 rounds of 32k-token rows are 4.5 GiB before any copy
    played, size = 0, batch if deadline is None else min(batch, 16)  # timed: start small, then fill the time left
    while played < n_rounds:
        sl = slice(played, min(n_rounds, played + size))
        t0 = time.perf_counter()
        tok, n = call(drafts[sl], q_rows[q_key[sl]].astype(np.float32), p_rows[p_key[sl]].astype(np.float32))
        tokens[sl, : tok.shape[1]] = tok[:, : k + 1]
        n_em[sl] = n
        played = sl.stop
        if deadline is not None:
            now = time.perf_counter()
            per_round = (now - t0) / max(1, sl.stop - sl.start)
            size = int(min(batch, 4 * size, (deadline - now) / max(per_round, 1e-9)))
            if size < 1:
                break
    keep = slice(0, played)
    return diagnosis.Rounds(drafts[keep], tokens[keep], np.clip(n_em[keep] - 1, 0, k), p_key[keep], q_key[keep],
                            p_rows, q_rows, drafted=False)


def stage_results(rounds: diagnosis.Rounds, seed: int = 0) -> tuple[list, list]:
    """(TestResults named ``stage:<stage>`` for the case's Holm family, the StageResults behind them)."""
    res = diagnosis.stage_tests(rounds, seed)
    tests = [TestResult(f"stage:{s.stage}", s.statistic, s.pvalue, s.dof, detail=s.detail) for s in res]
    return tests, res


def table_stage_tests(scheme: Scheme, target: TableModel, draft: TableModel, n_rounds: int,
                      seed: int) -> tuple[list, list]:
    """The stage tests of a table case (none when the scheme claims no rule with stage laws); a static
    token tree gets the tree stages (:mod:`specsample.battery.tree_stages`)."""
    from .tree_stages import tree_rule, tree_stage_results

    if tree_rule(scheme) is not None:
        return tree_stage_results(scheme, target, draft, n_rounds, seed)
    if claimed_rule(scheme) != "standard" or isinstance(scheme.step, StatefulStep):
        return [], []
    return stage_results(play_table(scheme, target, draft, n_rounds, seed), seed)


STATEFUL_LANES = 2048  # sequences of a stateful scheme's standalone stage pass (the battery reads recorded rounds)
STATEFUL_ROUNDS = 3  # rounds each plays: cache bugs show in the rounds after the first


def _stateful_player(scheme: Scheme, length: int, n_lanes: int):
    """Jitted (init, step) of a stateful scheme, the models passed as arguments: one compile per scheme
    and shape serves every pair (a closure over each pair's models compiled, and kept, one per pair).
    ``init`` gives every one of ``n_lanes`` lanes the state after the prompt (broadcast inside the program:
    an eager broadcast compiles one program per leaf's shape)."""
    st = scheme.step
    key = (id(st), length, n_lanes)
    if key not in _PLAY:
        init = jax.jit(lambda t, d, prompt: jax.tree.map(lambda x: jnp.broadcast_to(x, (n_lanes,) + x.shape),
                                                         st.init(t, d, prompt, length)))
        # lanes in batches of 64, the lanes of the engine's transformer block (cases.NEURAL_BLOCK; cases
        # imports this module): a batch's caches stay in a CPU's cache
        step = jax.jit(lambda u, s, t, d: jax.lax.map(lambda us: st.round(us[0], t, d, us[1]), (u, s), batch_size=64))
        # specsample's own schemes: both programs loaded whole in a new process (tracing a neural round
        # is most of a warm stage pass)
        _PLAY[key] = (st, (program_cache.bound(init, program_identity(scheme, "stage-init", length, n_lanes)),
                           program_cache.bound(step, program_identity(scheme, "stage-step", length))))
    return _PLAY[key][1]


def _rows_on_the_path(pair, seqs: np.ndarray, starts: np.ndarray, n_acc: np.ndarray, last_of: np.ndarray,
                      k: int) -> tuple:
    """Both models' rows [N, k + 1, V] and [N, k, V] of each round at the slots the stage tests read: slot i
    for i <= j, its accepted count (the drafts tested, the rejection or the bonus); NaN at the slots after.
    (``n_acc`` 0 for every round: the row after each round's history alone, all a tree's tests read.)

    A round's rows at those slots condition on its history and its first j drafts. When the round emitted
    those drafts (a correct round does), they begin the history of every later round of its sequence, so
    the sequence's last round (``last_of[n]``, the index of round n's) holds the same tokens up to there,
    and a causal model's row depends on no token after its own: the rows come from one teacher-forced
    pass over each sequence's last round. A round whose tokens differ there (a scheme that emits other
    tokens than the drafts it says it accepted) gets a pass over its own sequence.
    """
    j = np.clip(n_acc, 0, k)
    ends, source = np.unique(last_of, return_inverse=True)
    needed = np.arange(seqs.shape[1]) <= (starts + j)[:, None]  # the tokens the rows at slots 0..j see
    own = np.flatnonzero(np.any(needed & (seqs != seqs[last_of]), axis=1))
    source = source.ravel()
    source[own] = ends.size + np.arange(own.size)
    forced = np.concatenate([seqs[ends], seqs[own]])  # padded to one length: one compiled shape for the batch
    at = starts[:, None] + np.arange(k + 1)
    off_path = np.arange(k + 1) > j[:, None]
    out = []
    for model, slots in ((pair.target, k + 1), (pair.draft, k)):
        rows = np.asarray(model.probs(forced), np.float64)[source[:, None], at[:, :slots]]
        rows[off_path[:, :slots]] = np.nan  # no stage reads them; one that did gets a NaN p-value, which Holm refuses
        out.append(rows)
    return tuple(out)


def stateful_rounds(scheme: Scheme, pair, seqs: np.ndarray, starts: np.ndarray, drafts: np.ndarray,
                    tokens: np.ndarray, n_acc: np.ndarray, last_of: np.ndarray) -> diagnosis.Rounds:
    """Rounds of a stateful scheme with both models' teacher-forced rows on their paths: round n played
    after ``seqs[n, : starts[n] + 1]`` (prompt included) and drafted ``seqs[n, starts[n] + 1 :][: k]``;
    ``last_of[n]`` is the index of the last round of its sequence (:func:`_rows_on_the_path`)."""
    k = scheme.k
    # the stage tests read each round's rows up to its first rejection; another rule's tests read only the row
    # after the round's history (round_first_token_test), which every later history of the sequence begins with
    on_path = n_acc if claimed_rule(scheme) == "standard" else np.zeros_like(n_acc)
    p, q = _rows_on_the_path(pair, seqs, starts, on_path, last_of, k)
    p_key, p_rows = _one_row_per_prefix(seqs, starts, p)
    q_key, q_rows = _one_row_per_prefix(seqs, starts, q)
    return diagnosis.Rounds(
        drafts=drafts, tokens=tokens, n_accepted=n_acc, p_key=p_key, q_key=q_key, p_rows=p_rows, q_rows=q_rows,
        history=[tuple(s_[: st + 1]) for s_, st in zip(seqs.tolist(), starts.tolist())])


def _one_row_per_prefix(seqs: np.ndarray, starts: np.ndarray, rows: np.ndarray) -> tuple:
    """Keys [N, slots] and rows [K, V]: one row for each distinct prefix (history and drafts up to the slot)
    the rows follow, and one NaN row for every slot off the path.

    Rounds that share a prefix share its law, so the stage tests pool them into one group and test it
    exactly (rounds of a short window start from the prompt, and a peaked pair drafts the same tokens
    again and again). A row of its own per round sent them all to the mixture test
    (:func:`specsample.battery.diagnosis._mixture_test`), whose chi-square limit needs many rounds'
    worth of each rare token: 1,000 rounds of a near-certain bonus row read p = 2e-6 for a correct cache.
    """
    n, slots, vocab = rows.shape
    flat = rows.reshape(-1, vocab)
    on = np.flatnonzero(~np.isnan(flat[:, 0]))
    # slot i's prefix: the round's tokens through starts + i, -1 after; grouped as the stage tests group keys
    ends = (starts[:, None] + np.arange(slots)).ravel()[on]
    prefix = np.where(np.arange(seqs.shape[1]) <= ends[:, None], seqs[on // slots], -1)
    group, first = diagnosis._groups(*prefix.T)
    table = np.concatenate([flat[on[first]], np.full((1, vocab), np.nan)])
    key = np.full(n * slots, len(table) - 1, np.int64)  # off the path: the NaN row
    key[on] = group
    return key.reshape(n, slots), table


def play_stateful(scheme: Scheme, pair, n_lanes: int = STATEFUL_LANES, rounds: int = STATEFUL_ROUNDS,
                  seed: int = 0) -> diagnosis.Rounds:
    """``rounds`` consecutive rounds of ``n_lanes`` sequences of a stateful scheme (caches carried), each
    round with both models' teacher-forced rows after the prompt, the tokens before it and its drafts.

    Rounds share a row where they share the prefix it follows (:func:`_one_row_per_prefix`), and the
    stage tests pool the rest per slot (:func:`specsample.battery.diagnosis._mixture_test`); a round
    whose caches hold the wrong tokens is scored against the rows the right tokens give. The rows are
    known at the slots the tests read (:func:`_rows_on_the_path`): up to each round's first rejection
    for a scheme that claims the standard rule, the first slot for any other.
    """
    k, prompt = scheme.k, np.asarray(pair.prompt, np.int64)
    vocab = pair.target.vocab_size
    init, step = _stateful_player(scheme, rounds * (k + 1), n_lanes)
    state = init(pair.target, pair.draft, jax.device_put(prompt.astype(np.int32)))
    key = jax.random.key(seed)
    lanes = np.arange(n_lanes)
    # each lane's history (prompt, then what it emitted) and its length, as arrays: no per-lane Python
    hist = np.zeros((n_lanes, len(prompt) + rounds * (k + 1)), np.int64)
    hist[:, : len(prompt)] = prompt
    length = np.full(n_lanes, len(prompt), np.int64)
    width = len(prompt) + (rounds - 1) * (k + 1) + k  # the longest history + k drafts
    seqs, starts, drafts, tokens, n_acc = [], [], [], [], []
    for r in range(rounds):
        u = jax.random.uniform(jax.random.fold_in(key, r), (n_lanes, scheme.step.n))
        out, state = step(u, state, pair.target, pair.draft)
        out = jax.device_get(out)
        d = np.asarray(out.drafts, np.int64)[:, :k]
        t = np.asarray(out.tokens, np.int64)
        n_em = np.clip(np.asarray(out.n_emitted, np.int64), 1, k + 1)
        seq = hist[:, :width].copy()  # the history (zeros past it), then the k drafts
        cols = length[:, None] + np.arange(k)
        seq[lanes[:, None], cols] = np.clip(d, 0, vocab - 1)
        seqs.append(seq)
        starts.append(length - 1)
        keep = np.arange(k + 1) < n_em[:, None]  # the emitted tokens join the history
        rows_, offs = np.nonzero(keep)
        hist[rows_, length[rows_] + offs] = t[rows_, offs]
        length = length + n_em
        drafts.append(d)
        tokens.append(t)
        n_acc.append(np.asarray(out.n_accepted, np.int64))
    seqs, starts, n_acc = np.concatenate(seqs), np.concatenate(starts), np.concatenate(n_acc)
    last_of = len(seqs) - n_lanes + np.arange(len(seqs)) % n_lanes  # a lane's rounds are one sequence
    return stateful_rounds(scheme, pair, seqs, starts, np.concatenate(drafts), np.concatenate(tokens), n_acc, last_of)


def stateful_stage_tests(scheme: Scheme, pair, seed: int, n_lanes: int = STATEFUL_LANES) -> tuple[list, list]:
    """The stage tests of a transformer case (:func:`rounds_stage_tests`) on rounds played for them:
    ``n_lanes`` lanes, :data:`STATEFUL_ROUNDS` rounds each (:func:`play_stateful`). The battery reads the
    rounds its engine run recorded instead (:mod:`specsample.battery.recorded_rounds`)."""
    if not isinstance(scheme.step, StatefulStep):
        return [], []
    return rounds_stage_tests(scheme, pair, play_stateful(scheme, pair, n_lanes, seed=seed), seed)


def rounds_stage_tests(scheme: Scheme, pair, rounds: diagnosis.Rounds, seed: int) -> tuple[list, list]:
    """The stage tests of a stateful scheme's rounds that claims the standard rule; for one that claims no
    stage laws (a token tree), the test every lossless round passes instead: :func:`round_first_token_test`,
    and for a tree over KV caches its rounds against the exact tree law
    (:func:`specsample.battery.tree_round_law.tree_round_law_test`)."""
    if claimed_rule(scheme) != "standard":
        from .tree_round_law import cached_tree_rule, tree_round_law_test

        tree = cached_tree_rule(scheme)
        law = tree_round_law_test(rounds, pair, *tree) if tree else None
        return [round_first_token_test(rounds)] + ([law] if law is not None else []), []
    return stage_results(rounds, seed)


def round_first_token_test(rounds: diagnosis.Rounds) -> TestResult:
    """Each round's first token against the target's row after the history that round started from.

    Whatever the rule (chain, tree, several drafts), a lossless round emits its first token from p
    given everything emitted before it. Rounds after the first start where earlier rounds left
    them, so a cache that holds the wrong tokens shows here, round by round, even when the
    sequence-level law moves little. Each round has its own row: the pooled test is
    :func:`specsample.battery.diagnosis._mixture_test`; a first token of probability 0 fails outright.
    """
    from scipy import stats as sps

    first = np.asarray(rounds.tokens, np.int64)[:, 0]
    rows = np.asarray(rounds.p_rows, np.float64)[np.asarray(rounds.p_key)[:, 0]]
    n, v = rows.shape
    counts = np.zeros((n, v))
    counts[np.arange(n), np.clip(first, 0, v - 1)] = 1.0
    zero = int(np.sum((first < 0) | (first >= v) | (rows[np.arange(n), np.clip(first, 0, v - 1)] <= 0)))
    stat, dof = diagnosis._mixture_test(counts, rows)
    pvalue = 0.0 if zero else (float(sps.chi2.sf(stat, dof)) if dof else 1.0)
    return TestResult("round-first-token", stat, pvalue, dof,
                      detail=f"{n} rounds' first tokens against p after each round's own history ({zero} of "
                             "probability 0)")
