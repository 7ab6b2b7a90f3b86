"""Helpers for using specsample inside any project's own pytest suite."""

from __future__ import annotations

from .report import Report
from .battery import verify


def assert_lossless(scheme, *, budget="quick", seed: int = 0, alpha: float = 0.01, cases=None, **kwargs) -> Report:
    """Run the battery and raise ``AssertionError`` with the report table if any case fails.

    Parameters are those of :func:`specsample.verify`; the default budget is "quick".
    Returns the report when the scheme passes.

    Examples
    --------
    >>> from specsample.testing import assert_lossless
    >>> assert_lossless("standard", cases="dirichlet/V8/k4")  # doctest: +SKIP
    """
    report = verify(scheme, budget=budget, seed=seed, alpha=alpha, cases=cases, **kwargs)
    if not report.passed:
        failed = [c for c in report.cases if not c.passed]
        detail = "\n".join(
            f"  {c.name}: {c.worst.name} (adjusted p = {c.worst.adjusted:.3g}) {c.worst.detail}".rstrip()
            for c in failed
        )
        raise AssertionError(f"{report.headline()}\n\n{report.table()}\n\nfailing tests:\n{detail}")
    return report
