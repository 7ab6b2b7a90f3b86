"""Exact position laws of a registered scheme on the battery's table pairs, where enumeration is cheap.

:func:`specsample.laws.exact.round_law` gives the exact law of one round by enumerating every draft
sequence (``V**k`` of them). On a context-free pair rounds are independent and identically
distributed blocks, so the law of the token at position t follows by renewal, without the joint of
the first L tokens: a block starts at s with probability ``start[s]`` (``start[0] = 1``, ``start[s] =
sum_l start[s - l] P(length l)``), and position t is offset ``t - s`` of the block that starts at s and
is longer than that. With context (n-gram pairs) the joint of the first L tokens is composed instead
(:func:`specsample.laws.exact.stream_joint`), while ``V**L`` stays small.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..battery.cases import default_cases, select
from ..laws.exact import EXACT, round_law, stream_joint
from ..schemes.lossy import rule_of

MAX_DRAFT_SEQUENCES = 4096  # V**k enumerated per context (python loops: about a second at this size)
MAX_JOINT_CELLS = 1024  # V**L of a joint composed with context (V = 4, L = 6: 2-7 s a case, left out)


def has_exact(scheme_name: str) -> bool:
    """Whether specsample can compute ``scheme_name``'s exact round law (a registered rule)."""
    return scheme_name in EXACT or rule_of(scheme_name) is not None


def renewal_marginals(block_law: dict, vocab: int, length: int) -> np.ndarray:
    """Position laws [length, vocab] of a stream of i.i.d. blocks with law ``{tokens: probability}``."""
    longest = max(len(b) for b in block_law)
    by_offset = np.zeros((longest, vocab))  # P(block longer than j and its token j is y)
    lengths = np.zeros(longest + 1)
    for block, pr in block_law.items():
        lengths[len(block)] += pr
        for j, y in enumerate(block):
            by_offset[j, y] += pr
    start = np.zeros(length)
    start[0] = 1.0
    for s in range(1, length):
        start[s] = sum(start[s - ln] * lengths[ln] for ln in range(1, min(s, longest) + 1))
    out = np.zeros((length, vocab))
    for t in range(length):
        for s in range(max(0, t - longest + 1), t + 1):
            out[t] += start[s] * by_offset[t - s]
    return out


def case_exact_laws(scheme_name: str, case, seed: int) -> Optional[np.ndarray]:
    """Exact position laws [L, V] of ``scheme_name`` on a battery case's pair, or None where too costly
    (or not a table case)."""
    if case.neural or case.sweep or case.boundary or not has_exact(scheme_name):
        return None
    if case.vocab**case.k > MAX_DRAFT_SEQUENCES:
        return None
    pair = case.pair(seed)
    target, draft = pair.target, pair.draft
    width = max(target.order, draft.order)
    model_order = case.order if case.model_order is None else case.model_order
    law = round_law(scheme_name, target, draft, case.k)
    if model_order == 0:  # context-free: the round law does not depend on the context
        from ..models.tables import initial_context

        return renewal_marginals(law(tuple(int(t) for t in initial_context(width))), case.vocab, case.length)
    if case.vocab**case.length > MAX_JOINT_CELLS:
        return None
    joint = stream_joint(law, case.vocab, case.length, width).reshape((case.vocab,) * case.length)
    return np.stack([joint.sum(axis=tuple(a for a in range(case.length) if a != t)) for t in range(case.length)])


def exact_laws(scheme_name: str, budget, seed: int, ks=(1, 4, 8)) -> Callable:
    """``case_result -> exact laws or None`` for a battery run of ``scheme_name`` (the cases of ``budget``)."""
    cases = {c.name: c for c in default_cases(budget, ks)}

    def of(case_result):
        case = cases.get(case_result.name)
        if case is None:
            picked = select(list(cases.values()), case_result.name)
            case = picked[0] if len(picked) == 1 else None
        return None if case is None else case_exact_laws(scheme_name, case, seed)

    return of
