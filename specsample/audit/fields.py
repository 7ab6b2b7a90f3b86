"""The compact fields of a recorded round, computed from the engine's raw rows (or logits).

A round of speculative sampling is audited from a few numbers, whatever the vocabulary:

* ``q_draft[i]``, ``p_draft[i]``: q(x_i) and p(x_i) of each draft x_i, from slot i's rows;
* ``q_cdf_lo[i]``, ``q_cdf_hi[i]``: F_q(x_i -) and F_q(x_i), the draft's place in its own row of
  q (token-id order), so drafting is tested by a randomised probability integral transform (PIT);
* ``stop_cdf_lo``, ``stop_cdf_hi``: F(y -) and F(y) of the token y emitted where the round stopped,
  under the law it must follow there: norm(max(0, p - q)) after a rejection, p for the bonus
  (the exact-match rule: p without the rejected draft, renormalised; p for the bonus);
* ``q_rank_lo``, ``q_rank_hi``, ``stop_rank_lo``, ``stop_rank_hi`` (format 2): the same intervals
  with the tokens in their law's own probability-rank order (most probable first, ties by id). Binned,
  the PIT in token-id order spreads a wrong row over thousands of tokens a bin at a large vocabulary;
  in rank order a law whose mass sits on other tokens than the target's moves the first bins.

If y follows that law, U = F(y -) + V (F(y) - F(y -)) with V uniform on (0, 1) is uniform on
(0, 1) (Brockwell 2007), and a law off by total variation d moves U's law by exactly d. The law is
always recomputed here from the raw rows: never taken from the engine's own residual.

:func:`compact_fields` is the numpy reference; :func:`compact_fields_torch` computes the same on
the logits' own torch device (a GPU included), for an engine's hook.

References
----------
Brockwell, A. E. (2007). Universal residuals: a multivariate transformation. *Statistics &
Probability Letters* 77(14), 1473-1478.
"""

from __future__ import annotations

import numpy as np

from ..laws.rounds import ACCEPTANCE

RULES = tuple(ACCEPTANCE)  # "standard", "exact-match"


def _probs(x, logits: bool) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if not logits:
        return x
    x = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def _cdf_at(row: np.ndarray, token: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """F(token -) and F(token) of each row (last axis) at ``token``; an id outside the vocabulary
    gets the empty interval (0, 0): probability 0, which the audit's support check fails."""
    inside = (token >= 0) & (token < row.shape[-1])
    t = np.where(inside, token, 0)[..., None]
    lo = np.take_along_axis(np.cumsum(row, axis=-1) - row, t, -1)[..., 0]  # exclusive prefix sum: F(y -)
    mass = np.take_along_axis(row, t, -1)[..., 0]
    return np.where(inside, lo, 0.0), np.where(inside, lo + mass, 0.0)


def _rank_at(row: np.ndarray, token: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """F(token -) and F(token) in the row's own probability-rank order (most probable first, ties by id):
    the mass of the tokens ranked before ``token``, and that plus its own. O(V) a row, no sort. An id
    outside the vocabulary gets (0, 0)."""
    inside = (token >= 0) & (token < row.shape[-1])
    t = np.where(inside, token, 0)
    px = np.take_along_axis(row, t[..., None], -1)
    ids = np.arange(row.shape[-1])
    before = (row > px) | ((row == px) & (ids < t[..., None]))
    lo = np.where(before, row, 0.0).sum(-1)
    return np.where(inside, lo, 0.0), np.where(inside, lo + px[..., 0], 0.0)


def stop_law(q_row: np.ndarray, p_row: np.ndarray, draft: np.ndarray, rejected: np.ndarray,
             rule: str = "standard") -> np.ndarray:
    """The law of the token emitted where a round stopped (rows on the last axis).

    After a rejection (``rejected`` true): norm(max(0, p - q)) for the standard rule (p where that
    vanishes, as the rule's fallback), p without the rejected draft for exact-match; else (the
    bonus, all drafts accepted): p. A ``draft`` of -1 is one not logged (a whole loop's rounds):
    the standard residual does not depend on it, and for exact-match the law is averaged over the
    rejected draft's law, norm(p (1 - q)).
    """
    draft = np.asarray(draft)
    if rule == "standard":
        res = np.maximum(p_row - q_row, 0.0)
    elif rule == "exact-match":
        res = p_row.copy()
        np.put_along_axis(res, np.maximum(draft, 0)[..., None], 0.0, -1)
        res = np.where((draft < 0)[..., None], p_row * (1.0 - q_row), res)
    else:
        raise ValueError(f"unknown rule {rule!r}; records follow one of {', '.join(RULES)}")
    total = res.sum(axis=-1, keepdims=True)
    res = np.where(total > 0, res / np.where(total > 0, total, 1.0), p_row)
    return np.where(np.asarray(rejected)[..., None], res, p_row)


def accept_rate(q_row: np.ndarray, p_row: np.ndarray, rule: str = "standard") -> np.ndarray:
    """The probability that a draft from ``q_row`` is accepted (rows on the last axis), averaged over
    the draft: sum min(p, q) for the standard rule, sum p q for exact-match. What the acceptance
    of a slot is tested against when its drafts were not all logged (``accept_rate``, docs/records.md)."""
    if rule not in ACCEPTANCE:
        raise ValueError(f"unknown rule {rule!r}; records follow one of {', '.join(RULES)}")
    return ACCEPTANCE[rule](p_row, q_row)


def _at(row: np.ndarray, token: np.ndarray) -> np.ndarray:
    """row[token] on the last axis; 0 for an id outside the vocabulary."""
    inside = (token >= 0) & (token < row.shape[-1])
    return np.where(inside, np.take_along_axis(row, np.where(inside, token, 0)[..., None], -1)[..., 0], 0.0)


def compact_fields(drafts, tokens, n_emitted, q, p, *, rule: str = "standard", logits: bool = False) -> dict:
    """The compact fields of a batch of rounds.

    Parameters
    ----------
    drafts : int array (b, k)
        The drafted tokens.
    tokens : int array (b, k + 1)
        The emitted tokens, left-aligned; row j's first ``n_emitted[j]`` count.
    n_emitted : int array (b,)
        Tokens each round emitted, 1 to k + 1: the accepted drafts, then the token at the stop.
    q : float array (b, k, V)
        The draft's rows (probabilities, or logits with ``logits=True``), one per draft slot.
    p : float array (b, k + 1, V)
        The target's rows: k draft slots and the bonus slot.
    rule : {"standard", "exact-match"}
    logits : bool
        The rows are raw logits (softmax in float64 here).

    Returns
    -------
    dict of arrays: ``q_draft``, ``p_draft``, ``q_cdf_lo``, ``q_cdf_hi``, ``q_rank_lo``, ``q_rank_hi``
    (b, k); ``stop_cdf_lo``, ``stop_cdf_hi``, ``stop_rank_lo``, ``stop_rank_hi`` (b,). The ``rank``
    fields are the same intervals in each row's own probability-rank order (record format 2).

    Examples
    --------
    >>> q = np.array([[[0.5, 0.5]]]); p = np.array([[[0.9, 0.1], [0.3, 0.7]]])
    >>> f = compact_fields([[1]], [[0, 0]], [1], q, p)  # draft 1 rejected, token 0 emitted
    >>> float(f["p_draft"][0, 0]), float(f["stop_cdf_lo"][0]), float(f["stop_cdf_hi"][0])
    (0.1, 0.0, 1.0)
    """
    drafts = np.asarray(drafts, np.int64)
    tokens = np.asarray(tokens, np.int64)
    n_emitted = np.asarray(n_emitted, np.int64)
    qp, pp = _probs(q, logits), _probs(p, logits)
    b, k = drafts.shape
    if k == 0:  # a request given no drafts (a ragged batch): one token, the bonus, under p
        s_lo, s_hi = _cdf_at(pp[:, 0], tokens[:, 0])
        r_lo, r_hi = _rank_at(pp[:, 0], tokens[:, 0])
        empty = np.zeros((b, 0))
        return {"q_draft": empty, "p_draft": empty, "q_cdf_lo": empty, "q_cdf_hi": empty,
                "stop_cdf_lo": s_lo, "stop_cdf_hi": s_hi, "q_rank_lo": empty, "q_rank_hi": empty,
                "stop_rank_lo": r_lo, "stop_rank_hi": r_hi}
    q_lo, q_hi = _cdf_at(qp, drafts)
    q_draft, p_draft = _at(qp, drafts), _at(pp[:, :k], drafts)
    stop = np.clip(n_emitted - 1, 0, k)  # the slot where the round stopped
    rows = np.arange(b)
    rejected = stop < k
    slot_q = qp[rows, np.minimum(stop, k - 1)]
    law = stop_law(slot_q, pp[rows, stop], np.clip(drafts[rows, np.minimum(stop, k - 1)], 0, qp.shape[-1] - 1),
                   rejected, rule)
    s_lo, s_hi = _cdf_at(law, tokens[rows, stop])
    qr_lo, qr_hi = _rank_at(qp, drafts)
    r_lo, r_hi = _rank_at(law, tokens[rows, stop])
    return {"q_draft": q_draft, "p_draft": p_draft, "q_cdf_lo": q_lo, "q_cdf_hi": q_hi,
            "stop_cdf_lo": s_lo, "stop_cdf_hi": s_hi, "q_rank_lo": qr_lo, "q_rank_hi": qr_hi,
            "stop_rank_lo": r_lo, "stop_rank_hi": r_hi}


def compact_fields_torch(drafts, tokens, n_emitted, q_logits, p_logits, *, rule: str = "standard") -> dict:
    """:func:`compact_fields` from raw logits, on the logits' own torch device (float64 there).

    For an engine's hook: the rows never leave the device; a few numbers a round do. Returns
    torch tensors on that device, under the same names.
    """
    import torch

    dev = q_logits.device
    drafts = torch.as_tensor(drafts, device=dev, dtype=torch.int64)
    tokens = torch.as_tensor(tokens, device=dev, dtype=torch.int64)
    n_emitted = torch.as_tensor(n_emitted, device=dev, dtype=torch.int64)
    qp = torch.softmax(q_logits.to(torch.float64), -1)
    pp = torch.softmax(p_logits.to(torch.float64), -1)
    b, k = drafts.shape

    def cdf_at(row, token):
        lo = torch.cumsum(row, -1) - row
        return lo.gather(-1, token[..., None])[..., 0], (lo + row).gather(-1, token[..., None])[..., 0]

    def rank_at(row, token):  # the mass ranked before the token (most probable first, ties by id)
        px = row.gather(-1, token[..., None])
        ids = torch.arange(row.shape[-1], device=dev)
        before = (row > px) | ((row == px) & (ids < token[..., None]))
        lo = torch.where(before, row, torch.zeros_like(row)).sum(-1)
        return lo, lo + px[..., 0]

    if k == 0:  # no drafts: the bonus alone, under p
        y0 = tokens[:, 0].clamp(0, pp.shape[-1] - 1)
        lo, hi = cdf_at(pp[:, 0], y0)
        r_lo, r_hi = rank_at(pp[:, 0], y0)
        empty = pp.new_zeros((b, 0))
        return {"q_draft": empty, "p_draft": empty, "q_cdf_lo": empty, "q_cdf_hi": empty,
                "stop_cdf_lo": lo, "stop_cdf_hi": hi, "q_rank_lo": empty, "q_rank_hi": empty,
                "stop_rank_lo": r_lo, "stop_rank_hi": r_hi}
    q_draft = qp.gather(-1, drafts[..., None])[..., 0]
    p_draft = pp[:, :k].gather(-1, drafts[..., None])[..., 0]
    q_lo, q_hi = cdf_at(qp, drafts)
    stop = (n_emitted - 1).clamp(0, k)
    rows = torch.arange(b, device=dev)
    rejected = stop < k
    slot = stop.clamp(max=k - 1)
    p_row, q_row = pp[rows, stop], qp[rows, slot]
    if rule == "standard":
        res = (p_row - q_row).clamp(min=0)
    elif rule == "exact-match":
        res = p_row.scatter(-1, drafts[rows, slot][:, None], 0.0)
    else:
        raise ValueError(f"unknown rule {rule!r}; records follow one of {', '.join(RULES)}")
    total = res.sum(-1, keepdim=True)
    res = torch.where(total > 0, res / torch.where(total > 0, total, torch.ones_like(total)), p_row)
    law = torch.where(rejected[:, None], res, p_row)
    y = tokens[rows, stop].clamp(0, law.shape[-1] - 1)
    s_lo, s_hi = cdf_at(law, y)
    qr_lo, qr_hi = rank_at(qp, drafts)
    r_lo, r_hi = rank_at(law, y)
    return {"q_draft": q_draft, "p_draft": p_draft, "q_cdf_lo": q_lo, "q_cdf_hi": q_hi,
            "stop_cdf_lo": s_lo, "stop_cdf_hi": s_hi, "q_rank_lo": qr_lo, "q_rank_hi": qr_hi,
            "stop_rank_lo": r_lo, "stop_rank_hi": r_hi}
