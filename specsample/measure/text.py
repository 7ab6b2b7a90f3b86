"""A measurement in words: a table of each case's farthest position law, and a headline with the verdict."""

from __future__ import annotations

import math
import textwrap
from collections import OrderedDict

from .distances import Measurement


def _tv(x) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    if abs(x) < 1e-12:
        return "0"
    return f"{x:.2g}" if x < 0.001 else f"{x:.4f}"


def table(m: Measurement) -> str:
    """One row a case: its position law whose interval reaches highest, with the estimate and exact value."""
    by_case: "OrderedDict[str, list]" = OrderedDict()
    for r in m.rows:
        by_case.setdefault(r.case, []).append(r)
    width = max([28] + [len(c) for c in by_case])
    head = (f"{'case':{width}s} {'laws':>4s} {'n':>9s}  {'law':>18s} {'TV estimate':>11s} "
            f"{'interval':>17s} {'exact':>7s} {'KL (nats)':>10s}")
    lines = [head, "-" * len(head)]
    for case, rows in by_case.items():
        outputs = [r for r in rows if not r.stage]
        stages = [r for r in rows if r.stage]
        # the output's farthest law; below it, the stage law with the most evidence of a distance
        shown = ([max(outputs, key=lambda r: r.tv.upper)] if outputs else []) + \
            ([max(stages, key=lambda r: (r.tv.lower, r.tv.estimate))] if stages else [])
        for i, w in enumerate(shown):
            kl = "-" if not math.isfinite(w.kl.estimate) else ("inf" if math.isinf(w.kl.estimate) else
                                                                 f"{w.kl.estimate:.2g}")
            interval = f"[{_tv(w.tv.lower)}, {_tv(w.tv.upper)}]"
            name, count = (case, f"{len(rows):4d}") if i == 0 else ("", "    ")
            lines.append(f"{name:{width}s} {count} {w.n:9,d}  {w.law:>18s} {_tv(w.tv.estimate):>11s} "
                         f"{interval:>17s} {_tv(w.exact):>7s} {kl:>10s}")
    return "\n".join(lines)


def headline(m: Measurement, width: int = 100) -> str:
    """The verdict: the bound every law is within (no tolerance), or within / beyond / undecided."""
    n = len(m.rows)
    cases = len({r.case for r in m.rows})
    stages = sum(1 for r in m.rows if r.stage)
    kinds = f"{n - stages} position laws" + (f" and {stages} stage laws" if stages else "")
    conf = f"{100 * m.confidence:g}% confidence, simultaneous over {kinds} in {cases} case" \
           f"{'s' * (cases != 1)} (Bonferroni)"
    best = max(m.positions or m.rows, key=lambda r: r.tv.estimate if math.isfinite(r.tv.estimate) else -1)
    where = lambda r: f"{r.case} {r.law}"  # noqa: E731
    exact = [r.exact for r in m.rows if r.exact is not None]
    exact_text = (f" Exact distances, computed for {len(exact)} of the laws: largest {_tv(max(exact))}."
                  if exact else "")
    c = m.certificate
    if c is None:
        text = (f"MEASURED  {m.scheme}: every position's law is within TV {_tv(m.bound)} of the target at {conf}; "
                f"the largest estimate is {_tv(best.tv.estimate)} ({where(best)}).{exact_text} "
                f"Give --tolerance EPS for a verdict.")
    elif c.verdict == "within":
        text = (f"WITHIN {c.tolerance:g}  {m.scheme}: every position's law is within TV {c.tolerance:g} of the "
                f"target at {conf}; the largest upper bound is {_tv(m.bound)} ({where(m.worst)}).{exact_text}")
    elif c.verdict == "beyond":
        r = m.positions[c.worst]
        text = (f"BEYOND {c.tolerance:g}  {m.scheme}: {where(r)} is at least TV {_tv(r.tv.lower)} from its target "
                f"(interval [{_tv(r.tv.lower)}, {_tv(r.tv.upper)}], estimate {_tv(r.tv.estimate)}) at {conf}."
                f"{exact_text}")
    else:
        r = m.positions[c.worst]
        need = m.sequences_needed()
        grow = (f"about {c.growth:.2g} times the sequences ({r.n:,} -> {need:,} for that law) would decide it"
                if need is not None else
                f"its estimate {_tv(r.tv.estimate)} is at or above the tolerance, so no budget would certify it")
        text = (f"UNDECIDED {c.tolerance:g}  {m.scheme}: no law is shown beyond TV {c.tolerance:g}, but {where(r)}'s "
                f"upper bound is {_tv(r.tv.upper)} (estimate {_tv(r.tv.estimate)}) at {conf}; {grow}.{exact_text}")
    staged = [r for r in m.rows if r.stage and r.tv.lower > 0]
    if staged:
        r = max(staged, key=lambda r: r.tv.lower)
        text += (f" Where it comes from: {where(r)} is at least TV {_tv(r.tv.lower)} from the law that stage must "
                 f"follow (estimate {_tv(r.tv.estimate)}).")
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="      "))


def sweep_table(points: list) -> str:
    """One row a setting: its tokens per round and its farthest position's distance."""
    width = max([24] + [len(p.scheme) for p in points])
    head = f"{'scheme':{width}s} {'tokens/round':>12s} {'TV estimate':>11s} {'interval':>17s} {'exact':>7s}"
    lines = [head, "-" * len(head)]
    for p in points:
        w = p.worst
        ex = None if p.exact is None else max(p.exact)
        interval = f"[{_tv(w.lower)}, {_tv(w.upper)}]"
        lines.append(f"{p.scheme:{width}s} {p.tokens_per_round:12.3f} {_tv(w.estimate):>11s} {interval:>17s} "
                     f"{_tv(ex):>7s}")
    return "\n".join(lines)
