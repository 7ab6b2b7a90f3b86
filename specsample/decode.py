"""Decoding: greedy against MAP, and exact MAP by dynamic programming over token windows.

Greedy decoding takes the most probable next token at every step. It is *not* MAP
decoding (the most probable whole sequence): greedy commits at the first step, and a
branch that starts less likely but continues with concentrated conditionals can hold the
most probable sequence (:func:`two_letter_example`). The greedy speculative scheme
reproduces greedy decoding of p, not its MAP sequence.

For a model whose next token depends on the previous m tokens, the MAP sequence of length
T is found exactly by dynamic programming over the V^m windows of the last m tokens::

    psi_T(w) = 0
    psi_t(w) = max_x [ log p(x | w) + psi_{t+1}(shift(w, x)) ]      (t = T-1, ..., 0)

where ``psi_t(w)`` is the largest log-probability of the remaining ``T - t`` tokens given
the window ``w``, and ``shift(w, x)`` drops w's oldest token and appends x. The sequence is
then read forwards from the starting window: at each step the lowest token id that attains
the maximum. That is Viterbi's recursion run from the end, which costs the same
O(T V^(m+1)) as the forward form with back-pointers (m = 1: Viterbi's O(T V^2); m = T - 1:
brute force's O(V^T)) and makes the tie rule exact: among all most probable sequences the
one returned is the lexicographically first (lowest ids first), which forward back-pointers
cannot guarantee (two tied prefixes ending in one window differ in tokens the back-pointer
no longer sees). Positions before a full window are handled by the context: every stream
starts from the model's initial context (token 0 repeated), as in the engine.

Everything is numpy float64 in log space (no underflow at T = 1000). Log-probabilities
that agree to within ``TIE_RTOL`` (relative) are ties: a sum of T logs taken in another
order can differ by a few ulps, and the two searches must agree on which sequences tie.

References
----------
Viterbi, A. J. (1967). Error bounds for convolutional codes and an asymptotically optimum
decoding algorithm. IEEE Trans. Inf. Theory 13(2), 260-269.
Forney, G. D. (1973). The Viterbi algorithm. Proc. IEEE 61(3), 268-278.

Examples
--------
>>> from specsample import decode
>>> ex = decode.two_letter_example()
>>> decode.greedy(ex, 3).sequence, decode.dp_map(ex, 3).sequence
((0, 0, 0), (1, 1, 1))
"""

from __future__ import annotations

import itertools
import textwrap
import time
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from .models.tables import TableModel, initial_context, lift, ngram, random_ngram, window_index
from .timing import best_of

TIE_RTOL = 1e-9
MAX_DP_CELLS = 1 << 27  # psi table (T x V^m) plus the V^(m+1) step arrays, in float64 cells
MAX_BRUTE_SEQUENCES = 1 << 22
CLI_BRUTE_SEQUENCES = 1 << 20  # the CLI adds brute force up to here (about half a second)
_BATCH = 1 << 16


class Decoded(NamedTuple):
    """A decoded sequence and its log-probability under the model (natural log)."""

    sequence: tuple
    log_prob: float


class DPDecoded(NamedTuple):
    """The MAP sequence from :func:`dp_map`, its log-probability and the work it took.

    ``updates`` counts (window, next token) relaxations: T * V^(m+1).
    """

    sequence: tuple
    log_prob: float
    updates: int


# --- input checks ----------------------------------------------------------------------


def _is_table(model) -> bool:
    return isinstance(model, TableModel)


def _check(model, length: int, *, table_only: bool = False) -> None:
    from .models.transformer import Transformer  # a model kind beside the tables

    if not _is_table(model) and (table_only or not isinstance(model, Transformer)):
        what = "an n-gram TableModel" if table_only else "a TableModel or a transformer.Transformer"
        why = (" (the DP needs a model whose next token depends on the last m tokens; a transformer "
               "depends on the whole prefix: use brute_force_map)" if isinstance(model, Transformer) else "")
        raise TypeError(f"this decoder takes {what}, got {type(model).__name__}{why}")
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise ValueError(f"the sequence length T must be an integer >= 1, got {length!r}")
    if _is_table(model) and np.asarray(model.table).ndim != 2:
        raise ValueError("decode takes one model, not a batch of pairs (table must be 2-D)")


def _context(model, context) -> np.ndarray:
    """The tokens before the first decoded one: a table model's initial context, or a
    transformer's prompt (default: the one token 0)."""
    need = model.order if _is_table(model) else 1
    if context is None:
        return initial_context(need).astype(np.int64) if _is_table(model) else np.zeros(1, np.int64)
    c = np.asarray(context, dtype=np.int64).ravel()
    if c.size < need:
        raise ValueError(f"this model needs a context of at least {need} tokens, got {c.size}")
    if c.size and (c.min() < 0 or c.max() >= model.vocab_size):
        raise ValueError(f"context tokens must lie in [0, {model.vocab_size}), got {c.tolist()}")
    return c


def _rows(model, ctx: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    """Teacher-forced rows [N, T, V]: row t is the law of ``seqs[:, t]`` after ``ctx`` and ``seqs[:, :t]``."""
    n, t = seqs.shape
    if _is_table(model):  # rows follow windows of ``order`` tokens: T + 1 rows from order + T tokens
        head = ctx[ctx.size - model.order:]
        return model.probs_np(np.concatenate([np.broadcast_to(head, (n, head.size)), seqs], axis=1))[:, :t]
    # a transformer's row i follows tokens[: i + 1]
    toks = np.concatenate([np.broadcast_to(ctx, (n, ctx.size)), seqs], axis=1)
    return model.probs_np(toks)[:, ctx.size - 1: ctx.size - 1 + t]


def _log(p):
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(p, dtype=np.float64))


def _is_tie(a: np.ndarray, best: float) -> np.ndarray:
    return a >= best - TIE_RTOL * max(1.0, abs(best))


# --- the three decoders ------------------------------------------------------------------


def sequence_log_prob(model, sequence, context=None) -> float:
    """log p(sequence | context), summed position by position from the first token.

    Every decoder reports its sequence's log-probability through this one function, so
    the same sequence always gets the same number.
    """
    ctx = _context(model, context)
    seq = np.asarray(sequence, dtype=np.int64).ravel()
    rows = _rows(model, ctx, seq[None])[0]
    return float(np.sum(_log(rows[np.arange(seq.size), seq])))


def greedy(model, length: int, context=None) -> Decoded:
    """Greedy decoding: the most probable next token at each of ``length`` steps.

    ``model`` is a table model or a :class:`~specsample.models.transformer.Transformer` (whose
    ``context`` is its prompt, default the one token 0).

    Ties go to the lowest token id. Costs T rows of the model. This is the sequence the
    greedy speculative scheme must reproduce; it is not, in general, the MAP sequence.
    """
    _check(model, length)
    ctx = _context(model, context)
    toks = list(ctx)
    for _ in range(length):
        recent = toks[len(toks) - model.order:] if _is_table(model) else toks
        row = model.probs_np(np.asarray(recent, dtype=np.int64))[-1]
        toks.append(int(np.argmax(row)))  # argmax returns the first maximum: the lowest id
    seq = tuple(toks[ctx.size:])
    return Decoded(seq, sequence_log_prob(model, seq, ctx))


def brute_force_map(model, length: int, context=None) -> Decoded:
    """MAP by enumerating all V^T sequences (small V and T only), teacher-forced in batches.

    Works for table models and transformers alike (a transformer's next token depends on its
    whole prefix, so brute force is its exact MAP).

    Ties (log-probabilities within ``TIE_RTOL``) go to the lexicographically first
    sequence. Costs O(T V^T).
    """
    _check(model, length)
    ctx = _context(model, context)
    v = model.vocab_size
    total = v**length
    if total > MAX_BRUTE_SEQUENCES:
        raise ValueError(f"brute force would enumerate V^T = {v}^{length} = {total:.3g} sequences "
                         f"(at most {MAX_BRUTE_SEQUENCES}); use dp_map")
    logp = np.empty(total)
    for start in range(0, total, _BATCH):
        ids = np.arange(start, min(total, start + _BATCH))
        seqs = (ids[:, None] // v ** np.arange(length - 1, -1, -1)) % v  # row-major: lexicographic
        rows = _rows(model, ctx, seqs)
        logp[ids] = np.sum(_log(np.take_along_axis(rows, seqs[..., None], axis=-1)[..., 0]), axis=1)
    best = int(np.argmax(_is_tie(logp, logp.max())))  # the first index within the tie band
    seq = tuple(int(x) for x in np.unravel_index(best, (v,) * length))
    return Decoded(seq, sequence_log_prob(model, seq, ctx))


def dp_map(model: TableModel, length: int, order: int | None = None, context=None) -> DPDecoded:
    """Exact MAP by dynamic programming over windows of the last ``order`` tokens.

    Parameters
    ----------
    model : TableModel
        Any n-gram model (tables of :mod:`specsample.models`).
    length : int
        T, the number of tokens to decode (>= 1).
    order : int, optional
        m, the window the DP keeps; at least the model's order (default: the model's
        order). A larger m gives the same answer at V^(m - order) times the cost.
    context : sequence of int, optional
        Tokens before the first decoded one (default: the initial context, token 0
        repeated).

    Returns
    -------
    DPDecoded
        ``sequence`` (the lexicographically first most probable sequence), ``log_prob``
        and ``updates`` = T * V^(m+1).

    Notes
    -----
    Runs the recursion in the module docstring backwards from t = T, then reads the
    sequence forwards. Memory is T * V^m float64 for the psi table; the call refuses
    (with the size it would need) above ``MAX_DP_CELLS`` cells.
    """
    _check(model, length, table_only=True)
    m = model.order if order is None else order
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0:
        raise ValueError(f"the DP window m must be an integer >= 0, got {order!r}")
    if m < model.order:
        raise ValueError(f"the model has order {model.order}: its next token depends on {model.order} previous "
                         f"tokens, so the DP window must be m >= {model.order}, got m = {m}")
    v = model.vocab_size
    windows = v**m
    cells = (length + 1) * windows + 3 * windows * v
    if cells > MAX_DP_CELLS:
        raise ValueError(f"the DP over V^m = {v}^{m} = {windows:.3g} windows for T = {length} needs about "
                         f"{cells * 8 / 2**30:.3g} GiB (limit {MAX_DP_CELLS * 8 / 2**30:.3g} GiB); "
                         f"lower T, V or m")
    ctx = _context(model, context)
    logp = _log(np.asarray(lift(model, m).table, dtype=np.float64))  # [V^m, V]
    nxt = (np.arange(windows)[:, None] * v + np.arange(v)[None, :]) % windows  # shift(w, x)
    psi = np.zeros((length + 1, windows))
    for t in range(length - 1, -1, -1):
        psi[t] = np.max(logp + psi[t + 1][nxt], axis=1)
    start = np.concatenate([np.zeros(max(0, m - ctx.size), np.int64), ctx])  # older tokens are ignored
    w = int(window_index(start[start.size - m:], m, v, np)[0])
    seq = []
    for t in range(length):
        score = logp[w] + psi[t + 1][nxt[w]]
        x = int(np.argmax(_is_tie(score, score.max())))  # lowest id within the tie band
        seq.append(x)
        w = int(nxt[w, x])
    seq = tuple(seq)
    return DPDecoded(seq, sequence_log_prob(model, seq, ctx), length * windows * v)


# --- the two-letter example --------------------------------------------------------------

# An order-2 model over {A, B}, started from the window (A, A). Row (a, b) is the law of the
# next token after the tokens a, b. The first token is more likely A (3/5), but every
# continuation of A is spread out while B's are concentrated (17/20, then 19/20).
EXAMPLE_ROWS = {
    ("A", "A"): (Fraction(3, 5), Fraction(2, 5)),
    ("A", "B"): (Fraction(3, 20), Fraction(17, 20)),
    ("B", "A"): (Fraction(1, 2), Fraction(1, 2)),
    ("B", "B"): (Fraction(1, 20), Fraction(19, 20)),
}
EXAMPLE_LETTERS = "AB"


def two_letter_example() -> TableModel:
    """The order-2 model over {A, B} where greedy decoding of 3 tokens is not MAP.

    >>> two_letter_example().table[:, 0].tolist()
    [0.6, 0.15, 0.5, 0.05]
    """
    table = [[float(f) for f in EXAMPLE_ROWS[w]] for w in itertools.product(EXAMPLE_LETTERS, repeat=2)]
    return ngram(np.array(table), 2)


def example_law(length: int = 3) -> list:
    """Every sequence of the example with its exact probability (a Fraction), lexicographic."""
    out = []
    for seq in itertools.product(EXAMPLE_LETTERS, repeat=length):
        window, p = ("A", "A"), Fraction(1)
        for x in seq:
            p *= EXAMPLE_ROWS[window][EXAMPLE_LETTERS.index(x)]
            window = (window[1], x)
        out.append(("".join(seq), p))
    return out


def example_text(length: int = 3) -> str:
    """The example as the CLI prints it: every sequence, its exact probability, greedy and MAP."""
    model = two_letter_example()
    g = "".join(EXAMPLE_LETTERS[x] for x in greedy(model, length).sequence)
    mp = "".join(EXAMPLE_LETTERS[x] for x in dp_map(model, length).sequence)
    law = example_law(length)
    lines = ["An order-2 model over {A, B}, from the context AA. Next-token laws P(A), P(B):"]
    for w, (a, b) in EXAMPLE_ROWS.items():
        lines.append(f"  after {''.join(w)}: {str(a):>5s}  {str(b):>5s}")
    lines += ["", f"All {len(law)} sequences of length {length}:"]
    for seq, p in law:
        mark = ("  <- greedy" if seq == g else "") + ("  <- MAP" if seq == mp else "")
        lines.append(f"  {seq}  {str(p):>9s} = {float(p):.4f}{mark}")
    step = next(i for i in range(length) if g[i] != mp[i]) + 1 if g != mp else None
    first = {c: sum((p for s, p in law if s[0] == c), Fraction(0)) for c in EXAMPLE_LETTERS}
    best = {c: max(p for s, p in law if s[0] == c) for c in EXAMPLE_LETTERS}
    lines.append("")
    if step is not None:
        lines.append(
            f"Greedy commits at step {step}: P({g[0]}) = {first[g[0]]} > P({mp[0]}) = {first[mp[0]]}, yet the best "
            f"sequence starting with {g[0]} has probability {best[g[0]]} and the best starting with {mp[0]} has "
            f"{best[mp[0]]}. Greedy returns {g} ({float(dict(law)[g]):.4f}); MAP is {mp} ({float(dict(law)[mp]):.4f}).")
    return "\n".join(lines[:-1] + textwrap.wrap(lines[-1], 96))


# --- one decode job (the CLI's) ------------------------------------------------------------


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def decode_random(vocab: int = 4, order: int = 1, length: int = 8, seed: int = 0,
                  concentration: float = 1.0) -> dict:
    """Greedy, DP-MAP and (when V^T is small) brute-force MAP of one seeded random n-gram model.

    Returns a JSON-ready dict: the model's settings and, per decoder, the sequence, its
    probability and log-probability, and the wall time in seconds.
    """
    for name, val, lo in (("--vocab", vocab, 2), ("--order", order, 0), ("--length", length, 1)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {val!r}")
    if not concentration > 0:
        raise ValueError(f"the Dirichlet concentration must be > 0, got {concentration}")
    if vocab**order * vocab > MAX_DP_CELLS:
        raise ValueError(f"an order-{order} table over V = {vocab} has V^(m+1) = {vocab ** (order + 1):.3g} "
                         f"entries, too many to build; lower --vocab or --order")
    model = random_ngram(seed, vocab, order, concentration)
    out = {"vocab": vocab, "order": order, "length": length, "seed": seed, "concentration": concentration,
           "decoders": {}}
    runs = [("greedy", lambda: greedy(model, length)), ("dp-map", lambda: dp_map(model, length))]
    if vocab**length <= CLI_BRUTE_SEQUENCES:
        runs.append(("brute-force-map", lambda: brute_force_map(model, length)))
    for name, fn in runs:
        res, secs = _timed(fn)
        row = {"sequence": list(res.sequence), "log_prob": res.log_prob, "prob": float(np.exp(res.log_prob)),
               "seconds": secs}
        if isinstance(res, DPDecoded):
            row["updates"] = res.updates
        out["decoders"][name] = row
    g, mp = out["decoders"]["greedy"], out["decoders"]["dp-map"]
    out["greedy_is_map"] = g["sequence"] == mp["sequence"]
    out["ratio_greedy_to_map"] = float(np.exp(g["log_prob"] - mp["log_prob"]))
    return out


def format_random(res: dict, width: int = 100) -> str:
    """The CLI's table for :func:`decode_random`."""
    head = (f"random order-{res['order']} model, V = {res['vocab']}, T = {res['length']}, seed {res['seed']}, "
            f"Dirichlet({res['concentration']:g}) rows")
    lines = [head, "", f"{'decoder':16s}  {'log p':>11s}  {'p':>10s}  {'time':>9s}  sequence"]
    for name, r in res["decoders"].items():
        seq = " ".join(map(str, r["sequence"]))
        room = max(10, width - 54)
        if len(seq) > room:
            seq = seq[: room - 3] + "..."
        p = f"{r['prob']:10.3e}" if r["prob"] > 1e-300 else f"10^{r['log_prob'] / np.log(10):.1f}".rjust(10)
        lines.append(f"{name:16s}  {r['log_prob']:11.4f}  {p}  {r['seconds'] * 1e3:7.2f}ms  {seq}")
    if "brute-force-map" not in res["decoders"]:
        lines.append(f"{'brute-force-map':16s}  skipped: V^T = {res['vocab']}^{res['length']} sequences is too many")
    lines.append("")
    if res["greedy_is_map"]:
        lines.append("greedy found the MAP sequence for this model.")
    else:
        lines.append(f"greedy is not MAP: p(greedy) / p(MAP) = {res['ratio_greedy_to_map']:.4g}.")
    return "\n".join(lines)


# --- studies -----------------------------------------------------------------------------


class GreedyVsMap(NamedTuple):
    """Greedy against MAP over random n-gram models: how often they differ and by how much.

    ``ratio`` holds p(greedy) / p(MAP) for every model (1 where greedy is MAP).
    """

    models: int
    differ: int
    ratio: np.ndarray

    @property
    def fraction_differ(self) -> float:
        return self.differ / self.models


def greedy_vs_map(models: int = 500, vocab: int = 4, order: int = 1, length: int = 8,
                  concentration: float = 1.0, seed: int = 0) -> GreedyVsMap:
    """Decode ``models`` seeded random n-gram models (Dirichlet rows) greedily and by DP."""
    ratios = np.empty(models)
    for i in range(models):
        model = random_ngram(seed * 1_000_003 + i, vocab, order, concentration)
        g, mp = greedy(model, length), dp_map(model, length)
        ratios[i] = np.exp(g.log_prob - mp.log_prob)
    return GreedyVsMap(models, int(np.sum(ratios < 1 - 1e-12)), ratios)


class Timing(NamedTuple):
    """Best-of wall time (seconds) of one decoder at one (T, V, m) point."""

    method: str
    length: int
    vocab: int
    order: int
    seconds: float


def time_decoder(method: str, length: int, vocab: int, order: int, repeats: int = 3, seed: int = 0) -> Timing:
    """Best of ``repeats`` timings of ``dp`` or ``brute`` on a random order-``order`` model."""
    model = random_ngram(seed, vocab, order)
    fn = {"dp": lambda: dp_map(model, length), "brute": lambda: brute_force_map(model, length),
          "greedy": lambda: greedy(model, length)}[method]
    return Timing(method, length, vocab, order, best_of(fn, repeats))


def fit_power(x, y) -> float:
    """Least-squares slope of log y against log x: the exponent b of y ~ a x^b."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def scaling(repeats: int = 3, small: bool = False) -> dict:
    """Decoder run times over T, V and m with fitted exponents (the README's table).

    Returns a dict of series, each with ``axis``, the fitted exponent ``fit`` and its
    ``points`` (:class:`Timing` dicts): DP against T (V = 16, m = 2: slope ~1), against V
    (m = 1: slope ~2; m = 2: slope ~3) and brute force against T (time ~ b^T, fitted as
    the base b, ~V). ``small`` uses sizes that run in about a second (for tests).
    """
    if small:
        grid = {"dp vs T (V=8, m=1)": ("T", "dp", [(t, 8, 1) for t in (16, 32, 64)]),
                "dp vs V (T=16, m=1)": ("V", "dp", [(16, v, 1) for v in (16, 32, 64)]),
                "brute vs T (V=2)": ("base", "brute", [(t, 2, 1) for t in (8, 10, 12)])}
    else:
        grid = {"dp vs T (V=16, m=2)": ("T", "dp", [(t, 16, 2) for t in (128, 256, 512, 1024)]),
                "dp vs V (T=32, m=1)": ("V", "dp", [(32, v, 1) for v in (256, 512, 1024, 2048)]),
                "dp vs V (T=32, m=2)": ("V", "dp", [(32, v, 2) for v in (48, 64, 96, 128)]),
                "brute vs T (V=2)": ("base", "brute", [(t, 2, 1) for t in (14, 16, 18, 20)]),
                "brute vs T (V=4)": ("base", "brute", [(t, 4, 1) for t in (7, 8, 9, 10)])}
    out = {}
    for name, (axis, method, points) in grid.items():
        pts = [time_decoder(method, t, v, m, repeats) for t, v, m in points]
        if axis == "base":  # time ~ c b^T: the slope of log time against T is log b
            fit = float(np.exp(np.polyfit([p.length for p in pts], np.log([p.seconds for p in pts]), 1)[0]))
        else:
            fit = fit_power([p.length if axis == "T" else p.vocab for p in pts], [p.seconds for p in pts])
        out[name] = {"axis": axis, "method": method, "fit": fit, "points": [p._asdict() for p in pts]}
    return out
