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

from ..models.tables import all_sequences
from .report import TestResult
from .streams import mc_seed


def _floor_for(level: Optional[float], tests: int) -> Optional[float]:
    """The p-value each of ``tests`` p-values must be able to reach for their Holm-adjusted smallest (at most
    ``tests`` times the smallest) to reach ``level``."""
    return None if level is None else level / max(1, tests)


def position_test(next_counts: np.ndarray, rows: np.ndarray, t: int, min_expected: float, *,
                  level: Optional[float] = None) -> Optional[TestResult]:
    """``prefixes[t]``: next-token counts [P, V] of P prefixes against their rows [P, V]; None if none testable.
    With ``level``, a simulated p-value can go low enough for the adjusted smallest to reach it."""
    seen = next_counts.sum(axis=1)
    pvals = []
    testable = np.flatnonzero(seen * rows.max(axis=1) >= min_expected)  # enough data for two pooled cells
    floor = _floor_for(level, len(testable))
    for h in testable:
        r = stats.goodness_of_fit(next_counts[h], rows[h], min_expected=min_expected, seed=mc_seed(f"prefixes[{t}]", h),
                                  min_pvalue=floor)
        if r.cells >= 2:
            pvals.append(r.pvalue)
    if not pvals:
        return None
    adj = float(np.min(stats.holm(pvals, 0.5).adjusted))
    return TestResult(f"prefixes[{t}]", float(np.min(pvals)), adj, len(pvals),
                      detail=f"{len(pvals)} of {int(np.count_nonzero(seen))} prefixes tested on their next token; "
                             "Holm-adjusted smallest p")


def tests_from_sequences(seqs: np.ndarray, weight: np.ndarray, model, prompt, vocab: int, min_expected: float,
                         batch: int = 4096, *, level: Optional[float] = None) -> tuple[list, int, np.ndarray]:
    """Support and ``prefixes[t]`` for every position, from distinct sequences [S, L] seen ``weight`` times.

    Each distinct sequence is teacher-forced once (``model.probs(tokens [N, T]) -> [N, T, V]``, a
    causal model: row t depends on the prompt and the first t tokens only), which gives the rows of
    all its prefixes. Returns (tests, tokens emitted with probability 0, the first row). ``level``: the
    strictest level the tests are held to (:func:`position_test`).
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
        test = position_test(nxt, rows[first, t], t, min_expected, level=level)
        if test is not None:
            tests.append(test)
    return tests, zero, rows[0, 0]


def tests_from_joint(joint: np.ndarray, model, prompt, vocab: int, length: int, min_expected: float,
                     batch: int = 4096, *, level: Optional[float] = None) -> tuple[list, int, np.ndarray]:
    """:func:`tests_from_sequences` from joint counts [V**L] (a long window's cells); only the
    sequences observed are teacher-forced, not all V**(L-1) prefixes."""
    joint = np.asarray(joint).reshape(-1)
    cells = np.flatnonzero(joint)
    seqs = np.stack(np.unravel_index(cells, (vocab,) * length), axis=1).astype(np.int64)
    return tests_from_sequences(seqs, joint[cells], model, prompt, vocab, min_expected, batch, level=level)


def _prefix_codes(ids, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Length and base-V code (first token most significant) of each :func:`specsample.engine.prefix_id` row."""
    ids = np.asarray(ids, np.int64)
    starts = [0]  # starts[m]: the first row of the prefixes of m tokens (every shorter one comes before)
    while starts[-1] <= ids.max(initial=0):
        starts.append(starts[-1] + vocab ** (len(starts) - 1))
    length = np.searchsorted(starts, ids, side="right") - 1
    return length, ids - np.asarray(starts)[length]


def _prefixes_of(ids: np.ndarray, vocab: int) -> list:
    """The token tuples of :func:`specsample.engine.prefix_id` rows (shorter prefixes first)."""
    length, code = _prefix_codes(ids, vocab)
    return [tuple(int(x) for x in np.unravel_index(int(c), (vocab,) * int(m))) if m else ()
            for m, c in zip(length, code)]


def accepted_law_given_prefixes(prefixes: np.ndarray, target, draft, prompt, vocab: int, k: int,
                                batch: int = 4096) -> np.ndarray:
    """Law of the drafts a standard-rule round accepts [n, k + 1] when it starts after each of
    ``prefixes`` [n, m] (one length m), from both models' teacher-forced rows.

    The round drafts x_1..x_k from q along its own prefix; x_{d+1} is drafted and accepted with
    probability min(p, q)(x_{d+1}) given the d accepted before it, so P(N >= d) sums the products
    of min(p, q) over the V**d draft paths of length d (every path of k - 1 tokens is forced once:
    the k-th draft's row follows the first k - 1).
    """
    n, m = prefixes.shape
    prompt = np.asarray(prompt, np.int64).ravel()
    # the rows at depth d < k follow d drafts: every path of k - 1 tokens, forced once, holds them all
    ext = all_sequences(vocab, k - 1)  # [V**(k-1), k-1]
    seqs = np.concatenate([np.repeat(prefixes, len(ext), axis=0), np.tile(ext, (n, 1))], axis=1)
    toks = np.concatenate([np.broadcast_to(prompt, (len(seqs), prompt.size)), seqs], axis=1)
    rows = {}
    for name, model in (("p", target), ("q", draft)):
        out = np.concatenate([np.asarray(model.probs(toks[s : s + batch]), np.float64)[:, prompt.size - 1 + m :]
                              for s in range(0, len(toks), batch)])
        rows[name] = out.reshape(n, len(ext), k, vocab)
    mass, law = np.ones((n, 1)), []
    for d in range(k):  # level d: the V**d paths of d accepted drafts (the first path of each group)
        p, q = rows["p"][:, :: vocab ** (k - 1 - d), d], rows["q"][:, :: vocab ** (k - 1 - d), d]
        # N = d: x_{d+1} drafted and rejected, sum_x max(0, q - p): not 1 - sum_x min(p, q), which
        # float32 rows summing to 1 +- 1e-7 made negative where p ~ q (a ValueError in the test)
        law.append((mass * np.maximum(q - p, 0.0).sum(axis=2)).sum(axis=1))
        mass = (mass[:, :, None] * np.minimum(p, q)).reshape(n, -1)
    return np.stack(law + [mass.sum(axis=1)], axis=1)


def rounds_given_prefix_test(round_start: np.ndarray, target, draft, prompt, vocab: int, k: int,
                             min_expected: float, max_paths: int = 1 << 15, *,
                             level: Optional[float] = None) -> Optional[TestResult]:
    """Drafts accepted per round against the standard rule's law given the prefix the round started
    after (:attr:`specsample.engine.lanes.Counts.round_start`), for the most visited prefixes.

    Under the rule a round's outcome depends on the past only through its starting prefix, so the
    rounds that start after one prefix are i.i.d. draws from its law, however often earlier rounds
    led there. Prefixes are taken by number of rounds (fixed before any law is computed), at most
    ``max_paths / V**k`` of them (each costs V**(k - 1) teacher-forced paths); p-values are Holm-adjusted
    (``level`` as in :func:`position_test`).
    """
    n_rounds = round_start.sum(axis=1)
    order = np.argsort(-n_rounds, kind="stable")
    cap = max(1, max_paths // vocab**k)
    ids = [i for i in order[:cap] if n_rounds[i] >= 2 * min_expected]
    if not ids:
        return None
    prefixes = _prefixes_of(np.asarray(ids), vocab)
    pvals = []
    for m in sorted({len(p) for p in prefixes}):
        sel = [j for j, p in enumerate(prefixes) if len(p) == m]
        toks = np.array([prefixes[j] for j in sel], np.int64).reshape(len(sel), m)
        laws = accepted_law_given_prefixes(toks, target, draft, prompt, vocab, k)
        for j, law in zip(sel, laws):
            r = stats.goodness_of_fit(round_start[ids[j]], law, min_expected=min_expected,
                                      seed=mc_seed("rounds-given-prefix", ids[j]),
                                      min_pvalue=_floor_for(level, len(ids)))
            if r.cells >= 2:
                pvals.append(r.pvalue)
    if not pvals:
        return None
    adj = float(np.min(stats.holm(pvals, 0.5).adjusted))
    return TestResult("rounds-given-prefix", float(np.min(pvals)), adj, len(pvals),
                      detail=f"drafts accepted per round against the standard rule given its starting prefix; "
                             f"{len(pvals)} prefixes (most visited), Holm-adjusted smallest p")


def _rows_after_prefixes(models, prompt: np.ndarray, ids: np.ndarray, vocab: int, batch: int = 4096) -> list:
    """Each model's row after ``prompt`` + each prefix ``ids`` (:func:`specsample.engine.prefix_id` rows), [n, V].

    A causal model's row after a prefix is a row of the teacher-forced pass over any longer sequence
    that starts with it, so only the prefixes that are not the start of another one are forced (one
    padded batch for all lengths), and every shorter prefix reads its row off one of those.
    """
    length, code = _prefix_codes(ids, vocab)
    carrier = np.full(len(ids), -1)  # the forced sequence whose pass holds each prefix's row
    for m in range(int(length.max(initial=0)), -1, -1):
        mine = np.flatnonzero((length == m) & (carrier < 0))
        carrier[mine] = mine  # not the start of a longer visited prefix: forced itself
        for j in range(m):  # every shorter visited prefix these start with reads its row off them
            up = np.flatnonzero((length == j) & (carrier < 0))
            if not up.size:
                continue
            anc = code[mine] // vocab ** (m - j)
            hit = np.isin(code[up], anc)
            if hit.any():
                order = np.argsort(anc, kind="stable")
                carrier[up[hit]] = mine[order[np.searchsorted(anc[order], code[up[hit]])]]
    forced = np.unique(carrier)
    width = int(length[forced].max(initial=0))
    toks = np.zeros((len(forced), prompt.size + max(width, 1)), np.int64)
    toks[:, : prompt.size] = prompt
    for m in np.unique(length[forced]):
        sel = np.flatnonzero(length[forced] == m)
        digits = code[forced[sel]][:, None] // vocab ** np.arange(m - 1, -1, -1)[None, :] % vocab
        toks[sel, prompt.size : prompt.size + m] = digits
    where = np.searchsorted(forced, carrier)
    pos = prompt.size - 1 + length
    out = []
    for model in models:
        rows = np.concatenate([np.asarray(model.probs(toks[s : s + batch]), np.float64)
                               for s in range(0, len(toks), batch)])
        out.append(rows[where, pos])
    return out


def first_acceptance_test(round_start: np.ndarray, target, draft, prompt, vocab: int) -> Optional[TestResult]:
    """Rounds whose first draft was accepted, over every round start, against the standard rule:
    ``alpha(prefix) = sum min(p, q)`` of the two rows after the prefix the round started after.

    Every visited prefix counts (no cap), one row per model each, pooled by
    :func:`stats.bernoulli_sum_test`: a cache bug that shows only in rounds after some earlier
    round (a bonus token missing from a cache) moves the acceptance of those rounds, wherever
    they start.
    """
    prompt = np.asarray(prompt, np.int64).ravel()
    n_rounds = round_start.sum(axis=1)
    ids = np.flatnonzero(n_rounds)
    if not ids.size:
        return None
    p_rows, q_rows = _rows_after_prefixes((target, draft), prompt, ids, vocab)
    alpha = np.minimum(p_rows, q_rows).sum(axis=1)
    r = stats.bernoulli_sum_test(round_start[ids, 1:].sum(axis=1), n_rounds[ids], np.clip(alpha, 0.0, 1.0))
    return TestResult("first-acceptance-given-prefix", r.statistic, r.pvalue, 1,
                      detail=f"{int(r.observed)} of {int(n_rounds.sum())} rounds accepted their first draft, "
                             f"{r.expected:.1f} expected given the {len(ids)} prefixes they started after "
                             f"(z = {r.statistic:+.2f})")
