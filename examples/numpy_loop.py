"""A speculative loop in plain numpy, as a black box would be: ``generate(prompts [B, P], n, seeds [B])
-> (tokens [B, n], from_draft [B, n])``, the standard rule with k = 3 over two bigram tables (zeros in
both), and the two models' teacher-forced rows. Its twins break one stage each: one uniform shared
by the round's acceptance tests; the bonus drawn from the draft's row; drafting from stale rows (the
output law exact, acceptance moved).

    specsample verify --generate examples/numpy_loop.py:loop --next-token examples/numpy_loop.py:next_token \
        --draft-next-token examples/numpy_loop.py:draft_next_token --prompt 1 --length 12 --batch 500 \
        --k 3 --record loop-rounds/
    specsample audit loop-rounds/
"""

import numpy as np

V, K = 6, 3
_r = np.random.default_rng(11)
P = _r.dirichlet(np.full(V, 0.8), V)
Q = 0.6 * P + 0.4 * _r.dirichlet(np.full(V, 0.8), V)  # a draft near the target: bonus rounds are common
P[np.arange(V), (np.arange(V) + 1) % V] = 0.0  # zeros in the target's rows, and in the draft's
Q[np.arange(V), (np.arange(V) + 2) % V] = 0.0
P /= P.sum(1, keepdims=True)
Q /= Q.sum(1, keepdims=True)
# what a stale draft would draft from: a little nearer the target than Q (its zeros kept)
Q_STALE = 0.9 * Q + 0.1 * np.where(Q > 0, P, 0.0)
Q_STALE /= Q_STALE.sum(1, keepdims=True)
# a draft far from the target (its own zeros): a round seldom accepts all K drafts and emits a bonus
Q_FAR = _r.dirichlet(np.full(V, 0.5), V)
Q_FAR[np.arange(V), (np.arange(V) + 3) % V] = 0.0
Q_FAR /= Q_FAR.sum(1, keepdims=True)
PROMPT = [1]


def next_token(tokens):
    return P[np.asarray(tokens)]


def draft_next_token(tokens):
    return Q[np.asarray(tokens)]


def _inverse_cdf(rows, u):
    cdf = np.cumsum(rows, 1)
    return np.minimum((cdf <= (u * cdf[:, -1])[:, None]).sum(1), rows.shape[1] - 1)


def loop(prompts, n, seeds, *, bug=None, draft=None, race=None):
    """generate(prompts [B, P], n, seeds [B]) -> (tokens [B, n], from_draft [B, n]): standard rule, k = 3.

    ``draft``: the draft's table (default Q); ``race``: draw the token at the stop by an exponential
    race argmax(w / E), as serving engines do, the residual's guarded against E = 0 at a token of
    weight 0 and the bonus's ``"guarded"`` or ``"unguarded"`` (0 / 0 = NaN there, and argmax picks it).
    """
    gens = [np.random.default_rng(int(s)) for s in seeds]
    b = len(gens)
    tokens, flags = np.zeros((b, n + K + 1), np.int64), np.zeros((b, n + K + 1), bool)
    last, filled = np.asarray(prompts)[:, -1].copy(), np.zeros(b, np.int64)
    rows = np.arange(b)
    while filled.min() < n:
        u = np.stack([g.random(2 * K + 1) for g in gens])
        table = Q_STALE if bug == "stale-draft" else (Q if draft is None else draft)
        ctx, drafts = last.copy(), np.zeros((b, K), np.int64)
        for i in range(K):
            drafts[:, i] = ctx = _inverse_cdf(table[ctx], u[:, i])
        prev = np.concatenate([last[:, None], drafts], 1)  # the token before each slot
        p_x, q_x = P[prev[:, :K], drafts], table[prev[:, :K], drafts]
        tests = u[:, [K] * K] if bug == "shared-uniform" else u[:, K : 2 * K]
        accept = tests < np.minimum(1.0, p_x / q_x)
        n_acc = np.where(accept.all(1), K, np.argmin(accept, 1))
        stop_prev = prev[rows, n_acc]
        residual = np.maximum(P[stop_prev] - table[stop_prev], 0.0)
        residual = np.where(residual.sum(1, keepdims=True) > 0, residual, P[stop_prev])
        bonus_row = Q[stop_prev] if bug == "bonus-from-q" else P[stop_prev]
        if race is None:
            stop = _inverse_cdf(np.where((n_acc < K)[:, None], residual, bonus_row), u[:, 2 * K])
        else:
            e = np.stack([g.exponential(size=V) for g in gens])
            with np.errstate(divide="ignore", invalid="ignore"):
                rejected = np.argmax(np.where(residual > 0, residual / e, -np.inf), 1)
                score = bonus_row / e
                bonus = np.argmax(np.where(bonus_row > 0, score, -np.inf) if race == "guarded" else score, 1)
            stop = np.where(n_acc < K, rejected, bonus)
        out = np.concatenate([drafts, np.zeros((b, 1), np.int64)], 1)
        out[rows, n_acc] = stop
        for i in range(K + 1):
            m = (i <= n_acc) & (filled < n)
            tokens[m, filled[m] + i] = out[m, i]
            flags[m, filled[m] + i] = i < n_acc[m]
        last = np.where(filled < n, stop, last)
        filled += np.where(filled < n, n_acc + 1, 0)
    return tokens[:, :n], flags[:, :n]


def shared_uniform(prompts, n, seeds):
    return loop(prompts, n, seeds, bug="shared-uniform")


def bonus_from_q(prompts, n, seeds):
    return loop(prompts, n, seeds, bug="bonus-from-q")


def race_bonus(prompts, n, seeds):
    """A far draft, and the bonus drawn by an unguarded exponential race: wrong only in the rounds that
    emit a bonus, which are few."""
    return loop(prompts, n, seeds, draft=Q_FAR, race="unguarded")


def race_bonus_target_draft(prompts, n, seeds):
    """The same loop with the target as its own draft: every draft accepted, every round emits its
    bonus (what ``verify --bonus-generate`` asks for)."""
    return loop(prompts, n, seeds, draft=P, race="unguarded")


def race_guarded_target_draft(prompts, n, seeds):
    return loop(prompts, n, seeds, draft=P, race="guarded")


def stale_draft(prompts, n, seeds):
    """Drafts (and rules) with rows other than the draft's own: the output law is still exactly the
    target's, and only acceptance moves (by about +0.014 at round starts)."""
    return loop(prompts, n, seeds, bug="stale-draft")
