"""The rounds a whole generate loop reveals, as records (``verify --generate ... --record DIR``).

A black-box loop returns its tokens and which of them were accepted drafts (provenance,
``from_draft``), not the drafts it rejected. With the loop's draft length k its rounds can still be
rebuilt: a round starts at position 0 and after every token that is not an accepted draft; it holds
the accepted drafts, then the token at its stop, a bonus if k drafts were accepted, else the token
drawn after a rejection. What is known of each round is recorded from the two models' teacher-forced
rows at the tokens the loop emitted:

* the accepted drafts, with q(x) and p(x) (so the support checks see them);
* the rejected draft, and those after it, as -1 (not logged), with NaN fields;
* ``accept_rate``: each reached slot's probability of acceptance averaged over the draft's law,
  sum min(p, q) (exact-match: sum p q); acceptance is tested against it, a valid expectation
  whatever the draft was, since it conditions only on the round's context;
* the stop token's CDF interval under norm(max(0, p - q)) after a rejection (that residual does not
  depend on the rejected draft; exact-match: norm(p (1 - q)), averaged over it) and p for the bonus.

Drafting is not tested from such records (the logged drafts are the accepted ones, not a sample of
q). A round is kept only if it starts at least k + 1 tokens before the end of the L tokens tested,
so that whether it is kept does not depend on how it ends.
"""

from __future__ import annotations

import numpy as np

from ..laws.rounds import round_starts
from .fields import _at, _cdf_at, accept_rate, stop_law


class LoopRecordError(ValueError):
    """Provenance that cannot be a loop of draft length k: the message says what is wrong."""


def loop_rounds(prompt, seqs, from_draft, target_probs, draft_probs, k: int, rule: str = "standard",
                rows_per_call: int = 1 << 24) -> dict:
    """The rounds of ``seqs`` [n, L] (provenance ``from_draft`` [n, L]) as record columns.

    ``target_probs`` and ``draft_probs`` map token arrays [N, T] to teacher-forced probability rows
    [N, T, V] (row t: the law of the token after ``tokens[:, : t + 1]``). Returns ``sequence``
    (which sequence each round is from), ``round``, ``drafts`` [R, k], ``tokens`` [R, k + 1],
    ``n_emitted`` [R] and the compact fields with ``accept_rate`` (module docstring).
    """
    prompt = np.asarray(prompt, np.int64).ravel()
    seqs, from_draft = np.asarray(seqs, np.int64), np.asarray(from_draft, bool)
    n, length = seqs.shape
    k = int(k)
    if k < 1:
        raise LoopRecordError(f"a loop's draft length is at least 1, got k = {k}")
    # the first token at or after each position that is not an accepted draft: where a round there stops
    stop_at = np.full((n, length + 1), length, np.int64)
    for t in range(length - 1, -1, -1):
        stop_at[:, t] = np.where(from_draft[:, t], stop_at[:, t + 1], t)
    start = round_starts(from_draft)
    s_idx, pos = np.nonzero(start)
    n_acc = stop_at[s_idx, pos] - pos
    fits = pos + k + 1 <= length  # every outcome of the round lies within the L tokens
    long = fits & (n_acc > k)
    if long.any():
        j = int(np.flatnonzero(long)[0])
        raise LoopRecordError(f"sequence {int(s_idx[j])} accepted {int(n_acc[j])} drafts in a row from position "
                              f"{int(pos[j])}, more than k = {k}: give the loop's draft length (a loop of adaptive k "
                              "cannot be recorded)")
    s_idx, pos, n_acc = s_idx[fits], pos[fits], n_acc[fits]
    r = s_idx.size
    # the round's index within its sequence: starts before it in that sequence
    round_no = (np.cumsum(start, axis=1) - 1)[s_idx, pos]
    slots = np.arange(k + 1)
    at = np.minimum(pos[:, None] + slots[None], length - 1)  # [R, k + 1] positions of the round's slots
    emitted = slots[None] <= n_acc[:, None]
    tokens = np.where(emitted, seqs[s_idx[:, None], at], 0)
    known = slots[None, :k] < n_acc[:, None]
    drafts = np.where(known, tokens[:, :k], -1)
    out = {"sequence": s_idx, "round": round_no, "drafts": drafts, "tokens": tokens, "n_emitted": n_acc + 1}
    nan = np.full((r, k), np.nan)
    out.update(q_draft=nan.copy(), p_draft=nan.copy(), q_cdf_lo=nan.copy(), q_cdf_hi=nan.copy(),
               accept_rate=nan.copy(), stop_cdf_lo=np.zeros(r), stop_cdf_hi=np.zeros(r))
    if r == 0:
        return out
    # teacher-forced rows, a slice of sequences at a time (only those with kept rounds)
    uniq = np.unique(s_idx)
    lo, step = 0, 1  # one sequence first: its rows give V, and so how many sequences a call may take
    while lo < uniq.size:
        part = uniq[lo : lo + step]
        lo += part.size
        toks = np.concatenate([np.broadcast_to(prompt, (part.size, prompt.size)), seqs[part, :-1]], axis=1)
        p_rows = np.asarray(target_probs(toks), np.float64)[:, prompt.size - 1 :]  # [m, L, V]: position t's law
        q_rows = np.asarray(draft_probs(toks), np.float64)[:, prompt.size - 1 :]
        step = max(1, rows_per_call // max(1, length * p_rows.shape[-1]))
        which = np.flatnonzero(np.isin(s_idx, part))
        row = np.searchsorted(part, s_idx[which])
        p_slot, q_slot = p_rows[row[:, None], at[which]], q_rows[row[:, None], at[which]]  # [w, k + 1, V]
        reached = slots[None, :k] <= n_acc[which, None]
        kn = known[which]
        x = np.where(kn, drafts[which], 0)
        out["q_draft"][which] = np.where(kn, _at(q_slot[:, :k], x), np.nan)
        out["p_draft"][which] = np.where(kn, _at(p_slot[:, :k], x), np.nan)
        out["accept_rate"][which] = np.where(reached, accept_rate(q_slot[:, :k], p_slot[:, :k], rule), np.nan)
        w = np.arange(which.size)
        stop = n_acc[which]
        law = stop_law(q_slot[w, np.minimum(stop, k - 1)], p_slot[w, stop], np.full(which.size, -1), stop < k, rule)
        out["stop_cdf_lo"][which], out["stop_cdf_hi"][which] = _cdf_at(law, tokens[which, stop])
    return out
