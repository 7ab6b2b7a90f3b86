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
