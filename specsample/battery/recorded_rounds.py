"""A transformer case's stage tests, on the rounds its engine run recorded.

The engine keeps every round of a stateful run's first block as it was played
(:attr:`specsample.engine.lanes.Counts.record`; in the battery 64 lanes of 16 sequences, some 1,000 to
4,000 rounds): the drafts, the tokens, the accepted and emitted counts.
:func:`recorded_rounds` rebuilds each round's history from them (the prompt, then what the lane's
sequence emitted before it, back to the prompt when a sequence is complete) and takes both models'
teacher-forced rows along its path (:func:`specsample.battery.stages.stateful_rounds`); the stage tests
then run as on rounds played for them (:func:`specsample.battery.stages.rounds_stage_tests`).

Before, a separate pass played 1,024 to 2,048 lanes for three rounds through programs loaded for it
alone, 0.3-0.7 s a case in every process whatever the budget: most of what a quick ``cached`` battery
added to a standard one. These rounds were played anyway; the engine's loop writes one small row per
round into its carry. They are the rounds the case's counts come from, so the stage tests and the
sequence tests are not independent; Holm's correction holds under any dependence.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import stages
from ..engine.cells import record_fields
from ..schemes import Scheme


class Replay(NamedTuple):
    """The recorded rounds, each after the history the record implies (see :func:`replay`)."""

    seqs: np.ndarray  # [N, width] round n's history (prompt included), then its k drafts, zeros after
    starts: np.ndarray  # [N] the index of the history's last token in seqs[n]
    drafts: np.ndarray  # [N, k]
    tokens: np.ndarray  # [N, max_tokens]
    n_accepted: np.ndarray  # [N]
    last_of: np.ndarray  # [N] the index of the last round of round n's sequence
    windows: np.ndarray  # [S, length] the first ``length`` tokens of every sequence the record completes


def replay(scheme: Scheme, pair, record: np.ndarray, length: int) -> Replay:
    """The rounds in ``record`` [R, F, lanes] (one pair's :attr:`~specsample.engine.lanes.Counts.record`) of
    a run that kept ``length`` tokens a sequence, each with its history: the prompt, then the tokens its
    lane's sequence emitted before it (a complete sequence starts again after the prompt)."""
    k, max_tokens = scheme.k, scheme.max_tokens
    fields = record_fields(k, max_tokens)
    record = np.asarray(record, np.int64)
    if record.ndim != 3 or record.shape[1] != len(fields):
        raise ValueError(f"a record of k = {k}, {max_tokens} tokens a round is [rounds, {len(fields)}, lanes]; "
                         f"got shape {record.shape}")
    f = {name: i for i, name in enumerate(fields)}
    vocab = pair.target.vocab_size
    prompt = np.asarray(pair.prompt, np.int64)
    n_rec, _, n_lanes = record.shape
    plen = prompt.size
    width = plen + length - 1 + k  # the longest history before a round, then its k drafts
    hist = np.zeros((n_lanes, plen + length + max_tokens), np.int64)  # a lane's sequence so far
    hist[:, :plen] = prompt
    pos = np.zeros(n_lanes, np.int64)
    seq_no = np.zeros(n_lanes, np.int64)
    seqs, starts, drafts, tokens, n_acc, seq_id, windows = [], [], [], [], [], [], []
    d0, t0 = f["draft0"], f["token0"]
    for r in range(n_rec):
        a = np.flatnonzero(record[r, f["active"]] == 1)
        if a.size == 0:
            break  # every lane is done: the rows after are zeros
        d = record[r, d0 : d0 + k][:, a].T
        t = record[r, t0 : t0 + max_tokens][:, a].T
        n_em = np.clip(record[r, f["n_emitted"], a], 1, max_tokens)
        seq = hist[a, :width].copy()
        seq[np.arange(a.size)[:, None], plen + pos[a, None] + np.arange(k)] = np.clip(d, 0, vocab - 1)
        seqs.append(seq)
        starts.append(plen + pos[a] - 1)
        drafts.append(d)
        tokens.append(t)
        n_acc.append(record[r, f["n_accepted"], a])
        seq_id.append(a * n_rec + seq_no[a])  # unique per (lane, sequence)
        rows_, offs = np.nonzero(np.arange(max_tokens) < n_em[:, None])  # the emitted tokens join the history
        hist[a[rows_], plen + pos[a[rows_]] + offs] = np.clip(t[rows_, offs], 0, vocab - 1)
        pos[a] += n_em
        done = a[pos[a] >= length]  # a complete sequence: the lane starts again after the prompt
        windows.append(hist[done, plen : plen + length].copy())
        hist[done, plen:] = 0
        pos[done] = 0
        seq_no[done] += 1
    if not seqs:
        raise ValueError("the record holds no round")
    ids = np.concatenate(seq_id)
    _, inv = np.unique(ids, return_inverse=True)
    inv = inv.ravel()
    last = np.zeros(inv.max() + 1, np.int64)
    np.maximum.at(last, inv, np.arange(ids.size))
    return Replay(np.concatenate(seqs), np.concatenate(starts), np.concatenate(drafts), np.concatenate(tokens),
                  np.concatenate(n_acc), last[inv], np.concatenate(windows))


def recorded_rounds(scheme: Scheme, pair, record: np.ndarray, length: int):
    """:class:`specsample.battery.diagnosis.Rounds` of the rounds in ``record`` (:func:`replay`), with both
    models' teacher-forced rows on their paths."""
    r = replay(scheme, pair, record, length)
    return stages.stateful_rounds(scheme, pair, r.seqs, r.starts, r.drafts, r.tokens, r.n_accepted, r.last_of)


def recorded_stage_tests(scheme: Scheme, pair, record: np.ndarray, length: int, seed: int) -> tuple[list, list]:
    """The stage tests of a transformer case (:func:`specsample.battery.stages.rounds_stage_tests`) on the
    rounds its engine run recorded."""
    return stages.rounds_stage_tests(scheme, pair, recorded_rounds(scheme, pair, record, length), seed)
