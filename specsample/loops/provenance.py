"""Provenance: the acceptance probabilities at round starts, and a run sized to find a stated offset.

A round starts at position 0 and after every token that is not an accepted draft; its first draft
is accepted with probability ``ACCEPTANCE[rule](p, q)`` (:mod:`specsample.laws.rounds`) of the two
models' rows after the prefix. The acceptance test (:func:`specsample.loops.verify.acceptance_test`)
compares the accepted starts with the sum of those probabilities. :func:`sequences_for_offset` sizes a run for it: a pilot of
sequences (their own seeds, apart from the run's) gives the round starts and the variance sum a
sequence contributes, and the two-sided z-test at ``level`` then needs

    n = (z(1 - level / 2) + z(power))^2 v / (d^2 s^2)

sequences to detect an offset d of every start's acceptance probability with probability
``power`` (s: starts per sequence, v: sum of a (1 - a) per sequence).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from . import runner as loop_runner
from ..laws.rounds import ACCEPTANCE, round_starts

def start_rates(model, draft_model, prompt, seqs, from_draft, rule: str, eos: Optional[int] = None,
                batch: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """``(a, start)``: the acceptance probability ``a`` [n, L] of a draft at every position, and where
    rounds start (``start`` [n, L] bool; nothing starts after an EOS)."""
    n, length = seqs.shape
    prompt = np.asarray(prompt, np.int64).ravel()
    start = round_starts(from_draft)
    if eos is not None:  # nothing is drafted after the sequence ended
        ended = np.cumsum(seqs == eos, axis=1) - (seqs == eos) > 0
        start &= ~ended
    uniq, inverse = np.unique(seqs, axis=0, return_inverse=True)
    alpha = np.empty((len(uniq), length))
    for s in range(0, len(uniq), batch):
        part = uniq[s : s + batch]
        toks = np.concatenate([np.broadcast_to(prompt, (len(part), prompt.size)), part[:, :-1]], axis=1)
        p = model.probs(toks)[:, prompt.size - 1 :]
        q = draft_model.probs(toks)[:, prompt.size - 1 :]
        alpha[s : s + batch] = ACCEPTANCE[rule](p, q)  # P(the first draft is accepted | its prefix)
    return np.clip(alpha[inverse.ravel()], 0.0, 1.0), start


def sequences_for_offset(generate, model, draft_model, prompt, length: int, offset: float, rule: str,
                         level: float, power: float, *, eos: Optional[int] = None, seed: int = 0, batch: int = 0,
                         workers: int = 1, pilot: int = 256) -> tuple[int, str]:
    """Sequences that make the acceptance test detect an offset ``offset`` of the acceptance rate at
    round starts with probability ``power`` at ``level``, from a pilot of ``pilot`` sequences.

    Returns the number and a note saying how it was found.
    """
    from scipy.stats import norm

    offset = float(offset)
    if not 0 < offset < 1:
        raise ValueError(f"offset is a shift of an acceptance probability, in (0, 1); got {offset!r}")
    drawn = loop_runner.draw(generate, prompt, length, pilot, seed=seed, label="pilot", eos=eos,
                             vocab=model.vocab_size, batch=batch, workers=workers, provenance=True)
    seqs, from_draft = drawn[0], drawn[2]
    a, start = start_rates(model, draft_model, prompt, seqs, from_draft, rule, eos)
    m = max(1, len(seqs))
    s_bar = start.sum() / m
    v_bar = float(np.sum((a * (1 - a))[start])) / m
    z = norm.isf(level / 2) + norm.isf(1 - power)
    n = max(1, math.ceil(z * z * v_bar / (offset * offset * s_bar * s_bar))) if s_bar > 0 else 1
    return n, (f"sized for an acceptance offset of {offset:g} at round starts: {n} sequences per arm (a pilot of "
               f"{m} sequences, {s_bar:.2f} round starts each)")
