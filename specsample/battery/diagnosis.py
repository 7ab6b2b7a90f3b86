"""Diagnosis: which stage of a standard-rule round is broken.

Every token a round of the standard rule emits took one of its paths, and each stage has an exact
law given the two models' rows at that slot (Leviathan et al. 2023, Theorem 1's proof):

========== =================================================================================
stage      law at slot i, rows p_i and q_i after the context and the drafts before slot i
========== =================================================================================
drafting   the draft x_i ~ q_i
acceptance a drafted x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)), whatever
           happened to the drafts before it (given the tokens)
rejection  the token emitted at the first rejection j < k ~ norm(max(0, p_j - q_j))
bonus      the token after k acceptances ~ p_k
========== =================================================================================

:func:`stage_counts` sorts a batch of rounds by path, and :func:`stage_tests` tests each stage
against its law, grouped by (slot, rows): per group a pooled chi-square (or the acceptance
binomials), summed over groups (one statistic per stage: power for deviations spread thin). Each
stage's result carries an estimate of how far it is off, at its worst slot, with an interval.

Rounds come from anywhere: a JAX scheme played by :mod:`specsample.battery.stages` on table models, or a
host sampler called on drafts and rows specsample chose. This module needs only numpy and scipy
(through :mod:`stats`).

References
----------
Leviathan, Y., Kalman, M. and Matias, Y. (2023). Fast inference from transformers via
speculative decoding. ICML. arXiv:2211.17192.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
from scipy import special  # chi-square tails; scipy.stats costs 0.4 s to import

import stats

from .streams import MC_SEED

STAGES = ("drafting", "acceptance", "rejection", "bonus")
TOKEN_STAGES = ("drafting", "rejection", "bonus")  # the token-law stages that get the token chi-square at large V
TOKEN_TEST_VOCAB = 4096  # above this many tokens most are pooled: the token chi-square too (cases.LARGE_VOCAB)
MIN_EXPECTED = 5.0  # per pooled cell of a group (Cochran); groups with fewer expected counts drop out
_BOOTSTRAP = 200
# a group decided by simulation can reach this p-value (999,999 tables where none of the first 9,999 reached the
# statistic), so its quantile in a stage's chi-square sum counts as much as a wrong law earns
SIMULATION_FLOOR = 1e-6


def chi2_term(counts: np.ndarray, law: np.ndarray, seed) -> Optional[tuple[float, int]]:
    """One group's share ``(statistic, dof)`` of a sum of chi-square statistics; None when its law pools to
    fewer than two cells or its counts leave the support (the caller counts those).

    A group whose cells pool enough for the chi-square limit adds its statistic. One pooled to fewer cells (a
    near-certain law: [0.9986, 0.0014] seen 132 times) is tested exactly (two tokens) or by simulation,
    refined down to :data:`SIMULATION_FLOOR`, and adds its p-value's quantile: its raw statistic is no
    chi-square (44 for 3 rare tokens where 0.18 were expected, a tail of 1e-3), and read as one it made
    the stage tests' false alarms.
    """
    r = stats.goodness_of_fit(counts, law, min_expected=MIN_EXPECTED, seed=seed, min_pvalue=SIMULATION_FLOOR)
    if r.cells < 2 or r.method == "support":
        return None
    return (r.statistic if r.method == "asymptotic" else float(special.chdtri(r.dof, r.pvalue))), r.dof


class Rounds(NamedTuple):
    """A batch of N rounds of draft length k, and the rows that applied to them.

    ``p_key[n, i]`` (i = 0..k) and ``q_key[n, i]`` (i = 0..k-1) index ``p_rows`` and ``q_rows``:
    the target's and the draft's rows at slot i of round n (after its context and drafts[:i]).
    ``drafted`` is False where specsample drafted the tokens itself (host samplers): the
    drafting stage is then not the sampler's and is not tested. ``history`` (rounds of neural
    models) holds what came before each round, for laws that need the whole context.
    """

    drafts: np.ndarray  # [N, k]
    tokens: np.ndarray  # [N, k + 1]
    n_accepted: np.ndarray  # [N]
    p_key: np.ndarray  # [N, k + 1]
    q_key: np.ndarray  # [N, k]
    p_rows: np.ndarray  # [Kp, V]
    q_rows: np.ndarray  # [Kq, V]
    drafted: bool = True
    history: Optional[list] = None  # [N] the tokens before each round (prompt included), where known


class StageResult(NamedTuple):
    """One stage's test and how far it is off.

    ``estimate`` is the stage's deviation at ``slot`` (its worst): the total variation between the
    observed and the expected law of the tokens there (drafting, rejection, bonus), or the
    observed minus the expected acceptance rate (acceptance); ``error`` is a bootstrap standard
    error of it. ``observed``/``expected`` are the pooled laws (or rates) at that slot, for figures.
    """

    stage: str
    statistic: float
    pvalue: float
    dof: int
    n: int
    slot: Optional[int]
    estimate: float
    error: float
    observed: Optional[np.ndarray]
    expected: Optional[np.ndarray]
    detail: str
    # the token counts at ``slot`` when its tokens follow one law there (one group: a multinomial sample of
    # ``expected``), for a distance with an interval (specsample.measure); None otherwise
    counts: Optional[np.ndarray] = None


def _norm(w: np.ndarray) -> np.ndarray:
    s = w.sum(axis=-1, keepdims=True)
    return np.divide(w, s, out=np.zeros_like(w), where=s > 0)


def _groups(*keys) -> tuple[np.ndarray, np.ndarray]:
    """Group ids of equal key tuples (numbered in the tuples' lexicographic order), and the first index
    of each group.

    The tuples are folded into one int64 code, column by column (mixed radix over each column's
    range, re-numbered densely when the next column would overflow), and grouped by a 1-D
    ``np.unique``: the same ids as ``np.unique(axis=0)``, which sorts void-typed rows and cost
    two thirds of a quick battery.
    """
    code = np.zeros(np.asarray(keys[0]).size, np.int64)
    span = 1
    for k in keys:
        col = np.asarray(k, np.int64).ravel()
        if col.size == 0:
            break
        lo = int(col.min())
        width = int(col.max()) - lo + 1
        col = col - lo
        if span * width >= 1 << 62:  # re-number the groups so far 0..G-1 (order kept), then go on
            uniq, code = np.unique(code, return_inverse=True)
            code, span = code.astype(np.int64).ravel(), len(uniq)
        if span * width >= 1 << 62:  # ... and this column's values too (both now < the number of rows)
            uniq, col = np.unique(col, return_inverse=True)
            col, width = col.astype(np.int64).ravel(), len(uniq)
        code = code * width + col
        span *= width
    _, first, inv = np.unique(code, return_index=True, return_inverse=True)
    return inv.ravel(), first


def _tv_with_error(counts: np.ndarray, law: np.ndarray, rng) -> tuple[float, float]:
    """TV of the observed frequencies from ``law`` (pooled over groups: counts [G, V], laws [G, V]),
    and the bootstrap standard error of that estimate (multinomial resampling per group)."""
    n = counts.sum(axis=1)
    total = n.sum()
    if total == 0:
        return float("nan"), float("nan")
    # A token no group observed has frequency 0, so no resample draws it (a multinomial draws no
    # number for a zero cell): its |c - n l| is n l in every resample. Only the observed tokens (and
    # the last, which takes a draw's remainder) are resampled: the same numbers from the same rng,
    # in time O(observed) instead of O(V) per group (a 32k vocabulary's stage took 2 s, now ms).
    seen = counts.any(axis=0)
    seen[-1] = True
    fixed = float((n[:, None] * law[:, ~seen]).sum())
    counts, law = counts[:, seen], law[:, seen]

    def tv(c):  # counts [..., G, V] -> TV [...]
        return 0.5 * (np.abs(c - n[:, None] * law).sum(axis=(-2, -1)) + fixed) / total

    freq = _norm(counts.astype(np.float64))
    freq[n == 0] = 1.0 / freq.shape[1]  # an empty group draws nothing (n = 0); any law will do
    # the B resamples in batches of [b, G, V] (at most about 2^22 counts: a 32k-token law with 64 groups
    # and all B at once would be 3 GB), drawn in the same order as one at a time
    per = max(1, (1 << 22) // counts.size)
    boot = np.concatenate([tv(rng.multinomial(n, freq, size=(min(per, _BOOTSTRAP - b), len(n))))
                           for b in range(0, _BOOTSTRAP, per)])
    return float(tv(counts)), float(np.std(boot))


def _mixture_test(counts: np.ndarray, laws: np.ndarray) -> tuple[float, int]:
    """Chi-square over observations that each had their own law (sparse groups): token totals and
    the probability the law gave each observed token, jointly.

    Per observation the features are the token's indicator (cells merged below) and l(x), the
    probability its law gave the token drawn: the first see laws shifted toward some tokens, the
    second laws sharpened or flattened row by row (which leaves totals alone when rows differ).
    Their sum over independent observations has mean and covariance known under the null; the
    quadratic form in the covariance's pseudo-inverse is asymptotically chi-square with its rank
    as dof. Tokens expected fewer than MIN_EXPECTED times are pooled into one cell first.
    """
    n = counts.sum(axis=1).astype(np.float64)
    exp = (n[:, None] * laws).sum(axis=0)
    if exp.sum() < 2 * MIN_EXPECTED:
        return 0.0, 0
    big = exp >= MIN_EXPECTED
    merge = np.zeros((laws.shape[1], int(big.sum()) + 1))
    merge[np.flatnonzero(big), np.arange(int(big.sum()))] = 1.0
    merge[~big, -1] = 1.0
    if (merge[:, -1] * exp).sum() < MIN_EXPECTED:  # too little to stand alone: join the smallest big cell
        if big.any() and (~big).any():
            merge[~big, int(np.argmin(np.where(big, exp, np.inf)[big]))] = 1.0
        merge = merge[:, :-1]
    lp = laws @ merge  # [G, C]
    s2, s3 = (laws**2).sum(axis=1), (laws**3).sum(axis=1)
    sq = (laws**2) @ merge  # sum of l(j)^2 over each cell's tokens
    observed = np.concatenate([counts.sum(axis=0) @ merge, [(counts * laws).sum()]])
    mean = np.concatenate([(n[:, None] * lp).sum(axis=0), [(n * s2).sum()]])
    c = lp.shape[1]
    cov = np.zeros((c + 1, c + 1))
    cov[:c, :c] = np.diag((n[:, None] * lp).sum(axis=0)) - np.einsum("g,gi,gj->ij", n, lp, lp)
    cross = (n[:, None] * (sq - lp * s2[:, None])).sum(axis=0)
    cov[:c, c] = cov[c, :c] = cross
    cov[c, c] = (n * (s3 - s2**2)).sum()
    w, v = np.linalg.eigh(cov)
    keep = w > 1e-9 * max(1.0, w.max(initial=0.0))
    if not keep.any():
        return 0.0, 0
    proj = v[:, keep].T @ (observed - mean)
    return float(np.sum(proj**2 / w[keep])), int(keep.sum())


def _law_stage(stage: str, slot: np.ndarray, group: np.ndarray, token: np.ndarray, laws: np.ndarray, vocab: int,
               rng) -> Optional[StageResult]:
    """A stage whose tokens follow a law per group: chi-square per group with enough observations,
    plus one per slot over the sparse groups (:func:`_mixture_test`), summed; TV at the worst slot.

    ``slot``, ``group``, ``token`` [M] are one entry per token on the stage's path; ``laws`` [G, V]
    the law of each group (one slot each).
    """
    if token.size == 0:
        return None
    n_groups = laws.shape[0]
    counts = np.zeros((n_groups, vocab), np.int64)
    valid = (token >= 0) & (token < vocab)  # an id outside the vocabulary is outside every law's support
    np.add.at(counts, (group[valid], token[valid]), 1)
    slot_of = np.zeros(n_groups, np.int64)
    slot_of[group] = slot
    n_g = counts.sum(axis=1)
    # a token the stage's law forbids: certain, whatever the budget
    support = int(counts[laws <= 0].sum()) + int((~valid).sum())
    dense = (n_g * laws.max(axis=1) >= 2 * MIN_EXPECTED) & (np.count_nonzero(laws, axis=1) >= 2)
    stat, dof = 0.0, 0
    for g in np.flatnonzero(dense):
        term = chi2_term(counts[g], laws[g], (MC_SEED, int(g)))
        if term is not None:
            stat, dof = stat + term[0], dof + term[1]
    for s in np.unique(slot_of[~dense & (n_g > 0)]):
        sel = ~dense & (n_g > 0) & (slot_of == s)
        x, d = _mixture_test(counts[sel], laws[sel])
        stat, dof = stat + x, dof + d
    pvalue = 0.0 if support else (float(special.chdtrc(dof, stat)) if dof else 1.0)
    # the slot whose pooled law is farthest off
    best = (float("-inf"), None, float("nan"), float("nan"), None, None, None)
    for s in np.unique(slot_of[n_g > 0]):
        sel = (slot_of == s) & (n_g > 0)
        if sel.sum() <= 64:
            est, err = _tv_with_error(counts[sel], laws[sel], rng)
        else:  # many sparse groups: TV of the token totals, with a normal error
            o = counts[sel].sum(axis=0)
            e = (n_g[sel, None] * laws[sel]).sum(axis=0)
            est = float(0.5 * np.abs(o - e).sum() / o.sum())
            err = float(0.5 * np.sqrt((n_g[sel, None] * laws[sel] * (1 - laws[sel])).sum()) / o.sum())
        z = est / err if err > 0 else (np.inf if est > 0 else 0.0)
        if z > best[0]:
            obs = counts[sel].sum(axis=0)
            exp = (n_g[sel, None] * laws[sel]).sum(axis=0)
            best = (z, int(s), est, err, obs / max(1, obs.sum()), exp / max(1e-300, exp.sum()),
                    obs if sel.sum() == 1 else None)
    _, worst, est, err, obs, exp, slot_counts = best
    detail = (f"{token.size} tokens in {n_groups} (slot, rows) groups ({int(dense.sum())} tested alone); " +
              (f"{support} tokens outside the stage's support; " if support else "") +
              f"chi-square {stat:.1f} on {dof} dof")
    return StageResult(stage, float("inf") if support else stat, pvalue, dof, int(token.size), worst, est, err,
                       obs, exp, detail, slot_counts)


def _acceptance_stage(r: Rounds, tested: np.ndarray, accepted: np.ndarray, rng) -> Optional[StageResult]:
    """Acceptance per (slot, rows, drafted token) against min(1, p / q): binomials, chi-square summed."""
    n_rounds, k = r.drafts.shape
    slot = np.broadcast_to(np.arange(k), (n_rounds, k))[tested]
    if slot.size == 0:
        return None
    pk, qk, x = r.p_key[:, :k][tested], r.q_key[tested], np.clip(r.drafts[tested], 0, r.p_rows.shape[1] - 1)
    p, q = r.p_rows[pk, x], r.q_rows[qk, x]
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(q > 0, np.minimum(1.0, p / np.where(q > 0, q, 1.0)), np.nan)
    group, first = _groups(slot, pk, qk, x)
    n_g = np.bincount(group)
    a_g = np.bincount(group, weights=accepted[tested].astype(np.float64)).astype(np.int64)
    res = stats.per_token_acceptance_test(n_g, a_g, rate[first], min_expected=MIN_EXPECTED)
    r_g = rate[first]
    sparse = ~((n_g * r_g >= MIN_EXPECTED) & (n_g * (1 - r_g) >= MIN_EXPECTED)) & np.isfinite(r_g)
    stat, dof, pvalue = res.statistic, res.dof, res.pvalue
    if res.violations.size == 0:  # the groups too small for their own binomial: their total, per slot
        slot_g = slot[first]
        for s in np.unique(slot_g[sparse]):
            sel = sparse & (slot_g == s)
            var = float((n_g[sel] * r_g[sel] * (1 - r_g[sel])).sum())
            if var >= MIN_EXPECTED:
                z = stats.bernoulli_sum_test(a_g[sel], n_g[sel], r_g[sel]).statistic
                stat, dof = stat + z * z, dof + 1
        pvalue = float(special.chdtrc(dof, stat)) if dof else 1.0
    # per slot: observed rate minus expected, with a binomial standard error
    best = (float("-inf"), None, float("nan"), float("nan"), None, None, None)
    ok = np.isfinite(rate)
    for s in range(k):
        sel = (slot == s) & ok
        if sel.sum() == 0:
            continue
        obs, exp = float(accepted[tested][sel].mean()), float(rate[sel].mean())
        err = float(np.sqrt(max(np.sum(rate[sel] * (1 - rate[sel])), 1e-12)) / sel.sum())
        z = abs(obs - exp) / err
        if z > best[0]:
            best = (z, s, obs - exp, err, np.array([obs]), np.array([exp]))
    _, worst, est, err, obs, exp = best
    viol = f"; {len(res.violations)} (slot, token) groups break a certain outcome" if len(res.violations) else ""
    detail = f"{slot.size} drafts tested in {len(first)} (slot, rows, token) groups; chi-square {stat:.1f} " \
             f"on {dof} dof{viol}"
    return StageResult("acceptance", stat, pvalue, dof, int(slot.size), worst, est, err, obs, exp, detail)


def stage_counts(r: Rounds):
    """The masks of each path: tested and accepted drafts [N, k], rejections and bonuses [N]."""
    n_rounds, k = r.drafts.shape
    j = np.clip(np.asarray(r.n_accepted, np.int64), 0, k)
    i = np.arange(k)
    tested = i[None] <= j[:, None]
    accepted = i[None] < j[:, None]
    return tested, accepted, j < k, j == k


def _token_stage(stage: str, group: np.ndarray, token: np.ndarray, laws: np.ndarray, vocab: int) -> Optional[StageResult]:
    """The stage's token law at a large vocabulary, seen token by token: the token chi-square
    (:func:`stats.identity.token_chi2_test`, every token with an expected draw a cell of its own) of each
    (slot, rows) group against its law, Bonferroni over the groups. The chi-square of :func:`_law_stage`
    pools most tokens at such V, and mass moved within a pooled cell is invisible to it; this one sees
    every token. Named ``<stage>[tokens]``: one stage, tested two ways."""
    if token.size == 0:
        return None
    counts = np.zeros((laws.shape[0], vocab), np.int64)
    valid = (token >= 0) & (token < vocab)
    np.add.at(counts, (group[valid], token[valid]), 1)
    best, tested = None, 0
    for g in np.flatnonzero(counts.sum(axis=1) > 1):
        law = laws[g] / laws[g].sum()
        r = stats.identity.token_chi2_test(counts[g], law)
        if r.cells < 2:  # too few tokens for any to expect a draw alone: nothing to see token by token
            continue
        tested += 1
        if best is None or r.pvalue < best[0].pvalue:
            best = (r, g, law)
    if best is None:
        return None
    r, g, law = best
    p = min(1.0, tested * r.pvalue)
    detail = (f"token chi-square of each of {tested} (slot, rows) groups against its law, every token with an "
              f"expected draw seen alone (Bonferroni over the groups): worst Z {r.statistic:,.1f} against "
              f"{r.null_mean:.0f} +- {r.null_sd:,.1f} by chance over {r.cells:,} cells, in {r.n:,} tokens")
    # the worst group's TV beyond what chance gives, as the other stages' estimate
    excess = 0.5 * float(np.abs(counts[g] / r.n - law).sum()) - stats.identity.tv_null_mean(law, r.n)
    return StageResult(f"{stage}[tokens]", r.statistic, p, r.cells - 1, int(counts.sum()), None, excess,
                       float("nan"), None, None, detail)


def stage_tests(r: Rounds, seed: int = 0) -> list:
    """Every stage's :class:`StageResult` (a stage with nothing on its path is left out)."""
    rng = np.random.default_rng(seed)
    n_rounds, k = r.drafts.shape
    vocab = r.p_rows.shape[1]
    tested, accepted, rejected, bonus = stage_counts(r)
    j = np.clip(np.asarray(r.n_accepted, np.int64), 0, k)
    out = []
    if r.drafted:
        slot = np.broadcast_to(np.arange(k), (n_rounds, k))[tested]
        qk = r.q_key[tested]
        group, first = _groups(slot, qk)
        out.append(_law_stage("drafting", slot, group, r.drafts[tested], r.q_rows[qk[first]], vocab, rng))
        if vocab > TOKEN_TEST_VOCAB:
            out.append(_token_stage("drafting", group, r.drafts[tested], r.q_rows[qk[first]], vocab))
    out.append(_acceptance_stage(r, tested, accepted, rng))
    if rejected.any():
        # where max(0, p - q) vanishes (p = q) no draft can be rejected: such a rejection is the
        # acceptance stage's deviation (a certain acceptance broken), and has no law here
        at = np.flatnonzero(rejected)
        # the residual's mass once per distinct (p row, q row), not per round: at V = 32768 a row per
        # round is gigabytes
        g_at, f_at = _groups(r.p_key[at, j[at]], r.q_key[at, j[at]])
        pk0, qk0 = r.p_key[at[f_at], j[at[f_at]]], r.q_key[at[f_at], j[at[f_at]]]
        at = at[(np.maximum(r.p_rows[pk0] - r.q_rows[qk0], 0.0).sum(axis=1) > 0)[g_at]]
        jr = j[at]
        pk, qk = r.p_key[at, jr], r.q_key[at, jr]
        if jr.size:
            group, first = _groups(jr, pk, qk)
            laws = _norm(np.maximum(r.p_rows[pk[first]] - r.q_rows[qk[first]], 0.0))
            out.append(_law_stage("rejection", jr, group, r.tokens[at, jr], laws, vocab, rng))
            if vocab > TOKEN_TEST_VOCAB:
                out.append(_token_stage("rejection", group, r.tokens[at, jr], laws, vocab))
    if bonus.any():
        pk = r.p_key[bonus, k]
        group, first = _groups(pk)
        out.append(_law_stage("bonus", np.full(pk.size, k), group, r.tokens[bonus, k], r.p_rows[pk[first]], vocab,
                              rng))
        if vocab > TOKEN_TEST_VOCAB:
            out.append(_token_stage("bonus", group, r.tokens[bonus, k], r.p_rows[pk[first]], vocab))
    return [s for s in out if s is not None]


def describe(results: list, rejected: set) -> str:
    """One line naming the stages that deviate (``rejected``: their names) and those consistent.

    >>> describe([], set())
    'no stage tested'
    """
    if not results:
        return "no stage tested"
    bad = [s for s in results if s.stage in rejected]
    good = [s.stage for s in results if s.stage not in rejected]
    parts = []
    for s in bad:
        unit = "depth" if s.stage in _TREE else "position"  # a tree's stages are placed by depth
        where = f" at {unit} {s.slot}" if s.slot is not None else ""
        if s.stage in ("acceptance", "sibling-acceptance"):
            z = f", z = {s.estimate / s.error:+.1f}" if s.error > 0 else ""
            what = f"acceptance rate off by {s.estimate:+.3f} +- {s.error:.3f}{where}{z}"
        else:
            what = f"{_LAW[s.stage]} (TV {s.estimate:.3f} +- {s.error:.3f}{where})"
        parts.append(f"{s.stage}: {what}")
    tail = f"; {', '.join(good)} consistent" if good else ""
    if not parts:
        return f"every stage consistent ({', '.join(good)})"
    return "; ".join(parts) + tail


_LAW = {"drafting": "drafts deviate from q", "rejection": "tokens at the first rejection deviate from "
        "norm(max(0, p - q))", "bonus": "bonus tokens deviate from p's row k",
        # token trees (specsample.battery.tree_stages)
        "children": "children deviate from the law they are drafted from",
        "residual": "tokens after every child is rejected deviate from the residual after the last rejection",
        "leaf": "tokens at an accepted leaf deviate from p there"}
_TREE = ("children", "sibling-acceptance", "residual", "leaf")
