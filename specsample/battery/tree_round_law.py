"""Rounds of a token tree over KV caches (``tree-cached``) against the exact tree law.

A round's emitted tokens have an exact law given the history it starts from: the static tree rule's
(:func:`specsample.laws.tree_exact.tree_law`) on the two transformers' rows after that history and
every path below it. The rows come from one teacher-forced pass over every continuation of D tokens
(:func:`specsample.laws.exact.prefix_rows`), so the law costs V^D sequences a history: it is computed
for the histories most rounds start from (every lane's first round starts from the prompt; on a small
vocabulary later rounds share histories too), and the rounds from those histories are tested, each
history its own pooled chi-square, summed. A cache that holds the wrong keys moves these laws where
the round's first token may not move.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Optional

import numpy as np
from scipy import stats as sps

from .diagnosis import Rounds, chi2_term
from .report import TestResult
from .streams import mc_seed
from ..laws.exact import prefix_rows
from ..laws.tree_exact import tree_law

MIN_ROUNDS = 32  # rounds a history needs before its law is computed
MAX_HISTORIES = 16  # histories whose laws are computed, most rounds first
MAX_SEQUENCES = 1 << 13  # V^D continuations a history's rows may take
TOTAL_SEQUENCES = 1 << 14  # ... and all histories together: a few seconds of teacher forcing on a CPU


class _Rows:
    """A model's rows after one history and each path below it, as :func:`tree_law` reads a table model
    (order 0: the law is asked from the empty context, the history is bound here)."""

    order = 0

    def __init__(self, model, history: tuple, depth: int):
        self.vocab = model.vocab_size
        self.levels = prefix_rows(model, history, depth + 1)

    def probs_np(self, tokens) -> np.ndarray:
        out, idx = [], 0
        for i in range(len(tokens) + 1):
            out.append(self.levels[i][idx])
            if i < len(tokens):
                idx = idx * self.vocab + int(tokens[i])
        return np.stack(out)

    def last_np(self, tokens) -> np.ndarray:
        """The row after all of ``tokens`` alone (what the tree law reads, node by node)."""
        idx = 0
        for t in tokens.tolist():
            idx = idx * self.vocab + t
        return self.levels[len(tokens)][idx]


def cached_tree_rule(scheme) -> Optional[tuple]:
    """``(rule, branching)`` of a stateful tree round built as ``tree_cached``'s (a partial with both)."""
    fn = getattr(scheme.step, "round", None)
    if isinstance(fn, functools.partial) and {"branching", "rule"} <= set(fn.keywords):
        return str(fn.keywords["rule"]), tuple(int(b) for b in fn.keywords["branching"])
    return None


def tree_round_law_test(rounds: Rounds, pair, rule: str, branching: tuple) -> Optional[TestResult]:
    """``tree-round-law``: the emitted tokens of rounds from the commonest histories against their exact law
    (None where no history's law can be computed: V^D too large, or no history with enough rounds)."""
    vocab, depth = pair.target.vocab_size, len(branching)
    n_em = np.clip(np.asarray(rounds.n_accepted, np.int64) + 1, 1, depth + 1)
    blocks = [tuple(int(x) for x in t[:m]) for t, m in zip(np.asarray(rounds.tokens, np.int64), n_em)]
    if rounds.history is None or vocab ** depth > MAX_SEQUENCES:
        return None  # V^D continuations a history: too many to enumerate (no test rather than one that cannot fire)
    most = max(1, min(MAX_HISTORIES, TOTAL_SEQUENCES // vocab ** depth))
    common = [(h, c) for h, c in Counter(rounds.history).most_common(most) if c >= MIN_ROUNDS]
    stat, dof, outside, used = 0.0, 0, 0, 0
    for i, (h, _) in enumerate(common):
        law = tree_law(rule, _Rows(pair.target, h, depth), _Rows(pair.draft, h, depth), branching)(())
        mine = Counter(b for b, hh in zip(blocks, rounds.history) if hh == h)
        cells = sorted(law)
        counts = np.array([mine.get(c, 0) for c in cells], np.float64)
        outside += sum(n for b, n in mine.items() if law.get(b, 0.0) <= 0)
        used += sum(mine.values())
        # a history whose law pools to one cell (a near-certain block) enters by its p-value's quantile: one
        # block of expected count 0.03 seen once scores about 30 raw, a tail of 1e-7, where the exact tail is 0.03
        term = chi2_term(counts, np.array([law[c] for c in cells]), mc_seed("tree-round-law", i))
        if term is not None:
            stat, dof = stat + term[0], dof + term[1]
    if not used:
        return None
    pvalue = 0.0 if outside else (float(sps.chi2.sf(stat, dof)) if dof else 1.0)
    return TestResult("tree-round-law", float("inf") if outside else stat, pvalue, dof,
                      detail=f"{used} of {len(blocks)} rounds, from the {len(common)} histories with >= {MIN_ROUNDS} "
                             f"rounds, against the exact {rule} tree law there" +
                             (f"; {outside} emitted what the rule never emits" if outside else ""))
