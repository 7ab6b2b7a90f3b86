"""What a record file must hold before it is counted: every bad file is refused in one line.

An audit that counted a NaN probability, a CDF of 1.7 or a file of no rounds would give a verdict
about nothing, and a traceback from deep in numpy helps nobody. Each check names the file, the
column and the first bad row (counted from 0 within the file), and says what the format wants
(``docs/records.md``); :class:`~.records.RecordError` carries it to the command line, which exits 2.

Only what the audit reads is checked: the draft's rows and fields at every slot (each draft was drawn
from q, the rejected ones and those after them too: drafting's PIT reads them all), the target's at
the slots the round reached (a target row after the round's stop may hold anything, NaN included),
``accept_rate`` wherever it is not NaN.
"""

from __future__ import annotations

import numpy as np

ROW_SUM_TOL = 1e-3  # a probability row may sum to 1 within this (float32 rows of 256k tokens, normalised there)
CDF_TOL = 1e-6  # compact CDFs may stray this far outside [0, 1] and out of order (float rounding)

_INTS = "an integer"
_LIST_INTS = "a list of integers"
_LIST_FLOATS = "a list of floats"
_FLOAT = "a float"
_LIST_LIST = "a list of lists of floats (one row of V a slot)"


def _kind(pa, t) -> str:
    types = pa.types
    if types.is_string(t) or types.is_large_string(t):
        return "string"
    if types.is_integer(t):
        return _INTS
    if types.is_floating(t):
        return _FLOAT
    if types.is_list(t) or types.is_large_list(t) or types.is_fixed_size_list(t):
        inner = _kind(pa, t.value_type)
        return {_INTS: _LIST_INTS, _FLOAT: _LIST_FLOATS, _LIST_FLOATS: _LIST_LIST}.get(inner, f"a list of {inner}")
    return str(t)


EXPECTED = {"request_id": "string", "round": _INTS, "k": _INTS, "drafts": _LIST_INTS, "emitted": _LIST_INTS,
            "q_draft": _LIST_FLOATS, "p_draft": _LIST_FLOATS, "q_cdf_lo": _LIST_FLOATS, "q_cdf_hi": _LIST_FLOATS,
            "stop_cdf_lo": _FLOAT, "stop_cdf_hi": _FLOAT, "accept_rate": _LIST_FLOATS,
            "q_rank_lo": _LIST_FLOATS, "q_rank_hi": _LIST_FLOATS, "stop_rank_lo": _FLOAT, "stop_rank_hi": _FLOAT,
            "q_rows": _LIST_LIST, "p_rows": _LIST_LIST, "q_logits": _LIST_LIST, "p_logits": _LIST_LIST}


class Bad(ValueError):
    """One bad value: ``column``, ``row`` (within the batch) and what is wrong."""

    def __init__(self, column: str, row, what: str):
        super().__init__(what)
        self.column, self.row, self.what = column, row, what


def check_types(schema, pa) -> None:
    """Every column the audit reads has its format's type (``request_id`` a string, ``drafts`` a list of
    integers, ...): raise :class:`Bad` naming the first that has not."""
    for name in schema.names:
        want = EXPECTED.get(name)
        if want is None:
            continue
        got = _kind(pa, schema.field(name).type)
        numeric_string = want == "string" and got == _INTS  # an integer id is a fine id
        if got != want and not numeric_string:
            raise Bad(name, None, f"is {got} ({schema.field(name).type}); the record format wants {want}")


def check_nulls(batch, names) -> None:
    """No null in a column the audit reads, nor inside its lists."""
    for name in names:
        if name not in batch.schema.names:
            continue
        col = batch.column(name)
        if col.null_count:
            raise Bad(name, int(np.flatnonzero(np.asarray(col.is_null()))[0]), "is null; every round needs a value")
        if _no_nulls_below(col):
            continue
        inner = col
        depth = 0
        while hasattr(inner, "flatten") and hasattr(inner.type, "value_type"):
            offsets = inner.offsets.to_numpy()
            child = inner.flatten()
            depth += 1
            if child.null_count:
                j = int(np.flatnonzero(np.asarray(child.is_null()))[0])
                row = int(np.searchsorted(offsets, j, side="right") - 1)
                for _ in range(depth - 1):  # back out through the outer lists
                    row = int(np.searchsorted(outer_offsets, row, side="right") - 1)
                raise Bad(name, row, "holds a null value; write NaN where a value is not known (docs/records.md)")
            outer_offsets, inner = offsets, child


def _no_nulls_below(col) -> bool:
    """No null in any list level's values buffers (a superset of what the column's rows hold; cheap)."""
    inner = col
    while hasattr(inner, "values") and hasattr(inner.type, "value_type"):
        inner = inner.values
        if inner.null_count:
            return False
    return True


def check_lengths(name: str, lengths: np.ndarray, want, what: str) -> None:
    """Every list of ``name`` has ``want`` entries (an int, or an array a row)."""
    bad = np.flatnonzero(lengths != want)
    if bad.size:
        j = int(bad[0])
        w = want if np.ndim(want) == 0 else int(np.asarray(want)[j])
        raise Bad(name, j, f"has {int(lengths[j])} entries where {w} are expected ({what})")


def reached(n_emitted: np.ndarray, k: int) -> np.ndarray:
    """(b, k + 1): whether each slot was reached (0 .. the stop, the slot of the last emitted token)."""
    stop = np.clip(np.asarray(n_emitted) - 1, 0, k)
    return np.arange(k + 1)[None, :] <= stop[:, None]


def check_rows(name: str, rows: np.ndarray, used: np.ndarray, logits: bool) -> np.ndarray:
    """Full rows (b, slots, V) at the slots used: probabilities finite, non-negative and summing to 1
    within :data:`ROW_SUM_TOL`, or logits finite or -inf with one finite. Returns the rows as logged."""
    if logits:
        bad = used[..., None] & (np.isnan(rows) | (rows == np.inf))
        if bad.any():
            j, s, _ = np.argwhere(bad)[0]
            raise Bad(name, int(j), f"slot {int(s)} holds NaN or +inf logits; logits are finite, or -inf for a "
                                    "token the sampler forbids")
        none = used & ~np.any(np.isfinite(rows), axis=-1)
        if none.any():
            j, s = np.argwhere(none)[0]
            raise Bad(name, int(j), f"slot {int(s)} forbids every token (all logits -inf)")
        return rows
    bad = used[..., None] & ~(np.isfinite(rows) & (rows >= 0))
    if bad.any():
        j, s, v = np.argwhere(bad)[0]
        raise Bad(name, int(j), f"slot {int(s)} holds {float(rows[j, s, v])!r} at token {int(v)}; probabilities are "
                                "finite and non-negative (a row after the round's stop may hold NaN)")
    sums = rows.sum(axis=-1)
    off = used & (np.abs(sums - 1.0) > ROW_SUM_TOL)
    if off.any():
        j, s = np.argwhere(off)[0]
        raise Bad(name, int(j), f"slot {int(s)} sums to {sums[j, s]:.6g}; a row of probabilities sums to 1 within "
                                f"{ROW_SUM_TOL:g} (log the law after the sampler's whole chain, normalised; or log "
                                "logits)")
    return rows


def check_compact(out: dict, k: int) -> None:
    """The compact fields at the slots reached: probabilities and CDFs in [0, 1], each CDF's low end at
    most its high end; NaN only in a file whose drafts are not all logged (with ``accept_rate``)."""
    draft, stop = _columns("q_rank_lo" in out)
    if _within(out, draft, stop):  # the usual file: every value in range and in order, found in a few passes
        return
    at = reached(out["n_emitted"], k)[:, :k]
    # with accept_rate (drafts not all logged) acceptance is tested on average and drafting not at all, so a
    # draft's own fields may be unknown: NaN
    unlogged = np.full(out["drafts"].shape, "accept_rate" in out)
    every = np.ones_like(at)
    for name in draft:
        v = out[name]
        nan_ok = np.isnan(v) & unlogged
        # every draft was drawn from q, after the stop too (drafting's PIT reads them all); p(x) is read
        # where the draft was tested
        where = at if name == "p_draft" else every
        bad = where & ~nan_ok & ~((v >= -CDF_TOL) & (v <= 1 + CDF_TOL))
        if bad.any():
            j, s = np.argwhere(bad)[0]
            raise Bad(name, int(j), f"slot {int(s)} holds {float(v[j, s])!r}; it is a probability in [0, 1] (NaN "
                                    "only where drafts are not all logged, with accept_rate)")
    for lo_name, hi_name in zip(draft[2::2], draft[3::2]):
        order = out[lo_name] > out[hi_name] + CDF_TOL
        if order.any():
            j, s = np.argwhere(order)[0]
            raise Bad(lo_name, int(j), f"slot {int(s)}: F(x-) = {float(out[lo_name][j, s])!r} exceeds F(x) = "
                                       f"{float(out[hi_name][j, s])!r}; the low end of a draft's CDF interval is at "
                                       "most its high end")
    for name in stop:
        v = out[name]
        bad = ~((v >= -CDF_TOL) & (v <= 1 + CDF_TOL))
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise Bad(name, j, f"holds {float(v[j])!r}; it is a CDF value in [0, 1]")
    for lo_name, hi_name in zip(stop[::2], stop[1::2]):
        order = out[lo_name] > out[hi_name] + CDF_TOL
        if order.any():
            j = int(np.flatnonzero(order)[0])
            raise Bad(lo_name, j, f"F(y-) = {float(out[lo_name][j])!r} exceeds F(y) = {float(out[hi_name][j])!r}")


def _columns(rank: bool) -> tuple[tuple, tuple]:
    """The compact columns checked, a slot's and the stop's: values, then (low, high) pairs of CDF ends."""
    draft = ("q_draft", "p_draft", "q_cdf_lo", "q_cdf_hi") + (("q_rank_lo", "q_rank_hi") if rank else ())
    stop = ("stop_cdf_lo", "stop_cdf_hi") + (("stop_rank_lo", "stop_rank_hi") if rank else ())
    return draft, stop


def _within(out: dict, draft: tuple, stop: tuple) -> bool:
    """Whether every compact value lies in [-CDF_TOL, 1 + CDF_TOL] with each low end at most its high end
    plus CDF_TOL: then :func:`check_compact` has nothing to say. min and max carry NaN through (a NaN
    compares False), so a NaN, allowed or not, sends the batch to the exact checks."""
    for name in draft + stop:
        v = out[name]
        if v.size and not (v.min() >= -CDF_TOL and v.max() <= 1 + CDF_TOL):
            return False
    for lo, hi in zip(draft[2::2] + stop[::2], draft[3::2] + stop[1::2]):
        # lo - hi <= tol / 2, rounded, puts lo below hi + tol however that sum rounds (CDF values lie in [0, 1])
        if out[lo].size and not np.subtract(out[lo], out[hi]).max() <= CDF_TOL / 2:
            return False
    return True


def check_rates(rates: np.ndarray) -> None:
    """``accept_rate`` in [0, 1] wherever it is not NaN (NaN: a slot the round did not reach)."""
    bad = ~np.isnan(rates) & ~((rates >= 0) & (rates <= 1))
    if bad.any():
        j, s = np.argwhere(bad)[0]
        raise Bad("accept_rate", int(j), f"slot {int(s)} holds {float(rates[j, s])!r}; an acceptance probability is in "
                                         "[0, 1] (NaN at slots the round did not reach)")
