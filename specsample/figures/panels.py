"""Panels drawn on a given matplotlib axis, shared by the gallery and the HTML report."""

from __future__ import annotations

import numpy as np

BLUE, RED, GREY, GREEN = "#1f77b4", "#d62728", "#7f7f7f", "#2ca02c"


def stage_panel(ax, r, rejected: bool, limit: int = 0) -> None:
    """One stage of the round (a :class:`~specsample.battery.diagnosis.StageResult`) against its own
    law: grey bars the law (or min(1, p/q) for acceptance), dots what was observed, red if rejected.
    With ``limit``, a law over more tokens shows only the ``limit`` tokens furthest off."""
    colour = RED if rejected else BLUE
    if r.stage == "acceptance":
        ax.bar([0, 1], [r.expected[0], r.observed[0]], color=[GREY, colour], alpha=0.8)
        ax.errorbar([1], r.observed[:1], yerr=[2 * r.error], fmt="none", color="black", capsize=3)
        ax.set_xticks([0, 1], ["min(1, p/q)", "observed"], fontsize=7)
        ax.set_ylim(0, 1)
        what = f"rate {r.estimate:+.3f}" + ("" if r.slot is None else f" at position {r.slot}")
    else:
        tokens = np.arange(r.expected.size)
        if limit and tokens.size > limit:
            tokens = np.sort(np.argsort(-np.abs(r.observed - r.expected))[:limit])
        x = np.arange(tokens.size)
        ax.bar(x, r.expected[tokens], color=GREY, alpha=0.5)
        ax.plot(x, r.observed[tokens], "o", color=colour, ms=4)
        ax.set_xticks(x, [str(t) for t in tokens] if x.size <= 16 else [""] * x.size, fontsize=6)
        what = f"TV {r.estimate:.3f}" + ("" if r.slot is None else f" at position {r.slot}")
    ax.set_title(f"{r.stage}: p = {r.pvalue:.1e}\n{what}", fontsize=8, color=colour)
    ax.tick_params(labelsize=6)
