"""The battery for host tree samplers: cases of either convention, one Holm family, one report.

:func:`verify_tree_host` runs the batch convention's cases (:mod:`.tree`: one tree shape a call) or
the ragged one's (:mod:`.tree_ragged`: a tree per request), as the sampler's ``layout`` says.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Optional

import stats

from ..battery.report import Report
from .tree import BATCH, TREE_CAPS, TREE_CASES, TREE_TV, TreeSampler, _case
from .tree_ragged import ragged_case


def plan_rounds(budget, vocab: int, contexts: int, level: float, power: float) -> int:
    """Rounds per case: enough for the first-token test to detect the budget's TV at every context
    (power calculation), capped by the budget; an integer budget is taken as given."""
    if isinstance(budget, str) and budget in TREE_CAPS:
        need = stats.samples_for_tv(TREE_TV[budget], vocab - 1, level, power).n * contexts
        return int(min(TREE_CAPS[budget], need))
    try:
        n = int(float(budget))
    except (TypeError, ValueError):
        raise ValueError(f"unknown budget {budget!r}; valid: {', '.join(TREE_CAPS)} or a number of rounds") from None
    if n < 64:
        raise ValueError(f"a tree budget of {n} rounds per case is too small for a valid test; give at least 64")
    return n


def verify_tree_host(sampler, *, branching=(3, 2, 1), budget="quick", seed: int = 0, alpha: float = 0.01,
                     power: float = 0.99, rule: Optional[str] = None) -> Report:
    """Verify a host tree sampler (module docstring) on table pairs; returns a :class:`Report`.

    Parameters
    ----------
    sampler : TreeSampler or callable
        A callable is wrapped with ``rule`` (default ``"rrs"``).
    branching : tuple of int
        Children per node at each depth of the static trees specsample drafts.
    budget : {"quick", "default", "thorough"} or int
        Rounds per case from a power calculation (capped), or a number of rounds.

    Examples
    --------
    >>> report = verify_tree_host(tree_reference("topk"), budget="quick")  # doctest: +SKIP
    >>> report.passed  # doctest: +SKIP
    True
    """
    from ..battery.suite import _holm_all

    s = sampler if isinstance(sampler, TreeSampler) else TreeSampler(sampler, rule=rule or "rrs")
    if rule is not None and rule != s.rule:
        s = dataclasses.replace(s, rule=rule)
    branching = tuple(int(b) for b in branching)
    if not branching or min(branching) < 1:
        raise ValueError(f"branching must be positive counts per depth, got {branching!r}")
    if math.prod(branching) > 4096:
        raise ValueError(f"a tree of {math.prod(branching)} leaves is too large for exact laws; use at most 4096")
    alpha = stats.multiplicity.check_level(alpha)
    level = alpha / (4 * len(TREE_CASES))
    t0 = time.perf_counter()
    results = []
    for name, family, vocab, order in TREE_CASES:
        if s.rule == "rrs-wor" and max(branching) > vocab:
            continue  # more distinct children than tokens
        n = plan_rounds(budget, vocab, vocab if order else 1, level, power)
        if s.layout == "ragged":  # a tree per request (specsample.host.tree_ragged)
            results.append(ragged_case(s, f"tree-ragged/{name}/V{vocab}", family, vocab, order, branching, n, seed,
                                       level, power))
            continue
        results.append(_case(s, f"tree-host/{name}/V{vocab}", family, vocab, order, branching, n, seed, level, power))
    _holm_all(results, alpha)
    return Report(scheme=s.name, alpha=alpha, seed=int(seed), budget=str(budget), cases=results,
                  seconds=time.perf_counter() - t0, power=power,
                  engine=dict(host_tree=dict(rule=s.rule, branching=list(branching), batch=BATCH, layout=s.layout)))
