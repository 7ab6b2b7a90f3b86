"""Plain numpy implementations of standard speculative sampling.

``reference_sequences`` is the oracle: a readable loop in float64 that follows the
published algorithm line by line, used to cross-check the JAX engine in distribution.
``numpy_rounds`` is a vectorised numpy version for context-free pairs, the speed
baseline of the benchmarks; ``torch_rounds`` is the same in PyTorch (when installed).
"""

from __future__ import annotations

import numpy as np

from ..models.tables import TableModel, initial_context


def _draw(rng: np.random.Generator, weights: np.ndarray) -> int:
    return int(rng.choice(weights.size, p=weights / weights.sum()))


def reference_round(rng: np.random.Generator, target: TableModel, draft: TableModel, context: np.ndarray,
                    k: int) -> list:
    """One round of Leviathan et al. (2023), Algorithm 1, in float64. Returns emitted tokens."""
    ctx = list(context)
    drafts, q_rows = [], []
    for _ in range(k):
        q = draft.probs_np(np.array(ctx[len(ctx) - draft.order :] if draft.order else [], dtype=np.int64))[0]
        x = _draw(rng, q)
        drafts.append(x)
        q_rows.append(q)
        ctx.append(x)
    window = np.array(list(context)[len(context) - target.order :] + drafts if target.order else drafts,
                      dtype=np.int64)
    p_rows = target.probs_np(window)  # k + 1 rows in one "parallel" call
    out = []
    for i, x in enumerate(drafts):
        if rng.random() < p_rows[i][x] / q_rows[i][x]:
            out.append(x)
            continue
        res = np.maximum(p_rows[i] - q_rows[i], 0.0)
        out.append(_draw(rng, res))
        return out
    out.append(_draw(rng, p_rows[k]))
    return out


def reference_sequences(target: TableModel, draft: TableModel, k: int, length: int, n: int,
                        seed: int = 0) -> np.ndarray:
    """``n`` sequences of the first ``length`` stream tokens, each from a fresh context."""
    rng = np.random.default_rng(seed)
    width = max(target.order, draft.order)
    out = np.empty((n, length), dtype=np.int64)
    for s in range(n):
        ctx = list(initial_context(width))
        seq: list = []
        while len(seq) < length:
            toks = reference_round(rng, target, draft, np.array(ctx[len(ctx) - width :] if width else []), k)
            seq.extend(toks)
            ctx.extend(toks)
        out[s] = seq[:length]
    return out


def numpy_rounds(p: np.ndarray, q: np.ndarray, k: int, rounds: int, seed: int = 0):
    """Vectorised numpy standard rounds on a context-free pair (the benchmark baseline).

    Returns the histogram of accepted drafts and the per-token counts of emitted tokens.
    """
    rng = np.random.default_rng(seed)
    v = p.size
    cq = np.cumsum(q)
    res = np.maximum(p - q, 0.0)
    res = res / res.sum() if res.sum() > 0 else p
    cres, cp = np.cumsum(res), np.cumsum(p)
    u = rng.random((rounds, 2 * k + 1))
    drafts = np.minimum(np.searchsorted(cq, u[:, :k] * cq[-1], side="right"), v - 1)
    accept = u[:, k : 2 * k] * q[drafts] < p[drafts]
    j = np.cumprod(accept, axis=1).sum(axis=1)
    last = np.where(j < k, np.searchsorted(cres, u[:, -1] * cres[-1], side="right"),
                    np.searchsorted(cp, u[:, -1] * cp[-1], side="right"))
    last = np.minimum(last, v - 1)
    counts = np.bincount(last, minlength=v)
    mask = np.arange(k) < j[:, None]
    counts += np.bincount(drafts[mask], minlength=v)
    return np.bincount(j, minlength=k + 1), counts


def torch_rounds(p: np.ndarray, q: np.ndarray, k: int, rounds: int, seed: int = 0):
    """:func:`numpy_rounds` in PyTorch on its default device (the CPU here), for the benchmarks.

    Raises ImportError when torch is not installed. Returns the same two histograms.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    v = p.size
    pt, qt = torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64)
    res = torch.clamp(pt - qt, min=0.0)
    res = res / res.sum() if res.sum() > 0 else pt
    cq, cres, cp = torch.cumsum(qt, 0), torch.cumsum(res, 0), torch.cumsum(pt, 0)
    u = torch.rand((rounds, 2 * k + 1), generator=gen, dtype=torch.float64)
    drafts = torch.clamp(torch.searchsorted(cq, u[:, :k] * cq[-1], right=True), max=v - 1)
    accept = u[:, k : 2 * k] * qt[drafts] < pt[drafts]
    j = torch.cumprod(accept.to(torch.int64), dim=1).sum(dim=1)
    last = torch.where(j < k, torch.searchsorted(cres, u[:, -1] * cres[-1], right=True),
                       torch.searchsorted(cp, u[:, -1] * cp[-1], right=True))
    last = torch.clamp(last, max=v - 1)
    counts = torch.bincount(last, minlength=v)
    mask = torch.arange(k) < j[:, None]
    counts += torch.bincount(drafts[mask], minlength=v)
    return torch.bincount(j, minlength=k + 1).numpy(), counts.numpy()
