"""Block verification (Sun et al. 2024): accept up to the *last* success, not the first failure.

Rule (Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro and Suresh, "Block Verification
Accelerates Speculative Decoding", ICLR 2025, Algorithm 2). Draft x_1..x_k from q. With
``P_i = p(. | x^i)``, ``Q_i = q(. | x^i)`` and ``p_0 = 1``:

    p_i = min(p_{i-1} P_{i-1}(x_i) / Q_{i-1}(x_i), 1)
    S_i = sum_x max(p_i P_i(x) - Q_i(x), 0)
    h_i = S_i / (S_i + 1 - p_i)   for i < k,   h_k = p_k

Draw eta_1..eta_k ~ U(0, 1) and keep tau = the largest i with eta_i < h_i (0 if none):
emit x_1..x_tau, then a token from ``norm(max(p_tau P_tau - Q_tau, 0))`` (from P_k when
tau = k). The output is distributed exactly as p, and the expected number of accepted
drafts is never below token-level verification; on p = [1/3, 2/3], q = [2/3, 1/3], k = 2 it
is 11/9 against 10/9 (:mod:`specsample.laws.exact` computes both).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from .base import Scheme, UniformStep, draft_tokens, emit, residual, sample_weights
from .standard import Verification, split_uniforms


def block_round(u, target, draft, context, *, k: int):
    """One round of block verification for one lane, from its 2k + 1 uniforms."""
    u_draft, eta, u_final = split_uniforms(u, k)
    drafts = draft_tokens(u_draft, draft, context, k)
    v = Verification(target, draft, context, drafts, eta, u_final)
    # p / q without 0 / 0: XLA on CPU flushes subnormals to zero, so a drafted token of q = 1e-40 meets
    # q = 0 here (the edge-row pass found the NaN this made, which accepted a draft of p = 0)
    p_x, q_x = v.p_draft(), v.q_draft()
    ratio = jnp.where(p_x > 0, p_x / jnp.maximum(q_x, jnp.finfo(jnp.float32).tiny), 0.0)
    p_run = [jnp.float32(1.0)]
    for i in range(k):  # static, small
        p_run.append(jnp.minimum(p_run[-1] * ratio[i], 1.0))
    p_run = jnp.stack(p_run)  # p_0..p_k
    h = []
    for i in range(1, k):
        s = jnp.sum(jnp.maximum(p_run[i] * v.p_row(i) - v.q_row(i), 0.0))
        den = s + 1.0 - p_run[i]
        h.append(jnp.where(den > 0, s / jnp.where(den > 0, den, 1.0), 1.0))  # mask before dividing
    h.append(p_run[k])
    success = eta < jnp.stack(h)  # eta_i < h_i, i = 1..k (strict: eta can be 0)
    idx = jnp.arange(1, k + 1)
    tau = jnp.max(jnp.where(success, idx, 0)).astype(jnp.int32)
    weights = jnp.where(tau < k, residual(p_run[tau] * v.p_row(tau), jnp.where(tau < k, v.q_row(tau), 0.0)),
                        v.p_row(tau))
    accepted = jnp.arange(k) < tau
    return emit(drafts, tau, sample_weights(weights, u_final), tested=jnp.ones(k, bool), accepted=accepted,
                anchor=getattr(target, "table", None))


def block_verification(k: int = 4) -> Scheme:
    """Block verification with draft length ``k``."""
    k = int(k)
    return Scheme(
        name="block",
        k=k,
        max_tokens=k + 1,
        step=UniformStep(functools.partial(block_round, k=k), 2 * k + 1),
        description="block verification: accept up to the last success (Sun et al. 2024)",
    )
