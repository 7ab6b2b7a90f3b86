"""The end-to-end boundary pass: every random value a whole generate loop draws, at its extremes.

A loop that accepts with ``u <= p / q`` lets a draft the target forbids through when its uniform is
exactly 0, once in 2^24 (float32) or 2^53 (float64) draws: no budget of sequences sees it, and a
loop drafts, samples and accepts in an order specsample does not know. Here one sequence is drawn
with every torch/numpy random call recorded (:mod:`specsample.host.intercept`), then drawn again once per
(draw, element, extreme value) with that value forced and the seed the same, and each sequence is
checked token by token against the target's teacher-forced rows: a token of probability 0 after its
prefix, an id outside [0, V) or a short sequence is a violation. The loop's own target decides what
is forbidden, so test it with a target that forbids tokens the draft keeps (top-k or top-p on the
target only, say: :mod:`.mask`); with a target that forbids nothing the pass reaches nothing. New
sequences are drawn until at least 64 settings were tried (8 at every draw site). A setting counts as
reached only if it could have changed the output: at one of its extremes, the sequence changed.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..host import intercept
from ..host.eager import compilation_off
from ..battery.edges import EdgeResult
from .runner import _clean, _raw

MAX_ELEMENTS = 256  # drawn values of one sequence set to their extremes, in draw order
MIN_SETTINGS = 64  # forced settings tried in all before the pass stops drawing new sequences ...
MIN_PER_SITE = 8  # ... and at every draw site (function and dtype), where MAX_SEQUENCES allows
MAX_SEQUENCES = 64


def generate_boundary_check(model, generate: Callable, prompt, length: int, *, seed: int = 0,
                            max_elements: int = MAX_ELEMENTS, label: str = "boundary",
                            batched: bool = False, eos=None, min_settings: int = MIN_SETTINGS,
                            max_sequences: int = MAX_SEQUENCES, draft=None) -> EdgeResult:
    """``model``: the target's teacher-forced rows (:class:`specsample.loops.verify._TeacherForced`, which
    knows ``eos``); ``batched``: ``generate`` takes a batch (one row is drawn); a sequence is cut
    and padded at ``eos`` as the statistical cases do.

    ``draft``: the draft's teacher-forced rows, when known. A forced value can expose ``u <= p / q`` only at
    a token the target forbids and the draft can draft; with the draft's rows, only such tokens on the
    sequences' prefixes count (a token both forbid, as a glue that bans an id in both models, does not),
    and without them every token the target forbids does (the detail says so).

    One sequence forces few values: a loop that draws 2-5 a sequence, with a forbidden draft only
    now and then, is caught at some seeds and passed at others. So sequences are drawn (each with
    its own seed, as the statistical cases' sequences) until ``min_settings`` forced settings have
    been tried in all and ``MIN_PER_SITE`` at every draw site, or ``max_sequences`` were drawn; the
    detail says how many were tried, per site.
    """
    prompt = np.asarray(prompt, np.int64).ravel()
    v = model.vocab_size

    def one(icpt, j: int) -> tuple:
        with icpt:
            (toks, _), = _raw(generate, label, prompt, length, seed, range(j, j + 1), batched)
        return _clean(np.asarray(toks, np.int64), length, eos, v)

    runs, tried, draws = [], {}, []  # runs: (setting, draws of its sequence, (tokens, malformed), applied)
    moved: dict = {}  # (sequence, draw, element) -> whether forcing it, to either extreme, changed the sequence
    with compilation_off(generate) as turned_off:  # compiled code as Python: its draws seen and forced
        for j in range(max_sequences):
            rec = intercept.Interceptor()
            base = one(rec, j)
            runs.append((None, rec.draws, base, True))
            draws += rec.draws
            for setting in intercept.settings(rec.draws, max_elements):
                icpt = intercept.Interceptor(setting)
                out = one(icpt, j)
                runs.append((setting, rec.draws, out, icpt.applied))
                key = (j,) + tuple(setting[:2])
                moved[key] = moved.get(key, False) or (icpt.applied and not np.array_equal(out[0], base[0]))
                site = rec.draws[setting[0]].site
                tried[site] = tried.get(site, 0) + int(icpt.applied)
            if not draws or (sum(tried.values()) >= min_settings and min(tried.values()) >= MIN_PER_SITE):
                break
    # "reached" is "could have changed the output": a setting whose value, at either extreme, changed the
    # sequence (a lower bound: a value that decides nothing on this sequence, as a forbidden draft's
    # uniform in a correct loop, is not counted)
    fired: dict = {}
    j = -1
    for s, seq_draws, _, applied in runs:
        j += s is None
        if s is not None and applied and moved[(j,) + tuple(s[:2])]:
            site = seq_draws[s[0]].site
            fired[site] = fired.get(site, 0) + 1
    seqs = np.stack([toks for _, _, (toks, _), _ in runs])  # [runs, length], cut and padded at EOS
    malformed = np.array([bad for _, _, (_, bad), _ in runs])  # ids outside [0, V), short, or tokens after EOS
    rows = model.probs(np.concatenate([np.broadcast_to(prompt, (len(runs), prompt.size)), seqs[:, :-1]], axis=1))
    rows = np.asarray(rows, np.float64)[:, prompt.size - 1 :]
    hit = np.take_along_axis(rows, seqs[..., None], axis=2)[..., 0]
    zero = (hit == 0) & ~malformed[:, None]
    broken = malformed | zero.any(axis=1)
    reached = sum(fired.values())
    if draft is not None:  # a token the target forbids and the draft can draft: what a forced uniform exposes
        q_rows = draft.probs(np.concatenate([np.broadcast_to(prompt, (len(runs), prompt.size)), seqs[:, :-1]], axis=1))
        q_rows = np.asarray(q_rows, np.float64)[:, prompt.size - 1 :]
        n_forbidden = int(((rows == 0) & (q_rows > 0)).sum())
        both = int(((rows == 0) & (q_rows == 0)).sum())
    else:
        n_forbidden, both = int((rows == 0).sum()), 0
    sequences = sum(s is None for s, _, _, _ in runs)
    per_site = ", ".join(f"{site} {fired.get(site, 0)} of {n}" for site, n in tried.items())
    first = ""
    if broken.any():
        i = int(np.argmax(broken))
        s, seq_draws = runs[i][0], runs[i][1]
        where = "an unforced sequence" if s is None else (
            f"{seq_draws[s[0]].function} draw {s[0]} element {s[1]} = {s[2]:.9g}")
        t = int(np.argmax(zero[i])) if zero[i].any() else -1
        what = (f"token {int(seqs[i, t])} at position {t}, which the target gives probability 0 after its prefix"
                if t >= 0 else "ids outside the vocabulary or a short sequence")
        first = f"; first: {where}: {what}"
    if broken.any():
        detail = (f"{int(broken.sum())} of {len(runs)} sequences broken ({sum(tried.values())} settings tried; that "
                  f"changed the sequence, per site: {per_site}){first}")
    elif not tried or sum(tried.values()) == 0:
        detail = f"not reached: the loop drew nothing specsample can set ({intercept.describe(draws)})"
    elif reached == 0:
        detail = (f"not reached: none of the {sum(tried.values())} forced settings changed a sequence ({per_site}; "
                  f"draws: {intercept.describe(draws[:6])}{' ...' if len(draws) > 6 else ''}): the values "
                  "specsample can set decide nothing the loop emits")
    elif not n_forbidden:  # no forced value could have emitted a forbidden token: nothing was reached
        which = ("the target forbids no token the draft can draft on these prefixes"
                 + (f" ({both} it forbids, the draft forbids too)" if both else "")
                 if draft is not None else "the target forbids no token on these prefixes")
        detail = (f"not reached: {which} ({sequences} sequences; draws: "
                  f"{intercept.describe(draws[:6])}{' ...' if len(draws) > 6 else ''}), so a forced "
                  "uniform cannot expose u <= p / q; mask the target to its top-k (specsample.loops.mask) and "
                  "run again")
        reached = 0
    else:
        hazards = (f"{n_forbidden} tokens the target forbids and the draft can draft on these prefixes"
                   if draft is not None else f"{n_forbidden} tokens the target forbids on these prefixes (without "
                   "the draft's rows, --draft-next-token, tokens both models forbid count too)")
        detail = (f"{sum(tried.values())} settings tried over {sequences} sequences, {reached} of which changed the "
                  f"sequence (could fire), per site: {per_site}; {hazards}; draws: "
                  f"{intercept.describe(draws[:6])}{' ...' if len(draws) > 6 else ''}: no forbidden token")
    if turned_off:
        detail += f"; compiled code run as Python for this pass: {', '.join(turned_off)}"
    return EdgeResult(len(runs), reached, int(broken.sum()), detail)
