"""Sequential tests: each prefix's next-token counts against the target's row for that prefix.

A window of L tokens has V**L cells, too many for a joint test once L spans several rounds;
but for each position t, the tokens that follow one prefix are i.i.d. draws from the target's
row for it under the null (which prefixes are tested depends only on earlier tokens). So each
prefix seen often enough is tested on its own, and a position's p-value is the Holm-adjusted
smallest over its prefixes. Used by the end-to-end mode (prefixes of generated sequences) and by
the battery's long-window transformer cases (prefixes read off the joint counts).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

import stats

from .report import TestResult


def position_test(next_counts: np.ndarray, rows: np.ndarray, t: int, min_expected: float) -> Optional[TestResult]:
    """``prefixes[t]``: next-token counts [P, V] of P prefixes against their rows [P, V]; None if none testable."""
    seen = next_counts.sum(axis=1)
    pvals = []
    for h in np.flatnonzero(seen * rows.max(axis=1) >= min_expected):  # enough data for two pooled cells
        r = stats.goodness_of_fit(next_counts[h], rows[h], min_expected=min_expected)
        if r.cells >= 2:
            pvals.append(r.pvalue)
    if not pvals:
        return None
    adj = float(np.min(stats.holm(pvals, 0.5).adjusted))
    return TestResult(f"prefixes[{t}]", float(np.min(pvals)), adj, len(pvals),
                      detail=f"{len(pvals)} of {int(np.count_nonzero(seen))} prefixes tested on their next token; "
                             "Holm-adjusted smallest p")


def tests_from_sequences(seqs: np.ndarray, weight: np.ndarray, model, prompt, vocab: int, min_expected: float,
                         batch: int = 4096) -> tuple[list, int, np.ndarray]:
    """Support and ``prefixes[t]`` for every position, from distinct sequences [S, L] seen ``weight`` times.

    Each distinct sequence is teacher-forced once (``model.probs(tokens [N, T]) -> [N, T, V]``, a
    causal model: row t depends on the prompt and the first t tokens only), which gives the rows of
    all its prefixes. Returns (tests, tokens emitted with probability 0, the first row).
    """
    seqs = np.asarray(seqs, np.int64)
    weight = np.asarray(weight, np.int64)
    length = seqs.shape[1]
    prompt = np.asarray(prompt, np.int64).ravel()
    rows = np.empty((len(seqs), length, vocab))
    for s in range(0, len(seqs), batch):  # row t of sequence s follows the prompt and its first t tokens
        part = seqs[s : s + batch]
        toks = np.concatenate([np.broadcast_to(prompt, (len(part), prompt.size)), part[:, :-1]], axis=1)
        rows[s : s + batch] = np.asarray(model.probs(toks), np.float64)[:, prompt.size - 1 :]
    hit = np.take_along_axis(rows, seqs[..., None], axis=2)[..., 0]  # [S, L]
    zero = int((weight[:, None] * (hit == 0)).sum())
    tests = []
    for t in range(length):
        prefixes, first, inverse = np.unique(seqs[:, :t], axis=0, return_index=True, return_inverse=True)
        nxt = np.zeros((len(prefixes), vocab), np.int64)
        np.add.at(nxt, (inverse.ravel(), seqs[:, t]), weight)
        test = position_test(nxt, rows[first, t], t, min_expected)
        if test is not None:
            tests.append(test)
    return tests, zero, rows[0, 0]


def tests_from_joint(joint: np.ndarray, model, prompt, vocab: int, length: int, min_expected: float,
                     batch: int = 4096) -> tuple[list, int, np.ndarray]:
    """:func:`tests_from_sequences` from joint counts [V**L] (a long window's cells); only the
    sequences observed are teacher-forced, not all V**(L-1) prefixes."""
    joint = np.asarray(joint).reshape(-1)
    cells = np.flatnonzero(joint)
    seqs = np.stack(np.unravel_index(cells, (vocab,) * length), axis=1).astype(np.int64)
    return tests_from_sequences(seqs, joint[cells], model, prompt, vocab, min_expected, batch)
