"""Batch invariance of a batched generate loop: a sequence's law must not depend on the rows beside it.

A batched loop (``generate(prompts [B, P], n, seeds [B]) -> [B, n]``) keeps rows of different
lengths in one batch once their acceptances differ, and a loop that lets a row attend to padding, or
to another row's rejected drafts, gives that row a law that moves with its neighbours. The
end-to-end tests draw every sequence in full batches of the same prompt; this pass holds the
prompt fixed as a *probe* and calls the loop

- alone: batches of one, the probe only;
- amid neighbours: batches of :data:`BATCH`, two copies of the probe at random rows among prompts
  of other tokens (each row with its own seed),

and tests the probe's first tokens (up to :data:`TOKENS`): ``batch-invariance`` (alone against amid,
:func:`stats.homogeneity_test` of each position's token with the one before it, Bonferroni over the
positions) and ``batch-independence`` (the two copies of one call,
:func:`stats.independence_test`). Both are soft tests in the run's Holm family.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

import stats

from ..battery.report import TestResult
from .runner import LoopError, seed_of, user_call

ALONE = 800  # calls with the probe alone
AMID = 400  # calls amid neighbours (two probe copies each)
BATCH = 8
TOKENS = 4  # the probe's outcome: its first tokens (rows diverge in length after the first round)


def _labels(rows: np.ndarray) -> np.ndarray:
    """Each row of tokens as one dense label (the same tokens, the same label)."""
    _, inv = np.unique(rows, axis=0, return_inverse=True)
    return inv.ravel()


def loop_batch_check(generate: Callable, prompt: np.ndarray, length: int, vocab: int, *, seed: int = 0,
                     alone: int = ALONE, amid: int = AMID, batch: int = BATCH) -> list:
    """The probe alone and amid neighbours: two :class:`~specsample.battery.report.TestResult`."""
    prompt = np.asarray(prompt, np.int64).ravel()
    n = int(min(length, TOKENS))
    rng = np.random.default_rng(seed_of(seed, "batch/rows", 0))

    def call(prompts, seeds):
        out = user_call(generate, "generate", prompts, length, np.asarray(seeds, np.int64))
        out = np.asarray(out[0] if isinstance(out, tuple) else out, np.int64)
        if out.ndim != 2 or out.shape[0] != len(prompts) or out.shape[1] < n:
            raise LoopError(f"batched generate returned shape {out.shape} for {len(prompts)} prompts of {length} "
                            "tokens")
        return out[:, :n]

    solo = np.concatenate([call(prompt[None].copy(), [seed_of(seed, "batch/alone", i)]) for i in range(alone)])
    pairs = np.zeros((amid, 2, n), np.int64)
    for i in range(amid):
        prompts = rng.integers(0, vocab, (batch, prompt.size))
        where = rng.choice(batch, 2, replace=False)
        prompts[where] = prompt
        out = call(prompts, [seed_of(seed, f"batch/amid/{i}", j) for j in range(batch)])
        pairs[i] = out[where]
    both = pairs.reshape(-1, n)
    # per position: the token with the one before it (a transition: what a row that reads a neighbour's context
    # gets wrong), alone against amid; few cells each, where a joint of V^n cells has little power
    per = []
    for t in range(n):
        lab = _labels(np.concatenate([solo, both])[:, max(0, t - 1) : t + 1])
        cells = int(lab.max()) + 1
        per.append(stats.homogeneity_test(np.bincount(lab[:alone], minlength=cells),
                                          np.bincount(lab[alone:], minlength=cells)))
    worst = int(np.argmin([r.pvalue for r in per]))
    h_p = min(1.0, n * per[worst].pvalue)  # Bonferroni over the positions
    labels = _labels(np.concatenate([solo, both]))
    b = labels[alone:]
    pa, pb = b[0::2], b[1::2]
    ind = stats.independence_test(pa, pb)
    return [
        TestResult("batch-invariance", per[worst].statistic, h_p, per[worst].dof,
                   detail=f"each of the prompt's first {n} tokens, with the one before it, alone ({alone} calls of "
                          f"one row) and amid "
                          f"{batch - 2} rows of other prompts ({amid} calls, two copies each); worst position "
                          f"{worst}, Bonferroni over {n}"),
        TestResult("batch-independence", ind.statistic, ind.pvalue, ind.dof,
                   detail=f"two copies of the prompt in one call agree {float(np.mean(pa == pb)):.3f} of the time; "
                          f"a {ind.shape[0]}x{ind.shape[1]} pooled table"),
    ]
