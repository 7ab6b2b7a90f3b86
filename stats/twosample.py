"""Two-sample homogeneity: do two samplers produce the same distribution?"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats as sps

from ._validate import as_counts, same_shape
from .gof import MIN_EXPECTED


class HomogeneityResult(NamedTuple):
    statistic: float
    pvalue: float
    dof: int
    cells: int


def homogeneity_test(counts_a, counts_b, *, min_expected: float = MIN_EXPECTED) -> HomogeneityResult:
    """Chi-square test that two count vectors come from one distribution.

    Use when the target is not known in closed form, e.g. a reference sampler against
    an implementation under test. Cells are pooled by their combined counts (ascending)
    until every expected count in the 2 x cells table is at least ``min_expected``.
    Under the null the combined counts are sufficient for the common distribution, so
    pooling on them keeps the conditional level.

    References
    ----------
    Agresti, A. (2013). Categorical Data Analysis, 3rd ed., section 3.2.

    Examples
    --------
    >>> homogeneity_test([30, 70], [35, 65]).pvalue > 0.4
    True
    """
    a = as_counts(counts_a, "counts_a").ravel()
    b = as_counts(counts_b, "counts_b").ravel()
    same_shape(a, b, ("counts_a", "counts_b"))
    na, nb = int(a.sum()), int(b.sum())
    if na == 0 or nb == 0:
        raise ValueError("both samples need at least one observation")
    tot = a + b
    need = min_expected * (na + nb) / min(na, nb)  # combined count giving expected >= min in both rows
    order = np.argsort(tot, kind="stable")
    order = order[tot[order] > 0]
    rows_a, rows_b = [], []
    acc_a = acc_b = 0
    for cell in order:
        acc_a += a[cell]
        acc_b += b[cell]
        if acc_a + acc_b >= need:
            rows_a.append(acc_a)
            rows_b.append(acc_b)
            acc_a = acc_b = 0
    if acc_a + acc_b > 0:
        if rows_a:
            rows_a[-1] += acc_a
            rows_b[-1] += acc_b
        else:
            rows_a.append(acc_a)
            rows_b.append(acc_b)
    if len(rows_a) < 2:
        raise ValueError(
            f"too few observations for a two-sample test (need combined cells with >= {need:.0f}); "
            "collect more samples"
        )
    table = np.array([rows_a, rows_b], dtype=np.float64)
    r = sps.chi2_contingency(table, correction=False)
    return HomogeneityResult(float(r.statistic), float(r.pvalue), int(r.dof), len(rows_a))


class IndependenceResult(NamedTuple):
    statistic: float
    pvalue: float
    dof: int
    shape: tuple


def _pool_margin(counts: np.ndarray, need: float) -> np.ndarray:
    """Group labels for categories: ascending by count, merged until each group reaches ``need``."""
    order = np.argsort(counts, kind="stable")
    group = np.full(counts.size, -1)
    g, acc = 0, 0.0
    for cell in order:
        group[cell] = g
        acc += counts[cell]
        if acc >= need:
            g, acc = g + 1, 0.0
    if acc > 0 and g > 0:  # a short last group joins the one before it
        group[group == g] = g - 1
    return group


def independence_test(x, y, *, min_expected: float = MIN_EXPECTED) -> IndependenceResult:
    """Chi-square test that paired categorical outcomes ``x[i]``, ``y[i]`` are independent.

    Use for outcomes drawn in the same call, e.g. two identical requests in one batch: a
    sampler that shares randomness across requests makes them dependent while each one's
    own law stays right. Categories of each variable are pooled by their marginal counts
    (ascending) until every expected cell count is at least ``min_expected``; the margins
    are ancillary under independence, so pooling on them keeps the conditional level.

    Parameters
    ----------
    x, y : array of int, shape (n,)
        Category labels (non-negative), one pair per observation.

    References
    ----------
    Agresti, A. (2013). Categorical Data Analysis, 3rd ed., section 3.2.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> a = rng.integers(0, 3, 2000)
    >>> independence_test(a, rng.integers(0, 3, 2000)).pvalue > 0.01
    True
    >>> independence_test(a, a).pvalue < 1e-100
    True
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"x and y must be 1-d and of one length, got shapes {x.shape} and {y.shape}")
    if x.size == 0 or (x.size and (x.min() < 0 or y.min() < 0)):
        raise ValueError("x and y need at least one pair of non-negative integer labels")
    n = x.size
    cx = np.bincount(x.astype(np.int64))
    cy = np.bincount(y.astype(np.int64))
    # expected cell = rx * ry / n >= min_expected when both margins reach sqrt(min_expected * n)
    need = float(np.sqrt(min_expected * n))
    gx = _pool_margin(cx.astype(float), need)
    gy = _pool_margin(cy.astype(float), need)
    table = np.zeros((gx.max() + 1, gy.max() + 1))
    np.add.at(table, (gx[x], gy[y]), 1.0)
    table = table[table.sum(1) > 0][:, table.sum(0) > 0]
    if min(table.shape) < 2:
        return IndependenceResult(0.0, 1.0, 0, table.shape)  # one pooled category: nothing can vary
    r = sps.chi2_contingency(table, correction=False)
    return IndependenceResult(float(r.statistic), float(r.pvalue), int(r.dof), table.shape)
