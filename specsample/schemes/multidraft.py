"""Multi-draft speculative sampling by recursive rejection sampling (RRS).

Rule (SpecInfer, Miao et al. 2023, multi-step speculative sampling; Jeon et al. 2024,
recursive speculative decoding). K draft chains of length k share the context. At each
position the candidates are the next tokens of the chains that still agree with the
accepted prefix. With target P = p(. | prefix) and proposal Q, candidates are tested in
turn: accept c with probability min(1, P(c) / Q(c)); after a rejection
``P <- norm(max(P - Q, 0))`` and the next candidate is tested against the new P. If every
candidate is rejected the position emits a token from the last P and the round ends; if
all k positions accept, a bonus token comes from p after the full prefix.

* with replacement: the K chains are drawn independently, so the candidates at a
  position are i.i.d. q(. | prefix) and Q = q(. | prefix) for each;
* without replacement: the K first tokens are distinct, drawn one after another from q
  restricted to the tokens not drawn yet, and the j-th is tested with that restricted,
  renormalised q as its Q; each chain then continues alone (only one can survive).

* K-SEQ (SpecTr, Sun et al. 2023, "SpecTr: Fast speculative decoding via optimal
  transport"): with m i.i.d. candidates, every candidate is tested against the same P with
  probability min(1, P(c) / (rho Q(c))); if none passes the token comes from the residual
  ``P - min(Q, P / rho) (1 - (1 - beta)**m) / beta`` (normalised), where
  ``beta = sum min(Q, P / rho)`` and rho in [1, m] is the smallest value keeping the residual
  non-negative (:func:`kseq_rho`: exact, from the sorted ratios P / Q).

All are exactly lossless. The number of accepted tokens per round is at least that of the
standard scheme with the same k (one draft chain reduces each to it).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .base import RoundOutput, Scheme, UniformStep, draft_tokens, sample_weights

N_DRAFTS = 2


def _normalise(w):
    s = jnp.sum(w)
    return jnp.where(s > 0, w / jnp.where(s > 0, s, 1.0), w)


def _root_without_replacement(u, q_root, n):
    """n distinct tokens drawn one after another from q without replacement, and the
    restricted proposal each was drawn from; a draw from exhausted mass is marked invalid."""
    mask = jnp.ones_like(q_root)
    toks, props, valid = [], [], []
    for j in range(n):
        w = q_root * mask
        props.append(_normalise(w))
        valid.append(jnp.sum(w) > 0)
        t = sample_weights(w, u[j])
        toks.append(t)
        mask = mask.at[t].set(0.0)
    return jnp.stack(toks), jnp.stack(props), jnp.stack(valid)


def _kseq_excess(target_dist, proposal, rho, m, max_m: int = N_DRAFTS):
    """``P - min(Q, P / rho) c`` with ``c = (1 - (1 - beta)**m) / beta``, ``beta = sum min(Q, P / rho)``
    (``c = m`` as beta -> 0): K-SEQ's residual before clipping at zero."""
    low = jnp.minimum(proposal, target_dist / rho)
    return target_dist - low * _kseq_c(jnp.sum(low), m, max_m)


def _kseq_c(beta, m, max_m: int):
    """``(1 - (1 - beta)**m) / beta`` as the sum ``sum_{i < m} (1 - beta)**i`` (m <= max_m, static).

    The quotient cancels catastrophically in float32 for small beta (1e-4 gives c to 3
    digits); the sum has no cancellation and equals m at beta = 0.
    """
    return sum(jnp.where(i < m, (1.0 - beta) ** i, 0.0) for i in range(max_m))


def kseq_rho(target_dist, proposal, m, max_m: int = N_DRAFTS, max_steps: int = 64):
    """SpecTr's K-SEQ parameter: the smallest rho in [1, m] whose residual is non-negative.

    With r = P / Q, token x needs ``c(beta) <= r_x`` while ``rho <= r_x``, and ``c(beta) <= rho``
    once ``rho > r_x`` (P > 0), where ``beta(rho) = sum_{r >= rho} Q + (1 / rho) sum_{r < rho} P``
    and c is :func:`_kseq_c`. Between consecutive ratios the sums are constants A and B, so
    feasibility reads ``G(rho) = c(A + B / rho) - rho <= 0``; G is continuous and decreasing
    (for m = 2, dG/drho = B / rho^2 - 1 <= 0), and rho* is its root (or 1).

    Found exactly, without a bisection over rho: unless rho = 1 is feasible, start there and
    repeatedly jump to the root of G on the current piece (A, B of the tokens with r <= rho;
    while B = 0 the constraint c <= rho does not bind, so to the next ratio): for m <= 2 the larger
    root of ``rho^2 - (2 - A) rho + B = 0``, for more chains a scalar bisection. A token that
    the jump carries past its ratio only raises the true G above the piece's, so every jump
    stays at or below rho*, and the iteration stops on the true root as soon as a jump
    crosses no ratio: a few O(V) passes (each crosses every ratio between the two points),
    where a bisection costs one O(V) pass per halving. ``max_m`` (static) is the most chains
    the scheme has; after ``max_steps`` passes, or if rounding leaves the answer infeasible
    (never seen), the always feasible rho = m is used.
    """
    P, Q = target_dist, proposal
    m = m.astype(jnp.float32)
    top = jnp.maximum(m, 1.0)
    r = jnp.where(Q > 0, P / jnp.where(Q > 0, Q, 1.0), jnp.inf)

    def piece_root(rho):
        below = r <= rho  # at r = rho both sides give one beta and one constraint
        a = jnp.sum(jnp.where(below, 0.0, Q))
        b = jnp.sum(jnp.where(below, P, 0.0))
        # no P mass below yet: c <= rho does not bind, the piece is infeasible (we only move
        # from infeasible points), so go on to the next ratio
        next_ratio = jnp.min(jnp.where(below, jnp.inf, r))
        if max_m <= 2:  # c = 2 - beta: G(x) x = -(x^2 - (2 - a) x + b)
            s = jnp.where(m >= 2, 2.0 - a, 1.0)
            x = 0.5 * (s + jnp.sqrt(jnp.maximum(s * s - 4.0 * b * (m >= 2), 0.0)))
        else:
            def halve(_, lh):
                lo, hi = lh
                mid = 0.5 * (lo + hi)
                ok = _kseq_c(a + b / mid, m, max_m) <= mid
                return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

            x = jax.lax.fori_loop(0, 30, halve, (rho, top))[1]
        return jnp.clip(jnp.where(b > 0, x, next_ratio), rho, top)

    def moving(state):
        rho, nxt, i = state
        return (nxt > rho) & (i < max_steps)

    def jump(state):
        _, nxt, i = state
        return nxt, piece_root(nxt), i + 1

    one = jnp.float32(1.0)
    feasible_at_one = jnp.all(_kseq_excess(P, Q, one, m, max_m) >= -1e-6)
    start = jnp.where(feasible_at_one, one, piece_root(one))
    rho, _, _ = jax.lax.while_loop(moving, jump, (one, start, jnp.int32(0)))
    ok = jnp.all(_kseq_excess(P, Q, rho, m, max_m) >= -1e-6)
    return jnp.where(ok, rho, top)


def kseq_residual(target_dist, proposal, rho, m, max_m: int = N_DRAFTS):
    """K-SEQ's residual (unnormalised): where the token comes from when no candidate passes."""
    return jnp.maximum(_kseq_excess(target_dist, proposal, rho, m, max_m), 0.0)


def multidraft_round(u, target, draft, context, *, k: int, n_drafts: int, replacement: bool,
                     rule: str = "rrs"):
    """One round from its 2 n k + 1 uniforms (n = n_drafts)."""
    n = n_drafts
    w = context.shape[-1]
    u_draft, u_accept, u_final = u[: n * k].reshape(n, k), u[n * k : 2 * n * k].reshape(k, n), u[-1]
    q_root = draft.probs(context[w - draft.order :])[0]
    if replacement:
        chains = jnp.stack([draft_tokens(u_draft[c], draft, context, k) for c in range(n)])
        root_props, root_valid = None, jnp.ones(n, bool)
    else:
        roots, root_props, root_valid = _root_without_replacement(u_draft[:, 0], q_root, n)
        tails = [draft_tokens(u_draft[c, 1:], draft, jnp.concatenate([context, roots[c : c + 1]]), k - 1)
                 for c in range(n)]
        chains = jnp.stack([jnp.concatenate([roots[c : c + 1], tails[c]]) for c in range(n)])
    full = jnp.concatenate([jnp.broadcast_to(context, (n, w)), chains], axis=1)
    p_rows = jax.vmap(target.probs)(full[:, w - target.order :])  # [n, k + 1, V]
    q_rows = jax.vmap(draft.probs)(full[:, w - draft.order : w + k - 1])  # [n, k, V]

    alive = root_valid
    done = jnp.zeros((), bool)
    n_acc = jnp.zeros((), jnp.int32)
    last = jnp.zeros((), jnp.int32)
    tested = []
    accepted = []
    for i in range(k):
        lead = jnp.argmax(alive)  # any alive chain carries the accepted prefix
        target_dist = p_rows[lead, i]
        proposal = q_rows[lead, i]
        hit = jnp.zeros((), bool)
        token = jnp.zeros((), jnp.int32)
        t_i, a_i = [], []
        if rule == "kseq":
            m = jnp.sum(alive)
            rho = kseq_rho(target_dist, proposal, m, max_m=n)
            fallback = kseq_residual(target_dist, proposal, rho, m, max_m=n)
        for c in range(n):
            cand = chains[c, i]
            q_c = root_props[c] if (not replacement and i == 0) else proposal
            live = alive[c] & ~hit & ~done
            if rule == "kseq":  # every candidate against P, with the proposal inflated by rho
                ok = u_accept[i, c] * rho * q_c[cand] < target_dist[cand]
            else:
                ok = u_accept[i, c] * q_c[cand] < target_dist[cand]
            take = live & ok
            token = jnp.where(take, cand, token)
            reject = live & ~ok
            if rule != "kseq":  # recursive rejection: the next candidate faces the residual
                # where max(0, r - q) vanishes in float32 (q = r but for a sliver the target forbids) the
                # residual is r itself: without this fallback an all-zero row emitted a forbidden token
                res = jnp.maximum(target_dist - q_c, 0.0)
                res = jnp.where(jnp.sum(res) > 0, _normalise(res), target_dist)
                target_dist = jnp.where(reject, res, target_dist)
            hit = hit | take
            t_i.append(live)
            a_i.append(take)
        if rule == "kseq":
            target_dist = jnp.where(jnp.sum(fallback) > 0, fallback, target_dist)
        tested.append(jnp.stack(t_i))
        accepted.append(jnp.stack(a_i))
        stop_here = ~done & ~hit  # every candidate rejected: emit from the residual and end
        last = jnp.where(stop_here, sample_weights(target_dist, u_final), last)
        n_acc = n_acc + (~done & hit)
        alive = jnp.where(~done & hit, alive & (chains[:, i] == token), alive)  # frozen once done
        done = done | stop_here
    lead = jnp.argmax(alive)  # the accepted prefix is the prefix of every surviving chain
    last = jnp.where(done, last, sample_weights(p_rows[lead, k], u_final))  # all k accepted: bonus
    path = chains[lead]
    prefix = jnp.where(jnp.arange(k) < n_acc, path, 0)
    tokens = jnp.concatenate([prefix, jnp.zeros(1, jnp.int32)]).at[n_acc].set(last)
    return RoundOutput(tokens, n_acc + 1, n_acc, chains.T.ravel(), jnp.stack(tested).ravel(),
                       jnp.stack(accepted).ravel())


def _factory(name, replacement, description, rule="rrs"):
    def make(k: int = 4, n_drafts: int = N_DRAFTS) -> Scheme:
        k = int(k)
        return Scheme(
            name=name,
            k=k,
            max_tokens=k + 1,
            step=UniformStep(functools.partial(multidraft_round, k=k, n_drafts=int(n_drafts),
                                               replacement=replacement, rule=rule), 2 * int(n_drafts) * k + 1),
            description=description,
        )

    make.__name__ = name.replace("-", "_")
    return make


multidraft_with_replacement = _factory(
    "multidraft", True, f"{N_DRAFTS} i.i.d. draft chains, recursive rejection sampling (SpecInfer)")
multidraft_without_replacement = _factory(
    "multidraft-wor", False, f"{N_DRAFTS} chains with distinct first tokens, RRS without replacement (Jeon et al.)")
kseq = _factory("kseq", True, f"SpecTr K-SEQ over {N_DRAFTS} i.i.d. draft chains (Sun et al. 2023)", rule="kseq")
