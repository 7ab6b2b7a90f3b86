"""Goodness of fit of per-context transition counts (n-gram / Markov models)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats as sps

from ._validate import as_counts, as_probs, same_shape
from .gof import MIN_EXPECTED, _divergence_stat, _LAMBDAS, pool_cells


class TransitionResult(NamedTuple):
    """Result of :func:`transition_test`."""

    statistic: float
    pvalue: float
    dof: int
    contexts: int  # contexts that contributed to the statistic
    violations: np.ndarray  # (context, token) pairs observed where the model gives 0


def transition_test(counts, probs, *, statistic: str = "pearson",
                    min_expected: float = MIN_EXPECTED) -> TransitionResult:
    """Test per-context next-token counts against each context's distribution.

    Given the number of visits n_c to context c, the next tokens are multinomial
    (n_c, probs[c]), independently across contexts. Each context with at least two
    pooled cells (pooling from ``probs[c]`` and n_c, never from the counts of tokens)
    contributes its statistic; the sum is chi-square with the summed degrees of freedom
    (Anderson and Goodman 1957). Contexts visited too rarely are skipped, which costs
    power but not validity. A token observed where its context gives probability 0 is
    a hard violation (p-value 0).

    Parameters
    ----------
    counts, probs : array_like, shape (contexts, V)

    References
    ----------
    Anderson, T. W. and Goodman, L. A. (1957). Statistical inference about Markov chains.
    Ann. Math. Statist. 28, 89-110.
    """
    c = as_counts(counts)
    p = as_probs(probs, axis=-1)
    same_shape(c, p, ("counts", "probs"))
    if c.ndim != 2:
        raise ValueError(f"counts must be 2-D (contexts, V), got shape {c.shape}")
    if statistic not in _LAMBDAS:
        raise ValueError(f"unknown statistic {statistic!r}; choose one of {sorted(_LAMBDAS)}")
    bad = np.argwhere((p == 0) & (c > 0))
    if bad.size:
        return TransitionResult(float("inf"), 0.0, 0, 0, bad)
    lam = _LAMBDAS[statistic]
    total, dof, used = 0.0, 0, 0
    for ctx in np.flatnonzero(c.sum(axis=1) >= 2 * min_expected):
        n = int(c[ctx].sum())
        plan = pool_cells(p[ctx], n, min_expected)
        if plan.n_groups < 2:
            continue
        total += float(_divergence_stat(plan.apply(c[ctx]), plan.probs * n, lam))
        dof += plan.n_groups - 1
        used += 1
    if dof == 0:
        return TransitionResult(0.0, 1.0, 0, 0, bad)
    return TransitionResult(total, float(sps.chi2.sf(total, dof)), dof, used, bad)
