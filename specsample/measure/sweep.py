"""Distortion against speed as a lossy rule's threshold moves.

:func:`sweep` runs a rule (:mod:`specsample.schemes.lossy`) at each of several parameter settings on
one battery case's pair, and records for each the distance of every position's law from p (estimate,
interval simultaneous over the whole sweep, exact value) beside its tokens per round. The standard
rule runs beside it as the lossless reference (TV 0). ``specsample measure --sweep`` prints it and
``specsample figures`` draws it (``distortion``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Optional, Sequence

import numpy as np

from stats import distance

from ..battery.cases import DRAFT_LENGTHS, default_cases
from ..battery.suite import resolve_budget
from ..engine import lanes as engine
from ..models.tables import exact_marginals
from ..schemes import make_scheme
from ..schemes.lossy import RULES, parse
from .exact import case_exact_laws

# the thresholds ``specsample figures`` draws: relaxed moves both of SGLang's thresholds together, typical
# both of vLLM's (posterior_threshold and posterior_alpha: a threshold of posterior_alpha exp(-H(p)))
FIGURE_SWEEPS = {
    "relaxed": ("threshold_single,threshold_acc", (1.0, 0.9, 0.7, 0.5, 0.3, 0.1)),
    "typical": ("posterior_threshold,posterior_alpha", (1.0, 0.7, 0.5, 0.3, 0.15, 0.05)),
}


@dataclasses.dataclass
class SweepPoint:
    """One setting: the scheme name it ran, its tokens per round, and each position's distance."""

    scheme: str
    value: float
    tokens_per_round: float
    tv: list  # distance.TVInterval per position
    exact: Optional[list]  # exact TV per position, where computable

    @property
    def worst(self) -> distance.TVInterval:
        """The position whose interval reaches highest."""
        return max(self.tv, key=lambda r: r.upper)

    def to_dict(self) -> dict:
        fin = lambda x: x if isinstance(x, float) and math.isfinite(x) else None  # noqa: E731
        return {"scheme": self.scheme, "value": self.value, "tokens_per_round": fin(self.tokens_per_round),
                "positions": [{"tv_estimate": fin(r.estimate), "tv_lower": r.lower, "tv_upper": r.upper,
                               "tv_exact": None if self.exact is None else fin(self.exact[t])}
                              for t, r in enumerate(self.tv)]}


def settings(rule: str, keys: str, values: Sequence[float], base: Optional[dict] = None) -> list:
    """Scheme names of ``rule`` with each value given to every parameter in ``keys`` (comma-separated)."""
    base = dict(base or {})
    names = []
    for v in values:
        params = {**base, **{k.strip(): float(v) for k in keys.split(",") if k.strip()}}
        names.append(f"{rule}[{','.join(f'{k}={p:g}' if isinstance(p, float) else f'{k}={p}' for k, p in params.items())}]")
    return names


def parse_sweep(scheme: str, text: str) -> tuple[str, str, list]:
    """``--sweep KEY[,KEY]=V1,V2,...`` for ``--scheme RULE[...]``: (rule, keys, scheme names)."""
    parsed = parse(scheme) if "[" in scheme else (scheme, {}) if scheme in RULES else None
    if parsed is None:
        raise ValueError(f"--sweep moves a lossy rule's parameter; --scheme must be one of {', '.join(RULES)} "
                         f"(optionally with parameters, e.g. relaxed[threshold_acc=0.5]), got {scheme!r}")
    rule, base = parsed
    keys, eq, vals = text.rpartition("=")
    if not eq or not keys:
        raise ValueError(f"--sweep takes KEY=V1,V2,... (e.g. threshold_acc=1,0.8,0.5), got {text!r}")
    try:
        values = [float(v) for v in vals.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--sweep values must be numbers separated by commas, got {vals!r}") from None
    if not values:
        raise ValueError(f"--sweep needs at least one value, got {text!r}")
    names = settings(rule, keys, values, {k: v for k, v in base.items() if k not in keys.split(",")})
    for n in names:  # a bad key or value fails now, in one line
        make_scheme(n, 1)
    return rule, keys, list(zip(values, names))


def _case(name: str, bud):
    """The table case called ``name`` (context-free or n-gram; not a sweep, boundary or transformer case)."""
    k = re.search(r"/k(\d+)$", name)
    ks = tuple(sorted(set(DRAFT_LENGTHS) | ({int(k.group(1))} if k else set())))
    for c in default_cases(bud, ks):
        if c.name == name and not (c.neural or c.sweep or c.boundary):
            return c
    raise ValueError(f"a sweep runs on one table case, e.g. dirichlet/V8/k4; {name!r} is not one "
                     "(specsample list names the cases)")


def sweep(points: Sequence[tuple], *, case: str = "dirichlet/V8/k4", budget="quick", seed: int = 0,
          alpha: float = 0.01, reference: str = "standard", progress=None) -> list:
    """Run each ``(value, scheme name)`` of ``points`` (and ``reference`` first, value NaN) on one case's pair.

    Every interval holds simultaneously over all settings and positions (Bonferroni, at ``alpha``
    shared among them). Returns a :class:`SweepPoint` per setting, the reference first.
    """
    bud, explicit, _ = resolve_budget(budget)
    c = _case(case, bud)
    pair = c.pair(seed)
    n = explicit or bud.max_sequences
    runs = ([(float("nan"), reference)] if reference else []) + list(points)
    m = len(runs) * c.length
    marg = exact_marginals(pair.target, c.length)
    out = []
    for i, (value, name) in enumerate(runs):
        scheme = make_scheme(name, c.k)
        counts = engine.run(scheme, pair.target, pair.draft, sequences=n, length=c.length, seed=seed)
        pos = np.asarray(counts.position).reshape(c.length, c.vocab)
        emitted = np.ravel(np.asarray(counts.emitted))
        tpr = float((emitted * np.arange(emitted.size)).sum() / max(1, int(np.sum(counts.rounds))))
        tv = [distance.tv_interval(pos[t], marg[t], alpha / m) for t in range(c.length)]
        laws = case_exact_laws(name, c, seed)
        exact = None if laws is None else [0.5 * float(np.abs(laws[t] - marg[t]).sum()) for t in range(c.length)]
        out.append(SweepPoint(name, value, tpr, tv, exact))
        if progress:
            progress(name, i + 1, len(runs))
    return out
