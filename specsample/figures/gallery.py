"""Diagnostic figures: ``specsample figures --out DIR``.

Each figure is a function ``fig_*(scale, seed) -> matplotlib Figure`` computed from fresh
engine runs; the same seed gives the same data. ``scale`` multiplies every sample size
(1 for the committed set, small for tests). Matplotlib is imported here only, never by
the sampler core.
"""

from __future__ import annotations

import os
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats as sps  # noqa: E402

import stats  # noqa: E402

from ..engine import lanes as engine  # noqa: E402
from ..models.pairs import make_pair, make_pairs, replicate  # noqa: E402
from ..schemes import SCHEMES, StatefulStep, make_scheme  # noqa: E402
from .panels import BLUE, GREEN, GREY, RED, stage_panel  # noqa: E402
from .distortion import fig_distortion  # noqa: E402
from .trees import fig_trees  # noqa: E402

ALPHA = 0.01
_SMALL = dict(lanes=256, per_lane=8)


def _run(scheme, pair, n, seed, length=6, **kw):
    # schemes come from make_scheme, which builds each (name, k) once: a scheme built anew
    # would compile the engine anew
    return engine.run(scheme, pair.target, pair.draft, sequences=max(int(n), 1), length=length, seed=seed,
                      **{**_SMALL, **kw})


def resample_from_p_first_token(p, q):
    """Exact law of the first token under the resample-from-p bug: min(p, q) + (1 - alpha) p."""
    return np.minimum(p, q) + (1.0 - np.minimum(p, q).sum()) * p


def _wilson(k, n, conf=0.99):
    z = sps.norm.isf((1 - conf) / 2)
    phat = k / n
    centre = (phat + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z * np.sqrt(phat * (1 - phat) / n + z**2 / (4 * n**2)) / (1 + z**2 / n)
    return centre - half, centre + half


def fig_target_vs_observed(scale: float, seed: int):
    pair = make_pair("dirichlet", seed, 8)
    p = pair.target.table[0]
    n = int(2e5 * scale)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, name in zip(axes, ["standard", "control:resample-from-p"]):
        scheme = make_scheme(name, 4)
        c = _run(scheme, pair, n, seed).pair(0)
        obs = c.position[0]
        lo, hi = _wilson(obs, c.sequences)
        x = np.arange(p.size)
        ax.bar(x, p, color=GREY, alpha=0.5, label="target p")
        ax.errorbar(x, obs / c.sequences, yerr=[obs / c.sequences - lo, hi - obs / c.sequences], fmt="o",
                    color=BLUE if name == "standard" else RED, capsize=3, label="observed, 99% interval")
        r = stats.goodness_of_fit(obs, p)
        ax.set_title(f"{name}\nchi-square p = {r.pvalue:.2g} (N = {c.sequences:,})", fontsize=10)
        ax.set_xlabel("token id")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("probability of the first token")
    fig.suptitle("Target vs observed first-token law (Dirichlet pair, V = 8, k = 4)")
    return fig


def fig_calibration(scale: float, seed: int):
    reps = max(20, int(400 * scale))
    pair = replicate(make_pair("dirichlet", seed, 8), reps)
    c = _run(make_scheme("standard", 4), pair, 2000 * max(scale, 0.05), seed, length=2)
    joint = np.outer(pair.target.table[0, 0], pair.target.table[0, 0]).ravel()
    pv = np.array([stats.goodness_of_fit(c.joint[i], joint).pvalue for i in range(reps)])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.hist(pv, bins=20, range=(0, 1), color=BLUE, alpha=0.8, edgecolor="white")
    a.axhline(reps / 20, color=GREY, ls="--", label="Uniform(0, 1)")
    a.set_xlabel("p-value of the joint test (2 tokens, 64 cells)")
    a.set_ylabel("runs")
    a.legend()
    alarms = int(np.sum(pv < ALPHA))
    ci = stats.rejection_rate(alarms, reps, ALPHA)  # Clopper-Pearson 95% and binomial p of rate <= alpha
    a.set_title(f"{reps} honest runs: {alarms} below alpha = {ALPHA} (rate {ci.rate:.3f}, 95% CI "
                f"{ci.low:.3f}-{ci.high:.3f};\nbinomial p = {ci.pvalue:.2g} for rate <= alpha)", fontsize=9)
    q = np.sort(pv)
    b.plot((np.arange(reps) + 0.5) / reps, q, ".", color=BLUE, label="observed")
    b.plot([0, 1], [0, 1], color=GREY, ls="--", label="uniform")
    b.set_xlabel("uniform quantile")
    b.set_ylabel("p-value quantile")
    b.set_title(f"QQ against Uniform(0, 1); KS p = {stats.uniformity_test(pv).pvalue:.2f}", fontsize=10)
    b.legend()
    verdict = ("consistent with Uniform(0, 1)" if ci.pvalue >= ALPHA and stats.uniformity_test(pv).pvalue >= ALPHA
               else "NOT consistent with Uniform(0, 1)")
    few = f" (only {reps} runs: wide intervals)" if reps < 100 else ""
    fig.suptitle(f"Calibration of a correct sampler: p-values {verdict}{few}")
    return fig


def fig_kl(scale: float, seed: int):
    pair = make_pair("dirichlet", seed + 1, 8)
    p, q = pair.target.table[0], pair.draft.table[0]
    ns = np.unique(np.logspace(3, np.log10(max(2e3, 4e6 * scale)), 9).astype(int))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bug_law = resample_from_p_first_token(p, q)
    true_kl = float(np.sum(bug_law * np.log(bug_law / p)))
    for name, color in (("standard", BLUE), ("control:resample-from-p", RED)):
        scheme = make_scheme(name, 4)
        kls = [stats.kl_divergence(_run(scheme, pair, n, seed + i).pair(0).position[0], p).statistic
               for i, n in enumerate(ns)]
        ax.loglog(ns, kls, "o-", color=color, label=f"{name}: KL(empirical || p)")
    ax.loglog(ns, (np.count_nonzero(p) - 1) / (2 * ns), "--", color=GREY, label="null expectation (cells - 1) / 2N")
    ax.axhline(true_kl, color=RED, ls=":", label=f"control's exact KL = {true_kl:.2g} nats")
    ax.set_xlabel("samples N (sequences)")
    ax.set_ylabel("KL (nats)")
    ax.set_title("KL of the first token against samples (V = 8, k = 4)")
    ax.legend(fontsize=8)
    return fig


def fig_acceptance(scale: float, seed: int):
    n_pairs = max(16, int(128 * scale))
    fams = ["dirichlet-peaked", "dirichlet", "dirichlet-flat", "perturbed", "rare-accept", "mostly-below"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5))
    for fam, color in zip(fams, plt.cm.tab10.colors):
        pairs = make_pairs(fam, seed, max(2, n_pairs // len(fams)))
        c = _run(make_scheme("standard", 4), pairs, 4000 * max(scale, 0.1), seed, length=2)
        ps, qs = pairs.target.table[:, 0], pairs.draft.table[:, 0]
        alpha = stats.acceptance_probability(ps, qs)
        obs = c.draft_accepted.sum(1) / c.drafted.sum(1)
        a.plot(alpha, obs, "o", color=color, ms=4, label=fam)
        rates = np.array([stats.per_token_acceptance(p, q) for p, q in zip(ps, qs)])
        ok = c.drafted > 50
        b.plot(rates[ok], (c.draft_accepted / np.maximum(c.drafted, 1))[ok], ".", color=color, ms=3, alpha=0.6)
    a.plot([0, 1], [0, 1], color=GREY, ls="--", label="theory: 1 - TV(p, q)")
    a.set_xlabel("1 - TV(p, q)")
    a.set_ylabel("observed acceptance rate")
    a.set_title("Acceptance per pair", fontsize=10)
    a.legend(fontsize=7)
    b.plot([0, 1], [0, 1], color=GREY, ls="--")
    b.axvspan(0.99, 1.01, color=GREEN, alpha=0.1, label="p >= q: always accepted")
    b.axvspan(0, 0.1, color=RED, alpha=0.08, label="p << q: rarely accepted")
    b.set_xlabel("min(1, p(x) / q(x))")
    b.set_ylabel("observed P(accept | drafted x)")
    b.set_title("Acceptance per drafted token (tokens drafted > 50 times)", fontsize=10)
    b.legend(fontsize=7, loc="upper left")
    fig.suptitle("Acceptance against theory (standard scheme, k = 4)")
    return fig


def fig_tokens_per_round(scale: float, seed: int):
    pair = make_pair("dirichlet", seed + 2, 8)
    p, q = pair.target.table[0], pair.draft.table[0]
    k = 6
    c = _run(make_scheme("standard", k), pair, 1e5 * max(scale, 0.05), seed, length=2).pair(0)
    alpha = stats.acceptance_probability(p, q)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    j = np.arange(k + 1)
    a.bar(j, c.accepted / c.rounds, color=BLUE, alpha=0.7, label="observed")
    a.plot(j, stats.accepted_drafts_law(alpha, k), "o", color=RED, label="truncated geometric")
    a.set_xlabel("accepted drafts in a round")
    a.set_ylabel("fraction of rounds")
    a.set_title(f"alpha = {alpha:.3f}, k = {k}, {c.rounds:,} rounds", fontsize=10)
    a.legend()
    ks = np.arange(1, 13)
    for al, color in zip((0.6, 0.8, 0.9), (BLUE, GREEN, RED)):
        b.plot(ks, [stats.expected_tokens_per_round(al, int(x)) for x in ks], "-", color=color,
               label=f"tokens/round, alpha = {al}")
        for cst, ls in ((0.05, "--"), (0.2, ":")):
            b.plot(ks, [stats.walltime_improvement(al, int(x), cst) for x in ks], ls, color=color,
                   label=f"speed-up, alpha = {al}, c = {cst}")
    b.set_xlabel("draft length k")
    b.set_ylabel("tokens per round / wall-time improvement (x)")
    b.set_title("Theory (Leviathan et al. 2023, section 3)", fontsize=10)
    b.legend(fontsize=6, ncol=2)
    fig.suptitle("Tokens per round and expected speed-up")
    return fig


def fig_power(scale: float, seed: int):
    pair = make_pair("dirichlet-flat", seed + 3, 8)
    p, q = pair.target.table[0], pair.draft.table[0]
    law = resample_from_p_first_token(p, q)
    tv = 0.5 * np.abs(law - p).sum()
    reps = max(10, int(100 * scale))
    ns = np.unique(np.geomspace(max(200, 0.5 / tv**2 / 20), 6 / tv**2, 7).astype(int))
    batch = replicate(pair, reps)
    observed = []
    for i, n in enumerate(ns):
        c = _run(make_scheme("control:resample-from-p", 4), batch, n, seed + i, length=1, lanes=64, per_lane=1)
        observed.append(np.mean([stats.goodness_of_fit(c.position[r, 0], p).pvalue < ALPHA for r in range(reps)]))
        ns[i] = int(c.sequences[0])
    grid = np.geomspace(ns[0], ns[-1], 60)
    pred = [stats.chisquare_power(p, law, n, ALPHA).power for n in grid]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.semilogx(grid, pred, color=GREY, label="noncentral chi-square prediction")
    lo, hi = zip(*[sps.binomtest(int(round(o * reps)), reps).proportion_ci(0.95) for o in observed])
    ax.errorbar(ns, observed, yerr=[np.array(observed) - lo, np.array(hi) - observed], fmt="o", color=RED,
                capsize=3, label=f"observed over {reps} runs (95% interval)")
    ax.set_xlabel("samples N")
    ax.set_ylabel(f"detection rate at alpha = {ALPHA}")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"Power against control:resample-from-p (first-token TV = {tv:.3g})")
    ax.legend(fontsize=8)
    return fig


def fig_schemes(scale: float, seed: int):
    pairs = make_pairs("dirichlet", seed + 4, max(8, int(48 * scale)))
    alpha = stats.acceptance_probability(pairs.target.table[:, 0], pairs.draft.table[:, 0])
    order = np.argsort(alpha)
    k = 4
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    # greedy targets argmax p; schemes whose lanes carry KV caches run on transformers, not these tables
    sampling = {n: f for n, f in SCHEMES.items()
                if make_scheme(f, k).target_law is None and not isinstance(make_scheme(f, k).step, StatefulStep)}
    for (name, factory), marker in zip(sampling.items(), "osD^v<>"):
        c = _run(make_scheme(factory, k), pairs, 1000 * max(scale, 0.1), seed, length=2)
        tpr = (c.emitted * np.arange(c.emitted.shape[1])).sum(1) / c.rounds
        ax.plot(alpha[order], tpr[order], marker, ms=4, alpha=0.8, label=name)
    ax.plot(alpha[order], [stats.expected_tokens_per_round(a, k) for a in alpha[order]], "-", color=GREY, lw=1,
            label="standard theory (1 - alpha^(k+1)) / (1 - alpha)")
    ax.set_xlabel("alpha = 1 - TV(p, q)")
    ax.set_ylabel("tokens per round")
    ax.set_title(f"Lossless schemes on the same {len(alpha)} Dirichlet pairs (V = 8, k = {k})")
    ax.legend(fontsize=8, loc="upper left")
    return fig


def fig_greedy_vs_map(scale: float, seed: int):
    from .. import decode

    n = max(40, int(1000 * scale))
    settings = [(4, 1, 1.0), (4, 1, 0.3), (4, 2, 1.0), (8, 1, 1.0)]  # (V, order, Dirichlet concentration)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    frac = []
    for (v, m, conc), colour in zip(settings, [BLUE, GREEN, RED, GREY]):
        r = decode.greedy_vs_map(n, vocab=v, order=m, length=8, concentration=conc, seed=seed)
        frac.append(r.fraction_differ)
        gap = np.sort(np.log10(r.ratio[r.ratio < 1 - 1e-12]))
        label = f"V={v}, order {m}, Dir({conc:g}): greedy not MAP in {r.fraction_differ:.0%}"
        if gap.size:
            b.step(gap, np.arange(1, gap.size + 1) / n, where="post", color=colour, label=label)
    a.bar(range(len(settings)), frac, color=[BLUE, GREEN, RED, GREY], alpha=0.85)
    a.set_xticks(range(len(settings)), [f"V={v}\norder {m}\nDir({c:g})" for v, m, c in settings], fontsize=8)
    a.set_ylabel("fraction of models where greedy is not MAP")
    a.set_ylim(0, 1)
    a.set_title(f"{n} random n-gram models per setting, T = 8", fontsize=10)
    b.set_xlabel("log10 p(greedy) / p(MAP)   (0: greedy found the MAP)")
    b.set_ylabel("fraction of models with a ratio at most x")
    b.set_title("How much probability greedy gives away", fontsize=10)
    b.legend(fontsize=7, loc="upper left")
    fig.suptitle("Greedy decoding is not MAP decoding (exact MAP by dynamic programming)")
    return fig


def fig_decode_scaling(scale: float, seed: int):
    from .. import decode

    res = decode.scaling(repeats=3 if scale >= 0.5 else 1, small=scale < 0.5)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (name, s), colour in zip(res.items(), [BLUE, GREEN, RED, GREY, "#9467bd"]):
        pts = s["points"]
        t = [p["seconds"] for p in pts]
        if s["axis"] == "base":
            b.semilogy([p["length"] for p in pts], t, "o-", color=colour, label=f"{name}: ~ {s['fit']:.2f}^T")
        else:
            x = [p["length"] if s["axis"] == "T" else p["vocab"] for p in pts]
            a.loglog(x, t, "o-", color=colour, label=f"{name}: ~ {s['axis']}^{s['fit']:.2f}")
    a.set_xlabel("T or V (log)")
    a.set_ylabel("seconds (best of runs)")
    a.set_title("DP MAP: linear in T, V^(m+1) in V", fontsize=10)
    a.legend(fontsize=8)
    b.set_xlabel("T")
    b.set_ylabel("seconds (log)")
    b.set_title("Brute-force MAP: exponential in T", fontsize=10)
    b.legend(fontsize=8)
    fig.suptitle("Cost of exact MAP decoding (numpy, this machine)")
    return fig


def fig_kv_cache(scale: float, seed: int):
    from ..models import transformer as tr

    model = tr.Transformer.create(seed, vocab=16, width=32, layers=2, heads=2, max_len=160)
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.3))
    ks = np.arange(1, 33)
    small = scale < 0.5  # a test's budget: fewer measured points (each new length compiles a pass)
    for T, colour in zip((1, 4, 16), (BLUE, GREEN, RED)):
        a.plot(ks, [tr.n_naive(T, k) for k in ks], "-", color=colour, lw=1, label=f"T = {T}: kT + k(k-1)/2")
        a.plot(ks, [tr.n_cached(T, k) for k in ks], "--", color=colour, lw=1, label=f"T = {T}: T + k - 1")
        measured = ((1, 2, 4) if T < 16 else ()) if small else (1, 2, 4, 8, 16, 32)
        prompt = np.arange(T) % 16
        a.plot(measured, [tr.generate_naive(model, prompt, k).keys_per_layer for k in measured], "o", color=colour,
               ms=5)
        a.plot(measured, [tr.generate_cached(model, prompt, k).keys_per_layer for k in measured], "s", color=colour,
               ms=5, mfc="white")
        b.plot(ks, [tr.n_naive(T, k) / tr.n_cached(T, k) for k in ks], "-", color=colour, label=f"T = {T}")
    b.plot(ks, ks / 2, ":", color=GREY, label="k / 2 (k >> T)")
    a.set_xlabel("k generated tokens")
    a.set_ylabel("key projections W_K h_t per layer")
    a.set_title("Measured (markers: o naive, s cached) on the closed forms", fontsize=10)
    a.legend(fontsize=7, ncol=2)
    b.set_xlabel("k")
    b.set_ylabel("N_naive / N_cached")
    b.set_title("What a KV cache saves", fontsize=10)
    b.legend(fontsize=8)
    steps = (2, 4) if small else (4, 16, 64)
    for T, colour in zip((8,) if small else (8, 64), (BLUE, RED)):
        times = [tr.time_generation(model, T, k, repeats=1 if small else 3) for k in steps]
        c.plot(steps, [1e3 * t["naive_s_per_token"] for t in times], "o-", color=colour, label=f"naive, T = {T}")
        c.plot(steps, [1e3 * t["cached_s_per_token"] for t in times], "s--", color=colour, mfc="white",
               label=f"cached, T = {T}")
    c.set_xscale("log")
    c.set_yscale("linear")
    c.set_xticks(steps, [str(x) for x in steps])
    c.minorticks_off()
    c.set_ylim(bottom=0)
    c.set_xlabel("k generated tokens (the cached loop's prefill is spread over them)")
    c.set_ylabel("ms per generated token (this machine)")
    c.set_title("Time per token, greedy generation", fontsize=10)
    c.legend(fontsize=8)
    fig.suptitle("KV cache: key computations counted, naive against cached (2-layer transformer, V = 16)")
    return fig


def fig_transformer_pair(scale: float, seed: int):
    from ..laws import exact
    from ..models.pairs import neural_pair

    pair = neural_pair("transformer-close", seed, 8, prompt_len=3)
    k, L = 4, 5
    n = max(2048, int(1.5e5 * scale))
    p_rows, q_rows = exact.prefix_rows(pair.target, pair.prompt, L), exact.prefix_rows(pair.draft, pair.prompt, L)
    marg = exact.marginals_from_rows(p_rows)
    law = exact.standard_rounds_law(p_rows, q_rows, k)
    kw = dict(sequences=n, length=L, seed=seed, lanes=256, per_lane=4, prompt=pair.prompt)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    x = np.arange(8)
    axes[0].bar(x, marg[2], color=GREY, alpha=0.5, label="exact p (enumeration)")
    runs = {}
    for name, colour, dx in (("cached", BLUE, -0.15), ("control:target-cache-not-rolled-back", RED, 0.15)):
        c = engine.run(make_scheme(name, k), pair.target, pair.draft, **kw).pair(0)
        runs[name] = c
        obs = c.position[2]
        lo, hi = _wilson(obs, c.sequences)
        r = stats.goodness_of_fit(obs, marg[2])
        axes[0].errorbar(x + dx, obs / c.sequences, yerr=[obs / c.sequences - lo, hi - obs / c.sequences], fmt="o",
                         color=colour, capsize=2, ms=4, label=f"{name.split(':')[-1]} (p = {r.pvalue:.2g})")
    axes[0].set_xlabel("token id")
    axes[0].set_ylabel("probability of the third token")
    axes[0].set_title(f"Target vs observed (N = {n:,} sequences each)", fontsize=10)
    axes[0].legend(fontsize=7)
    rounds = np.arange(1, L + 1)
    axes[1].bar(rounds, law[1:], color=GREY, alpha=0.5, label="exact law, standard rule")
    names = ("cached", "control:draft-cache-not-rolled-back", "control:last-token-not-in-draft-cache")
    for name, colour, dx in zip(names, (BLUE, RED, "#ff7f0e"), (-0.2, 0.0, 0.2)):
        c = runs.get(name) or engine.run(make_scheme(name, k), pair.target, pair.draft, **kw).pair(0)
        runs[name] = c
        r = stats.goodness_of_fit(c.rounds_per_sequence, law, min_expected=100)
        axes[1].plot(rounds + dx, c.rounds_per_sequence[1:] / c.sequences, "o", color=colour, ms=5,
                     label=f"{name.split(':')[-1]} (p = {r.pvalue:.2g})")
    axes[1].set_xlabel(f"rounds to emit the first {L} tokens")
    axes[1].set_ylabel("fraction of sequences")
    axes[1].set_title("Rounds per sequence: draft-side cache bugs", fontsize=10)
    axes[1].legend(fontsize=7)
    alphas = exact.acceptance_from_rows(p_rows, q_rows)
    labels = [n.split(":")[-1] for n in names]
    obs = [runs[n].draft_accepted.sum() / runs[n].drafted.sum() for n in names]
    axes[2].bar(np.arange(len(names)), obs, color=[BLUE, RED, "#ff7f0e"], alpha=0.8)
    axes[2].axhline(np.mean(alphas), color=GREY, ls="--", label=f"mean alpha over positions = {np.mean(alphas):.3f}")
    axes[2].set_xticks(np.arange(len(names)), labels, fontsize=7, rotation=10)
    axes[2].set_ylabel("accepted drafts per tested draft")
    axes[2].set_ylim(0, 1)
    axes[2].set_title("Acceptance: the output law is intact, acceptance drops", fontsize=10)
    axes[2].legend(fontsize=8, loc="lower left")
    fig.suptitle(f"A transformer pair with KV caches (V = 8, width 32, 2 layers, close draft, k = {k}, prompt 3)")
    return fig


def fig_stages(scale: float, seed: int):
    """The stage diagnosis: each stage's observed law (or acceptance rate) against its own, per scheme."""
    from ..battery import diagnosis, stages

    pair = make_pair("dirichlet", seed, 8)
    names = ["standard", "control:draft-temperature", "control:shared-uniform", "control:resample-from-p",
             "control:bonus-from-q"]
    n = max(4096, int((1 << 15) * scale))
    fig, axes = plt.subplots(len(names), len(diagnosis.STAGES), figsize=(13, 2.1 * len(names)))
    level = ALPHA / (len(names) * len(diagnosis.STAGES))
    for row, name in enumerate(names):
        _, res = stages.table_stage_tests(make_scheme(name, 4), pair.target, pair.draft, n, seed)
        by = {r.stage: r for r in res}
        for col, stage in enumerate(diagnosis.STAGES):
            ax = axes[row, col]
            r = by.get(stage)
            if r is None or r.observed is None:
                ax.set_axis_off()
                continue
            stage_panel(ax, r, r.pvalue < level)
            if col == 0:
                ax.set_ylabel(name.replace("control:", ""), fontsize=8)
    fig.suptitle(f"Each stage of the round against its own law (grey: the law; dots: observed; Dirichlet pair "
                 f"V = 8, k = 4, {n:,} rounds; red: rejected at 0.01 / 20)", fontsize=10)
    return fig


FIGURES: dict[str, Callable] = {
    "target_vs_observed": fig_target_vs_observed,
    "calibration": fig_calibration,
    "kl_vs_samples": fig_kl,
    "acceptance": fig_acceptance,
    "tokens_per_round": fig_tokens_per_round,
    "power": fig_power,
    "schemes": fig_schemes,
    "greedy_vs_map": fig_greedy_vs_map,
    "decode_scaling": fig_decode_scaling,
    "kv_cache": fig_kv_cache,
    "transformer_pair": fig_transformer_pair,
    "stages": fig_stages,
    "trees": fig_trees,
    "distortion": fig_distortion,
}
SCALES = {"quick": 0.05, "default": 1.0, "thorough": 4.0, "certify": 2.0}


def check_names(only) -> None:
    """Refuse unknown figure names (or an empty selection) before any work."""
    if only is None:
        return
    unknown = [n for n in only if n not in FIGURES]
    if unknown or not only:
        what = f"unknown figure {', '.join(map(repr, unknown))}" if unknown else "no figure named"
        raise ValueError(f"{what}; choose from {', '.join(FIGURES)}")


def render_all(out: str, budget="default", seed: int = 0, only=None, progress=None) -> list:
    """Write every figure (or those named in ``only``) as ``out/<name>.png``; returns the paths.

    ``progress(done, total, name)`` is called before each figure.
    """
    check_names(only)
    scale = SCALES.get(budget) if isinstance(budget, str) else None
    if scale is None:
        try:
            scale = float(budget)
        except (TypeError, ValueError):
            raise ValueError(f"unknown budget {budget!r}; use quick, default, thorough or a scale factor") from None
    os.makedirs(out, exist_ok=True)
    paths = []
    chosen = [n for n in FIGURES if not only or n in only]
    for i, name in enumerate(chosen):
        fn = FIGURES[name]
        if progress:
            progress(i, len(chosen), name)
        fig = fn(scale, seed)
        fig.tight_layout()
        path = os.path.join(out, f"{name}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
