"""A verification run as one self-contained HTML page: ``specsample verify ... --html PATH``.

The page works offline (figures are inline SVG, the table's sorting a few lines of inline
script, no fonts or scripts fetched): the verdict and headline first; then, for each failing
case, its rejected tests and first hard-check violation, which tokens are over- or
under-represented at which position (observed against expected counts and standardised
residuals), and the stage panel where the case ran a stage pass; then the sortable per-case
table; last, the run's p-values (uniform on a healthy run) and each case's min detectable TV.

Examples
--------
>>> import specsample
>>> from specsample.figures.html import write_html
>>> report = specsample.verify("standard", budget="quick", cases="V8/k4")  # doctest: +SKIP
>>> write_html(report, "run.html")  # doctest: +SKIP
"""

from __future__ import annotations

import html
import io
import math
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats as sps  # noqa: E402

from ..battery.report import Report, _fmt_p, versions  # noqa: E402
from .panels import BLUE, GREEN, GREY, RED, stage_panel  # noqa: E402

MAX_TOKENS = 48  # a position panel shows every token up to this V, else the tokens furthest off
MAX_POSITIONS = 4  # position panels per failing case: rejected ones first, then the smallest p
MAX_FAILING = 12  # failing cases drawn in full; the rest are in the table


def _svg(fig) -> str:
    """The figure as an inline ``<svg>`` element (text kept as text: small and searchable)."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "specsample"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _position_figure(case) -> str:
    """Observed against expected counts of the token at each chosen position, and the residuals."""
    laws = [t for t in case.tests if t.law is not None]
    if not laws:
        return ""
    rejected = [t for t in laws if t.rejected]  # the first rejected positions, else the smallest p-values
    laws = rejected[:MAX_POSITIONS] or sorted(laws, key=lambda t: t.pvalue if np.isfinite(t.pvalue) else 1.0)
    laws = sorted(laws[:MAX_POSITIONS], key=lambda t: int(re.sub(r"\D", "", t.name) or 0))
    fig, axes = plt.subplots(2, len(laws), figsize=(3.6 * len(laws) + 0.6, 4.6), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2]})
    for col, t in enumerate(laws):
        obs, p = np.atleast_2d(np.asarray(t.law[0], np.float64)), np.atleast_2d(np.asarray(t.law[1], np.float64))
        exp = obs.sum(axis=-1, keepdims=True) * p  # a law given contexts (rows): each row's count times its law
        names = [str(j) for j in range(p.shape[1])] if p.shape[0] == 1 else \
            [f"{c}:{j}" for c in range(p.shape[0]) for j in range(p.shape[1])]  # context:token
        obs, p, exp = obs.ravel(), p.ravel(), exp.ravel()
        sd = np.sqrt(np.maximum(exp * (1 - p), 1e-300))
        z = np.where(p > 0, (obs - exp) / sd, np.where(obs > 0, np.inf, 0.0))
        tokens = np.arange(p.size)
        if p.size > MAX_TOKENS:  # the cells furthest off, in order
            tokens = np.sort(np.argsort(-np.abs(np.nan_to_num(z, posinf=1e300)))[:MAX_TOKENS])
        x = np.arange(tokens.size)
        colour = RED if t.rejected else BLUE
        top, bottom = axes[0, col], axes[1, col]
        top.bar(x, exp[tokens], color=GREY, alpha=0.45, label="expected n p")
        top.errorbar(x, exp[tokens], yerr=2 * sd[tokens] * (p[tokens] > 0), fmt="none", color=GREY, lw=0.8)
        top.plot(x, obs[tokens], "o", color=colour, ms=3.5, label="observed")
        adj = "" if not np.isfinite(t.adjusted) else f", adj p = {_fmt_p(t.adjusted)}"
        top.set_title(f"{t.name}: p = {_fmt_p(t.pvalue)}{adj}", fontsize=9, color=colour)
        zc = np.clip(np.nan_to_num(z[tokens], posinf=9.0, neginf=-9.0), -9, 9)
        bottom.bar(x, zc, color=np.where(np.abs(zc) >= 3, RED, GREY))
        for level in (-3, 3):
            bottom.axhline(level, color=RED, lw=0.6, ls=":")
        bottom.set_ylabel("z" if col == 0 else "", fontsize=8)
        labels = [names[v] if tokens.size <= 24 or i % 4 == 0 else "" for i, v in enumerate(tokens)]
        crowded = tokens.size > 24 or (tokens.size > 8 and max(map(len, labels)) > 2)
        bottom.set_xticks(x, labels, fontsize=6, rotation=90 if crowded else 0)
        top.set_xticks(x, [""] * x.size)
        for ax in (top, bottom):
            ax.tick_params(labelsize=7)
        if col == 0:
            top.set_ylabel("count", fontsize=8)
            top.legend(fontsize=7, frameon=False)
    note = "" if all(np.asarray(t.law[1]).size <= MAX_TOKENS for t in laws) else \
        f" (over {MAX_TOKENS} cells: the {MAX_TOKENS} furthest off)"
    if any(np.ndim(t.law[1]) == 2 for t in laws):
        note += "; a law given contexts labels its cells context:token (or context:outcome)"
    return (f'<p class="cap">Which tokens are over- or under-represented: observed against expected counts '
            f'(bars: n p, whiskers +-2 sd), and standardised residuals z (dotted: |z| = 3){note}.</p>' + _svg(fig))


def _stage_figure(case) -> str:
    """The case's stage pass: each stage of the round against its own law."""
    drawn = [r for r in case.stages if r.observed is not None and r.expected is not None]
    if not drawn:
        return ""
    rejected = set(case.rejected_stages)
    fig, axes = plt.subplots(1, len(drawn), figsize=(2.7 * len(drawn) + 0.4, 2.5), squeeze=False)
    for ax, r in zip(axes[0], drawn):
        stage_panel(ax, r, r.stage in rejected, limit=MAX_TOKENS)
    return ('<p class="cap">Each stage of the round against its own law (grey: the law; dots: observed; '
            'red: rejected).</p>' + _svg(fig))


def _run_figure(report: Report) -> str:
    """The p-values of every soft test (uniform on a healthy run), and each case's min detectable TV."""
    pv = np.array([t.pvalue for c in report.cases for t in c.tests if not t.hard and np.isfinite(t.pvalue)])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, max(3.0, min(9.0, 0.16 * len(report.cases) + 1.2))))
    if pv.size:
        bins = 20
        left.hist(pv, bins=bins, range=(0, 1), color=BLUE, alpha=0.75, edgecolor="white")
        mean = pv.size / bins
        band = 2 * math.sqrt(mean * (1 - 1 / bins))
        left.axhspan(max(0.0, mean - band), mean + band, color=GREY, alpha=0.2, lw=0)
        left.axhline(mean, color=GREY, lw=1)
        ks = sps.kstest(pv, "uniform")
        left.set_title(f"p-values of {pv.size} tests (grey: uniform, +-2 sd)\nKS against uniform: "
                       f"p = {_fmt_p(ks.pvalue)} (discrete tests lean right: a guide, not a test)", fontsize=9)
    left.set_xlabel("raw p-value", fontsize=8)
    tv = [(c.min_detectable_tv, c.name, c.verdict) for c in report.cases if np.isfinite(c.min_detectable_tv)]
    if tv:
        tv.sort()
        y = np.arange(len(tv))
        colours = [RED if v == "FAIL" else (GREY if v != "pass" else GREEN) for _, _, v in tv]
        right.scatter([v for v, _, _ in tv], y, c=colours, s=14)
        right.set_xscale("log")
        right.set_yticks(y, [n for _, n, _ in tv], fontsize=6 if len(tv) > 30 else 7)
        right.set_title(f"min detectable TV per case (power {report.power:g})", fontsize=9)
        right.grid(axis="x", alpha=0.3)
    else:
        right.set_axis_off()
    for ax in (left, right):
        ax.tick_params(labelsize=7)
    return _svg(fig)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1b1f24;background:#fafafa}
main{max-width:1180px;margin:0 auto;padding:0 20px 40px}
header{padding:18px 20px;color:#fff}header.pass{background:#1a7f37}header.fail{background:#b42318}
header.unreached{background:#9a6700}header h1{margin:0 0 6px;font-size:26px}header p{margin:0;max-width:1100px}
.meta{color:#57606a;font-size:12px;margin:10px 0 18px}h2{margin:28px 0 10px;font-size:19px}
section.case{background:#fff;border:1px solid #d0d7de;border-left:5px solid #b42318;border-radius:6px;
padding:10px 16px;margin:14px 0}section.case h3{margin:4px 0 8px}
.violation{background:#fff1f0;border:1px solid #ffccc7;padding:6px 10px;border-radius:4px;font-family:monospace}
table{border-collapse:collapse;width:100%;font-size:12.5px;background:#fff}
th,td{padding:4px 8px;border-bottom:1px solid #eaeef2;text-align:left;white-space:nowrap}
th{background:#f6f8fa;position:sticky;top:0}#cases th{cursor:pointer;user-select:none}
#cases th:after{content:" \\2195";color:#8c959f}tr.FAIL td{background:#fff1f0}tr.unreached td{background:#fff8c5}
td.v-FAIL{color:#b42318;font-weight:600}td.v-pass{color:#1a7f37}svg{max-width:100%;height:auto}
.diag{white-space:pre-wrap}.cap{color:#57606a;font-size:12.5px;margin:12px 0 2px}code{background:#f6f8fa;padding:1px 4px;border-radius:3px}
"""

_JS = """
window.__errors=[];window.addEventListener('error',function(e){window.__errors.push(String(e.message));
document.body.setAttribute('data-errors',window.__errors.join(' | '));});
(function(){var t=document.getElementById('cases');if(!t)return;var hs=t.tHead.rows[0].cells;
for(var i=0;i<hs.length;i++){(function(col){hs[col].addEventListener('click',function(){
var rows=Array.prototype.slice.call(t.tBodies[0].rows);var dir=hs[col].getAttribute('data-dir')==='asc'?-1:1;
rows.sort(function(a,b){var x=a.cells[col].getAttribute('data-v'),y=b.cells[col].getAttribute('data-v');
var nx=parseFloat(x),ny=parseFloat(y);if(!isNaN(nx)&&!isNaN(ny))return dir*(nx-ny);
return dir*String(x).localeCompare(String(y));});
rows.forEach(function(r){t.tBodies[0].appendChild(r);});hs[col].setAttribute('data-dir',dir===1?'asc':'desc');
});})(i);}document.body.setAttribute('data-ready','1');})();
"""


def _cell(text, sort=None, cls="") -> str:
    key = text if sort is None else sort
    if isinstance(key, float) and not np.isfinite(key):
        key = 1e300
    c = f' class="{cls}"' if cls else ""
    return f'<td data-v="{html.escape(str(key))}"{c}>{html.escape(str(text))}</td>'


def _anchor(name: str) -> str:
    return "case-" + re.sub(r"[^A-Za-z0-9_-]+", "-", name)


def _case_table(report: Report) -> str:
    head = ["case", "model", "V", "k", "rounds", "worst test", "p", "adj p", "min TV", "KL", "acceptance",
            "seconds", "verdict"]
    rows = []
    for c in report.cases:
        w = c.worst
        name = html.escape(c.name)
        link = f'<a href="#{_anchor(c.name)}">{name}</a>' if not c.passed else name
        verdict = {"not reached": "unreached", "pass°": "unreached"}.get(c.verdict, c.verdict)
        p = w.pvalue if w else float("nan")
        adj = (w.pvalue if w.hard else w.adjusted) if w else float("nan")
        acc = "-" if math.isnan(c.acceptance_observed) else f"{c.acceptance_observed:.4f}"
        rows.append(
            f'<tr class="{verdict}"><td data-v="{name}">{link}</td>' + _cell(c.model) + _cell(c.vocab, c.vocab)
            + _cell(c.k, c.k) + _cell("-" if c.rounds <= 0 else f"{c.rounds:.3g}", float(c.rounds))
            + _cell("-" if w is None else w.name) + _cell(_fmt_p(p), float(p)) + _cell(_fmt_p(adj), float(adj))
            + _cell("n/a" if math.isnan(c.min_detectable_tv) else f"{c.min_detectable_tv:.1e}",
                    float(c.min_detectable_tv)) + _cell("-" if math.isnan(c.kl) else f"{c.kl:.1e}", float(c.kl))
            + _cell(acc, float(c.acceptance_observed))
            + _cell(f"{c.seconds:.1f}" if c.seconds else "-", float(c.seconds))
            + _cell(c.verdict, cls=f"v-{c.verdict}") + "</tr>")
    return ('<table id="cases"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "\n".join(rows) + "</tbody></table>")


def _tests_table(tests) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(t.name)}</td><td>{'hard' if t.hard else 'soft'}</td><td>{t.statistic:.4g}</td>"
        f"<td>{t.dof}</td><td>{_fmt_p(t.pvalue)}</td><td>{_fmt_p(t.adjusted)}</td>"
        f"<td style='white-space:normal'>{html.escape(t.detail)}</td></tr>" for t in tests)
    return ("<table><thead><tr><th>test</th><th>kind</th><th>statistic</th><th>dof</th><th>p</th><th>adj p</th>"
            f"<th>detail</th></tr></thead><tbody>{rows}</tbody></table>")


def _failing_case(c) -> str:
    rejected = [t for t in c.tests if t.rejected]
    hard = [t for t in rejected if t.hard]
    parts = [f'<section class="case" id="{_anchor(c.name)}"><h3>{html.escape(c.name)}: FAIL</h3>',
             f'<div class="meta">{html.escape(c.family)} / {html.escape(c.model)}, '
             f'{f"V = {c.vocab}, " if c.vocab > 0 else ""}k = {c.k}, '
             f'{c.sequences:,} sequences, {c.rounds:,} rounds</div>']
    if hard:  # the first hard-check violation, as the check itself words it (draw site, forced value, token)
        parts.append(f'<p><b>First hard-check violation</b> ({html.escape(hard[0].name)}):</p>'
                     f'<div class="violation">{html.escape(hard[0].detail)}</div>')
    if c.diagnosis:
        parts.append(f'<p><b>Diagnosis:</b> {html.escape(c.diagnosis)}</p>')
    parts.append("<p><b>Rejected tests</b></p>" + _tests_table(rejected))
    parts += [_position_figure(c), _stage_figure(c), "</section>"]
    return "\n".join(p for p in parts if p)


def render(report: Report, command: str = "") -> str:
    """The report as a self-contained HTML document (a string).

    Parameters
    ----------
    report : Report
        What :func:`specsample.verify` (or a host, tree or end-to-end run) returned.
    command : str, optional
        The command line that made it, shown under the headline.
    """
    unreached = report.passed and any(c.not_reached or c.boundary_unreached for c in report.cases)
    kind = "fail" if not report.passed else ("unreached" if unreached else "pass")
    title = "FAIL" if not report.passed else ("PASS (some checks not reached)" if unreached else "PASS")
    headline = report.headline(width=100_000).split("  ", 1)[-1]
    used = ", ".join(f"{k} {v}" for k, v in versions().items())
    meta = (f"scheme {html.escape(report.scheme)} · budget {html.escape(str(report.budget))} · seed {report.seed} · "
            f"alpha {report.alpha:g} · power {report.power:g} · {report.seconds:.1f} s · {html.escape(used)}")
    failing = report.failed_cases
    body = [f'<header class="{kind}" id="verdict"><h1>{title}</h1><p>{html.escape(headline)}</p></header><main>',
            f'<div class="meta">{meta}' + (f'<br><code>{html.escape(command)}</code>' if command else "") + "</div>"]
    diag = report.diagnosis(width=100_000, cases=MAX_FAILING)
    if diag:
        body.append(f'<h2>Diagnosis</h2><div class="diag">{html.escape(diag)}</div>')
    if failing:
        body.append(f"<h2>Failing cases ({len(failing)} of {len(report.cases)})</h2>")
        body += [_failing_case(c) for c in failing[:MAX_FAILING]]
        if len(failing) > MAX_FAILING:
            body.append(f"<p>... and {len(failing) - MAX_FAILING} more failing cases (in the table).</p>")
    body.append(f"<h2>Cases ({len(report.cases)}; click a column to sort)</h2>" + _case_table(report))
    body.append("<h2>The whole run</h2>" + _run_figure(report))
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>specsample {title}: {html.escape(report.scheme)}</title>"
            f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><style>{_CSS}</style></head>"
            f"<body>{''.join(body)}</main><script>{_JS}</script></body></html>\n")


def write_html(report: Report, path: str, command: str = "") -> str:
    """Write :func:`render`'s page to ``path``; return the path."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(report, command=command))
    return path
