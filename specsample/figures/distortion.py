"""How far from lossless, drawn: a run's distances with their intervals, and distortion against speed.

``distance_figure`` draws one measurement (each case's farthest position law: estimate, simultaneous
interval and exact value); ``sweep_figure`` draws lossy rules as their threshold moves (the TV of the
farthest position against tokens per round, one curve per rule, the lossless rule at TV 0 for
reference). ``write_html`` puts either on one offline page with its table: ``specsample measure
--html``. ``fig_distortion`` is ``specsample figures``' entry.
"""

from __future__ import annotations

import html
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..measure import text  # noqa: E402
from ..measure.distances import Measurement  # noqa: E402
from ..measure.sweep import FIGURE_SWEEPS, settings, sweep  # noqa: E402
from .html import _CSS, _svg  # noqa: E402
from .panels import BLUE, GREEN, GREY, RED  # noqa: E402

RULE_COLOURS = {"relaxed": BLUE, "typical": RED}


def distance_figure(m: Measurement):
    """Each case's farthest position law: estimate (dot), interval (bar), exact value (cross)."""
    by_case: dict = {}
    for r in m.rows:
        if r.case not in by_case or r.tv.upper > by_case[r.case].tv.upper:
            by_case[r.case] = r
    rows = list(by_case.values())
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.22 * len(rows) + 1)))
    y = np.arange(len(rows))
    est = np.array([r.tv.estimate for r in rows])
    lo = np.array([r.tv.lower for r in rows])
    hi = np.array([r.tv.upper for r in rows])
    ax.errorbar(np.nan_to_num(est), y, xerr=[np.maximum(0, np.nan_to_num(est) - lo), np.maximum(0, hi - np.nan_to_num(est))],
                fmt="o", ms=3, color=BLUE, ecolor=GREY, capsize=2, label="estimate, simultaneous interval")
    ex = [(r.exact, i) for i, r in enumerate(rows) if r.exact is not None]
    if ex:
        ax.plot([e for e, _ in ex], [i for _, i in ex], "x", color=RED, ms=5, label="exact")
    if m.certificate is not None:
        ax.axvline(m.certificate.tolerance, color=GREEN, ls="--", lw=1, label=f"tolerance {m.certificate.tolerance:g}")
    ax.set_yticks(y)
    ax.set_yticklabels([f"{r.case} {r.law}" for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("TV of the position's law from the target")
    ax.set_title(f"{m.scheme}: distance from lossless ({100 * m.confidence:g}% simultaneous)", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_xlim(left=0)
    return fig


def sweep_figure(curves: dict, title: str = ""):
    """``curves``: rule name -> [SweepPoint] (a reference point has value NaN). TV of the farthest
    position (interval bars; exact as a line where known) against tokens per round."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for rule, points in curves.items():
        ref = [p for p in points if not math.isfinite(p.value)]
        pts = [p for p in points if math.isfinite(p.value)]
        for p in ref:
            w = p.worst
            ax.errorbar([p.tokens_per_round], [max(0.0, w.estimate)], yerr=[[max(0.0, w.estimate) - w.lower],
                        [w.upper - max(0.0, w.estimate)]], fmt="*", ms=10, color=GREEN, capsize=3,
                        label=f"{p.scheme} (lossless)")
        if not pts:
            continue
        colour = RULE_COLOURS.get(rule, GREY)
        x = [p.tokens_per_round for p in pts]
        est = [max(0.0, p.worst.estimate) for p in pts]
        ax.errorbar(x, est, yerr=[[e - p.worst.lower for e, p in zip(est, pts)], [p.worst.upper - e for e, p in zip(est, pts)]],
                    fmt="o", color=colour, capsize=3, label=f"{rule}: estimate and interval")
        if all(p.exact is not None for p in pts):
            ax.plot(x, [max(p.exact) for p in pts], "-", color=colour, lw=1, alpha=0.6, label=f"{rule}: exact")
        labels: dict = {}  # settings that land on one point (the same accepted tokens) share a label
        for p, xi, yi in zip(pts, x, est):
            labels.setdefault((round(xi, 3), round(yi, 3)), []).append(f"{p.value:g}")
        for (xi, yi), names in labels.items():
            ax.annotate(", ".join(names), (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7, color=colour)
    ax.axhline(0, color=GREY, lw=0.8)
    ax.set_xlabel("tokens per round (speed)")
    ax.set_ylabel("TV from the target (farthest position)")
    ax.set_title(title or "Distortion against speed as the threshold moves", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def fig_distortion(scale: float, seed: int):
    """``specsample figures``: both lossy rules on dirichlet/V8/k4, thresholds as :data:`FIGURE_SWEEPS`."""
    budget = max(4096, int((1 << 17) * scale))
    curves = {}
    for i, (rule, (keys, values)) in enumerate(FIGURE_SWEEPS.items()):
        points = list(zip(values, settings(rule, keys, values)))
        curves[rule] = sweep(points, budget=budget, seed=seed, reference="standard" if i == 0 else None)
    return sweep_figure(curves, "Lossy rules on dirichlet/V8/k4: distortion against speed (labels: threshold)")


def _page(title: str, kind: str, headline: str, command: str, figure, table: str) -> str:
    body = [f'<header class="{kind}" id="verdict"><h1>{html.escape(title)}</h1><p>{html.escape(headline)}</p></header>',
            "<main>", f'<div class="meta"><code>{html.escape(command)}</code></div>' if command else "",
            f"<h2>Distances</h2>{_svg(figure)}", f"<h2>Table</h2><pre>{html.escape(table)}</pre>", "</main>"]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>specsample measure: {html.escape(title)}</title>"
            f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><style>{_CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")


def write_html(m: Measurement, path: str, command: str = "") -> str:
    """One offline page for a measurement: headline, the distance figure and the table."""
    verdict = m.certificate.verdict if m.certificate else "measured"
    kind = {"within": "pass", "beyond": "fail", "undecided": "unreached", "measured": "pass"}[verdict]
    head = text.headline(m, width=100_000)
    with open(path, "w", encoding="utf-8") as f:
        f.write(_page(head.split("  ", 1)[0], kind, head.split("  ", 1)[-1], command, distance_figure(m), text.table(m)))
    return path


def write_sweep_html(rule: str, points: list, table: str, path: str, command: str = "") -> str:
    """One offline page for a sweep: the distortion-against-speed figure and the table."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(_page(f"sweep of {rule}", "pass", f"{rule}: distortion against tokens per round", command,
                      sweep_figure({rule: points}), table))
    return path
