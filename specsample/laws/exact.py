"""Exact output laws of schemes and controls by enumeration (float64, small V and k).

For a scheme and a pair of table models, :func:`round_law` gives the exact law of the
tokens one round emits from a given context, by enumerating every draft sequence (V**k)
and integrating the uniforms analytically. :func:`stream_joint` composes rounds into the
exact law of the first L stream tokens, which is what the battery samples. A lossless
scheme gives p's joint exactly; a control's distance from it is its exact deviation,
which the power function turns into a predicted detection rate.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np

from ..models.tables import TableModel, all_sequences, initial_context
from ..schemes import controls
from .rounds import RoundLaw, add_emissions, model_rows
from .tree_dynamic_exact import scheme_law as _dynamic_scheme_law
from .tree_exact import scheme_law as _tree_scheme_law
from ..schemes.tree_dynamic import DYNAMIC_SPEC

def _norm(w):
    s = w.sum()
    return w / s if s > 0 else w


def _reused_uniform_law(res: np.ndarray, r: float) -> np.ndarray:
    """Inverse CDF of ``res`` driven by a uniform conditioned to lie in [r, 1)."""
    c = np.cumsum(res)
    t = c[-1]
    lo, hi = np.concatenate([[0.0], c[:-1]]), c
    overlap = np.clip(np.minimum(hi, t) - np.maximum(lo, r * t), 0.0, None)
    return overlap / overlap.sum()


def _standard_like(name: str, target: TableModel, draft: TableModel, k: int) -> RoundLaw:
    """Round law of the standard rule, or of one control (one stage changed)."""
    v = target.vocab_size

    def law(context: tuple) -> dict:
        out: dict = {}
        for xs in itertools.product(range(v), repeat=k):
            q_rows = model_rows(draft, context, xs)  # k + 1 rows; row k is q after all drafts
            p_rows = model_rows(target, context, xs)
            sample_rows = q_rows[:k] ** (1 / controls.DRAFT_TEMPERATURE) if name == "draft-temperature" else q_rows[:k]
            sample_rows = np.array([_norm(r) for r in sample_rows])
            pd = float(np.prod([sample_rows[i, x] for i, x in enumerate(xs)]))
            if pd == 0:
                continue
            q_x = np.array([q_rows[i, x] for i, x in enumerate(xs)])
            p_x = np.array([p_rows[i, x] for i, x in enumerate(xs)])
            if name == "accept-all":
                r = (p_x > 0).astype(float)
            elif name == "lenient":
                r = np.minimum(1.0, p_x / (controls.LENIENCY * q_x))
            elif name == "off-by-one":
                r = np.minimum(1.0, np.array([p_rows[i + 1, x] for i, x in enumerate(xs)]) / q_x)
            elif name == "typical":
                thr = np.array([controls.typical_threshold(p_rows[i]) for i in range(k)])
                r = (p_x > thr).astype(float)
            else:  # le-acceptance and no-residual-fallback too: they differ only at a null event or a float32 edge
                r = np.minimum(1.0, p_x / q_x)
            for j in range(k + 1):
                if name == "shared-uniform":
                    top = min(r[:j].min() if j else 1.0, 1.0)
                    pj = top if j == k else max(0.0, top - r[j])
                else:
                    pj = float(np.prod(r[:j])) * (1.0 if j == k else 1.0 - r[j])
                if pj <= 0:
                    continue
                if j == k:
                    last = q_rows[k] if name == "bonus-from-q" else p_rows[k]
                else:
                    res = np.maximum(p_rows[j] - q_rows[j], 0.0)
                    if name == "softmax-residual":
                        last = np.exp(res) / np.exp(res).sum()
                    elif name in ("resample-from-p", "typical"):
                        last = p_rows[j]
                    elif name == "epsilon-residual":
                        last = _norm(np.maximum(p_rows[j] - q_rows[j], controls.EPSILON))
                    elif name == "reused-uniform":
                        last = _reused_uniform_law(res if res.sum() > 0 else p_rows[j], r[j])
                    else:
                        last = _norm(res) if res.sum() > 0 else p_rows[j]
                add_emissions(out, xs[:j], pd * pj, _norm(last))
        return out

    return law


def _drafted(target: TableModel, draft: TableModel, context: tuple, k: int):
    """Every draft sequence of positive probability after ``context``: ``(xs, q_rows, p_rows, probability)``,
    both models' k + 1 rows along it."""
    for xs in itertools.product(range(target.vocab_size), repeat=k):
        q_rows, p_rows = model_rows(draft, context, xs), model_rows(target, context, xs)
        pd = float(np.prod([q_rows[i, x] for i, x in enumerate(xs)]))
        if pd > 0:
            yield xs, q_rows, p_rows, pd


def _lossy_law(rule, target: TableModel, draft: TableModel, k: int) -> RoundLaw:
    """Round law of a lossy rule (:mod:`specsample.schemes.lossy`): drafts from q, each accepted with the
    rule's probability given the target's row, the rejection's token from the rule's law, bonus from p."""
    def law(context: tuple) -> dict:
        out: dict = {}
        for xs, q_rows, p_rows, pd in _drafted(target, draft, context, k):
            r = [rule.accept_np(p_rows[i], x) for i, x in enumerate(xs)]
            for j in range(k + 1):
                pj = float(np.prod(r[:j])) * (1.0 if j == k else 1.0 - r[j])
                if pj > 0:
                    last = p_rows[k] if j == k else rule.reject_np(p_rows[j], xs[j])
                    add_emissions(out, xs[:j], pd * pj, _norm(np.asarray(last, np.float64)))
        return out

    return law


def _block_law(target: TableModel, draft: TableModel, k: int) -> RoundLaw:
    def law(context: tuple) -> dict:
        out: dict = {}
        for xs, q_rows, p_rows, pd in _drafted(target, draft, context, k):
            p_run = [1.0]
            for i, x in enumerate(xs):
                p_run.append(min(p_run[-1] * p_rows[i, x] / q_rows[i, x], 1.0))
            h = []
            for i in range(1, k):
                s = np.maximum(p_run[i] * p_rows[i] - q_rows[i], 0.0).sum()
                den = s + 1.0 - p_run[i]
                h.append(s / den if den > 0 else 1.0)
            h.append(p_run[k])
            for tau in range(k + 1):
                pt = (h[tau - 1] if tau else 1.0) * float(np.prod([1.0 - hh for hh in h[tau:]]))
                if pt <= 0:
                    continue
                if tau == k:
                    last = p_rows[k]
                else:
                    res = np.maximum(p_run[tau] * p_rows[tau] - q_rows[tau], 0.0)
                    last = _norm(res) if res.sum() > 0 else p_rows[tau]
                add_emissions(out, xs[:tau], pd * pt, last)
        return out

    return law


def _greedy_law(target: TableModel, draft: TableModel, k: int) -> RoundLaw:
    def law(context: tuple) -> dict:
        xs: tuple = ()
        for _ in range(k):
            xs += (int(np.argmax(model_rows(draft, context, xs)[len(xs)])),)
        p_rows = model_rows(target, context, xs)
        out = []
        for i, x in enumerate(xs):
            best = int(np.argmax(p_rows[i]))
            out.append(best)
            if best != x:
                return {tuple(out): 1.0}
        return {tuple(out) + (int(np.argmax(p_rows[k])),): 1.0}

    return law


def _kseq_excess(P, Q, rho, m):
    """K-SEQ's residual before clipping, in float64 (written apart from the scheme's own)."""
    low = np.minimum(Q, P / rho)
    beta = low.sum()
    c = (1 - (1 - beta) ** m) / beta if beta > 0 else m
    return P - low * c


def _kseq_rho(P, Q, m):
    def feasible(rho):
        return np.all(_kseq_excess(P, Q, rho, m) >= -1e-12)

    if feasible(1.0):
        return 1.0
    lo, hi = 1.0, float(max(m, 1))
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return hi


def _multidraft_law(target: TableModel, draft: TableModel, k: int, n: int, replacement: bool,
                    rule: str) -> RoundLaw:
    v = target.vocab_size

    def chain_sets(context):
        """Every tuple of n chains with its probability under the drafting rule."""
        q0 = model_rows(draft, context, ())[0]
        for flat in itertools.product(range(v), repeat=n * k):
            chains = [tuple(flat[c * k : (c + 1) * k]) for c in range(n)]
            pr, used, props = 1.0, [], []
            for c, ch in enumerate(chains):
                if replacement:
                    qr = model_rows(draft, context, ch)
                    pr *= float(np.prod([qr[i, x] for i, x in enumerate(ch)]))
                else:
                    w = q0.copy()
                    w[used] = 0.0
                    if w.sum() == 0 or ch[0] in used:
                        pr = 0.0
                        break
                    props.append(w / w.sum())
                    pr *= props[-1][ch[0]]
                    used.append(ch[0])
                    qr = model_rows(draft, context, ch)
                    pr *= float(np.prod([qr[i, x] for i, x in enumerate(ch) if i > 0]))
                if pr == 0:
                    break
            if pr > 0:
                yield chains, pr, props

    def verify(context, chains, props, alive, prefix, mass, out):
        i = len(prefix)
        P = model_rows(target, context, prefix)[i]
        if i == k:
            add_emissions(out, prefix, mass, P)
            return
        Q = model_rows(draft, context, prefix)[i]
        cands = [c for c in range(n) if alive[c]]
        rho = _kseq_rho(P, Q, len(cands)) if rule == "kseq" else 1.0
        reach = mass
        for c in cands:
            x = chains[c][i]
            qc = props[c] if (not replacement and i == 0) else Q
            a = min(1.0, P[x] / (rho * qc[x])) if qc[x] > 0 else 0.0
            if a > 0:
                nxt = [alive[d] and chains[d][i] == x for d in range(n)]
                verify(context, chains, props, nxt, prefix + (x,), reach * a, out)
            reach *= 1.0 - a
            if rule != "kseq":
                r = np.maximum(P - qc, 0.0)
                P = r / r.sum() if r.sum() > 0 else P
        if rule == "kseq":
            r = np.maximum(_kseq_excess(P, Q, rho, len(cands)), 0.0)
            P = r / r.sum() if r.sum() > 0 else P
        if reach > 0:
            add_emissions(out, prefix, reach, P)

    def law(context: tuple) -> dict:
        out: dict = {}
        for chains, pr, props in chain_sets(context):
            verify(context, chains, props, [True] * n, (), pr, out)
        return out

    return law


MULTIDRAFT = {"multidraft": (True, "rrs"), "multidraft-wor": (False, "rrs"), "kseq": (True, "kseq")}
TREES = ("tree", "tree-wor", "tree-topk", "control:tree-topk-no-renorm", "control:tree-bonus-parent-row")
EXACT = ({"standard", "block", "greedy"} | set(MULTIDRAFT) | {f"control:{n}" for n in controls.CONTROL_NAMES}
         | set(TREES) | set(DYNAMIC_SPEC) | {"typical", "relaxed"})  # and the lossy rules with parameters


def round_law(scheme: str, target: TableModel, draft: TableModel, k: int) -> RoundLaw:
    """``context -> {emitted tokens: probability}`` for a registered scheme or control."""
    if scheme in TREES:  # default branching of depth k (specsample.schemes.tree.default_branching)
        return _tree_scheme_law(scheme, target, draft, k)
    if scheme in DYNAMIC_SPEC:  # default width and keep (specsample.schemes.tree_dynamic)
        return _dynamic_scheme_law(scheme, target, draft, k)
    if scheme == "block":
        return _block_law(target, draft, k)
    if scheme == "greedy":
        return _greedy_law(target, draft, k)
    if scheme in MULTIDRAFT:
        from ..schemes.multidraft import N_DRAFTS

        return _multidraft_law(target, draft, k, N_DRAFTS, *MULTIDRAFT[scheme])
    from ..schemes.lossy import rule_of

    rule = rule_of(scheme)
    if rule is not None:
        return _lossy_law(rule, target, draft, k)
    if scheme == "standard" or scheme.startswith("control:"):
        name = scheme.split(":", 1)[-1]
        if scheme != "standard" and name not in controls.CONTROL_NAMES:
            raise ValueError(f"no exact oracle for {scheme!r}; available: {', '.join(sorted(EXACT))}")
        return _standard_like(name, target, draft, k)
    raise ValueError(f"no exact oracle for {scheme!r}; available: {', '.join(sorted(EXACT))}")


def stream_joint(law: RoundLaw, vocab: int, length: int, width: int) -> np.ndarray:
    """Exact law of the first ``length`` stream tokens (flattened, row-major), rounds composed."""
    memo = lru_cache(maxsize=None)(law)
    out = np.zeros(vocab**length)
    frontier = {(): 1.0}
    start = tuple(int(t) for t in initial_context(width))
    while frontier:
        nxt: dict = {}
        for prefix, pr in frontier.items():
            ctx = (start + prefix)[len(start + prefix) - width :] if width else ()
            for block, pb in memo(ctx).items():
                seq = prefix + block
                if len(seq) >= length:
                    out[np.ravel_multi_index(seq[:length], (vocab,) * length)] += pr * pb
                else:
                    nxt[seq] = nxt.get(seq, 0.0) + pr * pb
        frontier = nxt
    return out


def exact_output(scheme: str, target: TableModel, draft: TableModel, k: int, length: int) -> np.ndarray:
    """Exact first-``length`` joint law of a scheme's stream on a pair."""
    law = round_law(scheme, target, draft, k)
    return stream_joint(law, target.vocab_size, length, max(target.order, draft.order))


def expected_accepted(scheme: str, target: TableModel, draft: TableModel, k: int) -> float:
    """Expected accepted drafts in the first round (from the initial context)."""
    width = max(target.order, draft.order)
    law = round_law(scheme, target, draft, k)(tuple(int(t) for t in initial_context(width)))
    return float(sum(p * (len(b) - 1) for b, p in law.items()))


# --- neural models: exact laws by teacher-forced enumeration of prefixes ------------------------


def prefix_rows(model, prompt, length: int, *, batch: int = 4096) -> list:
    """The model's next-token rows after ``prompt`` + every prefix of fewer than ``length`` tokens.

    Level m is a float64 array [V**m, V]: row i follows the prefix whose tokens, read as a
    base-V number (first token most significant), equal i. One teacher-forced pass over each
    of the V**(length - 1) sequences of length - 1 tokens gives every level at once (the
    prefix of length m sits at position ``len(prompt) - 1 + m``), in batches of ``batch``.
    Works for any model with ``probs(tokens [N, T]) -> [N, T, V]``.
    """
    v = model.vocab_size
    prompt = np.asarray(prompt, np.int64).ravel()
    seqs = all_sequences(v, length - 1)
    rows = []
    for start in range(0, len(seqs), batch):
        part = seqs[start : start + batch]
        toks = np.concatenate([np.broadcast_to(prompt, (len(part), prompt.size)), part], axis=1)
        rows.append(np.asarray(model.probs(toks), dtype=np.float64)[:, prompt.size - 1 :])
    full = np.concatenate(rows)  # [V**(L-1), L, V]
    # the prefix of length m is the sequence with m leading tokens and zeros after: every V**(L-1-m)-th
    return [full[:: v ** (length - 1 - m), m] for m in range(length)]


def joint_from_rows(rows: list) -> np.ndarray:
    """Exact law of the first L tokens (flattened, row-major) from :func:`prefix_rows`."""
    joint = np.ones(1)
    for level in rows:
        joint = (joint[:, None] * level).ravel()
    return joint


def marginals_from_rows(rows: list) -> np.ndarray:
    """Exact law of each of the first L tokens, [L, V], from :func:`prefix_rows`."""
    out, weight = [], np.ones(1)
    for level in rows:
        out.append(weight @ level)
        weight = (weight[:, None] * level).ravel()
    return np.stack(out)


def acceptance_from_rows(p_rows: list, q_rows: list) -> np.ndarray:
    """alpha_t = E[sum_x min(p_t(x), q_t(x))] at each of the L positions, over p's law of the prefix."""
    out, weight = [], np.ones(1)
    for p, q in zip(p_rows, q_rows):
        out.append(float(weight @ np.minimum(p, q).sum(axis=1)))
        weight = (weight[:, None] * p).ravel()
    return np.array(out)


def standard_rounds_law(p_rows: list, q_rows: list, k: int) -> np.ndarray:
    """Exact law of the rounds the standard rule takes to emit the first L tokens, [L + 1].

    Entry r is the probability of r rounds (entry 0 is 0), as the engine counts
    ``rounds_per_sequence``. A forward pass over prefixes, tracking how many drafts the
    current round has accepted (i) and how many rounds have ended (e): the next token x is
    an accepted draft with probability min(p(x), q(x)) (i < k; the round goes on), or ends
    the round, as a resampled token with probability max(0, p(x) - q(x)) (i < k) or as the
    bonus with p(x) (i = k). Summed over both, x has probability p(x): the losslessness
    theorem, prefix by prefix. Both models' rows depend only on the prefix, so any model with
    teacher-forced rows (a transformer with or without its cache) has this law under the
    standard rule; a cache that feeds the draft the wrong context changes it.
    """
    L = len(p_rows)
    mass = np.zeros((1, k + 1, L))  # [prefix, drafts accepted in this round, rounds ended]
    mass[0, 0, 0] = 1.0
    for m in range(L):
        p, q = p_rows[m], q_rows[m]
        acc, rej = np.minimum(p, q), np.maximum(p - q, 0.0)
        n_pre = mass.shape[0]
        new = np.zeros((n_pre, p.shape[1], k + 1, L))
        # an accepted draft: i -> i + 1
        new[:, :, 1:, :] += mass[:, None, :k, :] * acc[:, :, None, None]
        # a round ends at x: from any i < k by the residual, from i = k by the bonus
        ends = (mass[:, None, :k, :] * rej[:, :, None, None]).sum(axis=2) + mass[:, None, k, :] * p[:, :, None]
        shift = 1 if m <= L - 2 else 0  # only ends before the last token start another round
        new[:, :, 0, shift:] += ends[:, :, : L - shift]
        mass = new.reshape(n_pre * p.shape[1], k + 1, L)
    law = np.zeros(L + 1)
    law[1:] = mass.sum(axis=(0, 1))
    return law


def expected_acceptance(target, draft, prompt, length: int) -> np.ndarray:
    """alpha_t = E[sum_x min(p_t, q_t)] at each of ``length`` positions after ``prompt`` for two models
    with ``probs(tokens)`` (transformers), the expectation over p's law of the prefix (exact: enumerates
    V^(length - 1) prefixes)."""
    return acceptance_from_rows(prefix_rows(target, prompt, length), prefix_rows(draft, prompt, length))
