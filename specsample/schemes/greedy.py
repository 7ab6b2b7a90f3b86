"""Greedy verification (temperature 0).

Rule: draft x_1..x_k greedily from q (argmax, ties to the lowest token id); accept x_i while
it equals argmax p_i; at the first mismatch emit argmax p_i; after k matches emit argmax
p_k. The output must equal greedy decoding of p exactly, so its target law is p warped to
temperature 0 (one-hot on the argmax with the same tie-break): the battery tests against
that law, and any other token is a hard support failure.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np

from .base import Scheme, UniformStep, draft_tokens, emit, leading_true
from .standard import Verification


def argmax_law(table: np.ndarray) -> np.ndarray:
    """One-hot rows on each row's most probable token (ties: the lowest id)."""
    t = np.asarray(table, dtype=np.float64)
    out = np.zeros_like(t)
    np.put_along_axis(out, np.argmax(t, axis=-1)[..., None], 1.0, axis=-1)
    return out


def greedy_round(u, target, draft, context, *, k: int):
    del u  # deterministic: a round draws no uniforms
    argmax_model = SimpleNamespace(order=draft.order,
                                   sample=lambda tokens, u: jnp.argmax(draft.probs(tokens)[-1]).astype(jnp.int32))
    drafts = draft_tokens(jnp.zeros(k), argmax_model, context, k)
    v = Verification(target, draft, context, drafts, jnp.zeros(k), jnp.zeros(()))
    best = jnp.stack([jnp.argmax(v.p_row(i)) for i in range(k)]).astype(jnp.int32)
    anchor = getattr(target, "table", None)  # one trip count for all lanes
    j = leading_true(drafts == best, anchor)
    return emit(drafts, j, jnp.argmax(v.p_row(j)).astype(jnp.int32), anchor=anchor)


def greedy(k: int = 4) -> Scheme:
    """Greedy (temperature-0) verification with draft length ``k``."""
    k = int(k)
    return Scheme(
        name="greedy",
        k=k,
        max_tokens=k + 1,
        step=UniformStep(functools.partial(greedy_round, k=k), 0),
        description="greedy verification: output equals greedy decoding of p",
        target_law=argmax_law,
    )
