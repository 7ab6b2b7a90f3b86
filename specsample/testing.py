"""Helpers for using specsample inside any project's own pytest suite."""

from __future__ import annotations

from .battery.report import Report
from .battery.suite import verify


def assert_lossless(scheme=None, *, sampler=None, budget="quick", seed: int = 0, alpha: float = 0.01, cases=None,
                    **kwargs) -> Report:
    """Run the battery and raise ``AssertionError`` with the report table if any case fails.

    Give a JAX ``scheme`` (parameters those of :func:`specsample.verify`), or a host ``sampler``
    (a numpy/torch callable, :class:`specsample.host.HostSampler` or ``path.py:fn``; parameters
    those of :func:`specsample.host.verify_host`, such as ``rng="torch"``). The default budget is
    "quick". Returns the report when it passes.

    Examples
    --------
    >>> from specsample.testing import assert_lossless
    >>> assert_lossless("standard", cases="dirichlet/V8/k4")  # doctest: +SKIP
    >>> assert_lossless(sampler="my_sampler.py:verify", rng="torch", arrays="torch", k=4)  # doctest: +SKIP
    """
    if (scheme is None) == (sampler is None):
        raise TypeError("assert_lossless takes a scheme or a sampler= (a host callable), not both or neither")
    if sampler is not None:
        from .host import verify_host

        report = verify_host(sampler, budget=budget, seed=seed, alpha=alpha, cases=cases, **kwargs)
    else:
        report = verify(scheme, budget=budget, seed=seed, alpha=alpha, cases=cases, **kwargs)
    if not report.passed:
        failed = [c for c in report.cases if not c.passed]
        detail = "\n".join(
            f"  {c.name}: {c.worst.name} (adjusted p = {c.worst.adjusted:.3g}) {c.worst.detail}".rstrip()
            for c in failed
        )
        raise AssertionError(f"{report.headline()}\n\n{report.table()}\n\nfailing tests:\n{detail}")
    return report
