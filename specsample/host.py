"""Bring your own sampler: verify a speculative sampler written in numpy, torch or anything with arrays.

A *host sampler* is a Python callable that does one verification step for a batch of rounds
(or for one, looped over by specsample)::

    fn(drafts int64[B, k], draft_rows [B, k, V], target_rows [B, k + 1, V], rng)
        -> (tokens [B, k + 1] padded, n_emitted [B])

``draft_rows[b, i]`` is q's distribution that drafted ``drafts[b, i]``; ``target_rows[b, i]`` is
p's distribution after the context and the first i drafts (row k: the bonus token). The rows are
probabilities, or log-probabilities with ``inputs="logits"`` (what a library sees after its
logits processors); float32 numpy arrays, or torch tensors with ``arrays="torch"``. Its
randomness comes from ``rng``: a seeded ``numpy.random.Generator`` (``rng="numpy"``), a seeded
``torch.Generator`` (``"torch"``), or nothing, the callable drawing from torch's global generator,
which specsample seeds before every call from the run's seed and the call's index
(``"torch-global"``). Every choice is deterministic given the seed.

specsample drafts from q itself (numpy, its own generator, independent of the sampler's),
computes both models' rows, passes only the rounds of sequences that still need tokens, counts
what comes back and runs the battery's tests on the counts: the same report, JSON and exit codes
as ``specsample verify``. A sequence count is honoured exactly (no rounding up to blocks).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import time
import warnings
from typing import Callable, Optional

import numpy as np

from . import checkpoint, mainthread
from .engine import Counts, transitions_from_joint
from .models import TableModel, validate_table, window_index

INPUTS = ("probs", "logits")
RNGS = ("numpy", "torch", "torch-global")
ARRAYS = ("numpy", "torch")
ROW_BUDGET = 1 << 25  # floats of rows passed per call: caps the batch at large vocabularies
FIRST_LANES = 16  # lanes a time-bounded run starts with, before it has timed a call
CALL_SECONDS = 0.25  # a time-bounded run sizes its lanes so that one call lasts about this long


class HostSamplerError(RuntimeError):
    """The user's sampler raised, or returned something that is not (tokens, n_emitted)."""


class HostNondeterminismWarning(UserWarning):
    """The sampler drew from a global generator that specsample does not seed: counts will not reproduce."""


@dataclasses.dataclass(frozen=True)
class HostSampler:
    """A sampler callable and how to call it (see the module docstring).

    Attributes
    ----------
    fn : callable
        ``fn(drafts, draft_rows, target_rows, rng) -> (tokens, n_emitted)``.
    name : str
    inputs : {"probs", "logits"} or "DRAFT,TARGET"
        What the rows are: probabilities, or log-probabilities (``-inf`` where p = 0); two kinds
        separated by a comma give the draft's rows and the target's apart (``"probs,logits"``: draft
        probabilities and target logits, as serving engines pass them).
    batched : bool
        False: ``fn`` takes one round (``drafts [k]``, rows ``[k, V]``, ``[k + 1, V]``) and
        returns ``(tokens [k + 1], n_emitted)``; specsample loops over the batch.
    rng : {"numpy", "torch", "torch-global"}
    arrays : {"numpy", "torch"}
        The array type passed in (outputs may be either: they go through ``np.asarray``).
    rule : str or None
        ``"standard"`` (default) claims the standard rule, which adds the tests of accepted
        drafts per round and per-token acceptance on context-free pairs, and requires every
        emitted token but the last to be the draft at its position. None: output law only.
    drafts : {"given", "self"}
        "self": the sampler drafts too. It is then called as ``fn(context int[B, W], draft, target,
        rng) -> (tokens [B, k + 1], n_emitted [B], drafts [B, k])`` where ``draft`` and ``target``
        are models: ``model(tokens [..., W + t]) -> rows [..., t + 1, V]``, row i following the
        context and the first i tokens after it (probs or logits, as ``inputs`` says). A function
        that takes a keyword ``k`` is told the draft length.
    layout : {"rounds", "flat"}
        "flat": the serving engines' ragged batch. Each request gets its own draft count in
        0..k (drawn by specsample, uniformly, so that indexing bugs that show only with unequal
        counts are reached), and the call is ``fn(draft_token_ids [T], num_draft_tokens [B],
        draft_rows [T, V], target_rows [T + B, V], rng) -> tokens [B, max + 1]`` padded with -1:
        requests one after another (request b's drafts start at ``cumsum(num_draft_tokens)[b] -
        num_draft_tokens[b]``), its target rows at each draft and then its bonus row. Accepted
        drafts per round are then not tested against a fixed-k law; per-token acceptance still is.
    bonus : {"sampled", "given"}
        "given": specsample samples the bonus token from p's row after each request's drafts and
        passes the ids in (``bonus_token_ids [B]``, just before ``rng``), as engines that sample it
        outside the rejection sampler do; the target's bonus rows are then not passed (flat layout:
        ``target_rows [T, V]``).
    """

    fn: Callable
    name: str = "host"
    inputs: str = "probs"
    batched: bool = True
    rng: str = "numpy"
    arrays: str = "numpy"
    rule: Optional[str] = "standard"
    drafts: str = "given"
    layout: str = "rounds"
    bonus: str = "sampled"

    @property
    def draft_inputs(self) -> str:
        return self.inputs.split(",")[0]

    @property
    def target_inputs(self) -> str:
        return self.inputs.split(",")[-1]

    def __post_init__(self):
        if self.rule == "none":  # the command line's spelling of "no rule"
            object.__setattr__(self, "rule", None)
        if self.rule not in (None, "standard"):
            raise ValueError(f"host sampler rule must be 'standard' or None ('none'), got {self.rule!r}")
        if not callable(self.fn):
            raise TypeError(f"a host sampler needs a callable, got {type(self.fn).__name__}")
        kinds = [x.strip() for x in str(self.inputs).split(",")]
        if not 1 <= len(kinds) <= 2 or any(x not in INPUTS for x in kinds):
            raise ValueError(f"host sampler inputs must be probs, logits, or DRAFT,TARGET such as probs,logits; "
                             f"got {self.inputs!r}")
        object.__setattr__(self, "inputs", kinds[0] if len(set(kinds)) == 1 else ",".join(kinds))
        for field, allowed in (("rng", RNGS), ("arrays", ARRAYS), ("drafts", ("given", "self")),
                               ("layout", ("rounds", "flat")), ("bonus", ("sampled", "given"))):
            if getattr(self, field) not in allowed:
                raise ValueError(f"host sampler {field} must be one of {', '.join(allowed)}, "
                                 f"got {getattr(self, field)!r}")
        if self.drafts == "self" and (self.layout == "flat" or self.bonus == "given"):
            raise ValueError("a self-drafting sampler draws its own drafts and bonus: layout='flat' and "
                             "bonus='given' are for samplers given the drafts")
        if self.layout == "flat" and not self.batched:
            raise ValueError("layout='flat' is a batch of requests; it cannot be unbatched")
        if (self.rng != "numpy" or self.arrays == "torch") and not _torch_available():
            raise ValueError(f"host sampler rng={self.rng!r} / arrays={self.arrays!r} needs torch, which is "
                             "not installed (pip install torch), or use rng='numpy', arrays='numpy'")


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _derive(seed: int, *labels) -> int:
    h = hashlib.sha256(repr((int(seed),) + labels).encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


@dataclasses.dataclass
class HostRun:
    """What a host run cost: calls made, rounds passed, seconds in the sampler and in all; warnings."""

    calls: int = 0
    rounds: int = 0
    sampler_seconds: float = 0.0
    seconds: float = 0.0
    warnings: list = dataclasses.field(default_factory=list)

    @property
    def wasted_fraction(self) -> float:
        """Rounds passed for sequences that needed no more tokens: 0 by construction (finished lanes leave
        the batch; ``tests/test_host.py`` checks that every round passed is counted)."""
        return 0.0

    @property
    def rounds_per_s(self) -> float:
        return self.rounds / self.seconds if self.seconds else float("nan")


@functools.lru_cache(maxsize=256)
def _takes_k(fn) -> bool:
    """Whether a self-drafting sampler takes the draft length as a keyword ``k`` (or **kwargs)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "k" and p.kind != p.POSITIONAL_ONLY or p.kind == p.VAR_KEYWORD for p in params)


GLOBAL_WATCH_CALLS = 4  # calls checked for draws from a global generator (a sampler that does, does so at once)


def _global_states() -> tuple:
    """Snapshots of the global generators a sampler could draw from behind specsample's back."""
    import sys

    torch = sys.modules.get("torch")
    t = torch.default_generator.get_state().numpy().tobytes() if torch is not None else None
    n = np.random.get_state(legacy=False)["state"]
    return t, (repr(n["key"].tobytes()) if hasattr(n.get("key"), "tobytes") else repr(n)) + repr(n.get("pos"))


def _moved_global(before: tuple, after: tuple, sampler: "HostSampler") -> Optional[str]:
    """A warning when a global generator moved during a call of a sampler that was given its own."""
    if before[0] != after[0] and sampler.rng != "torch-global":
        return (f"sampler {sampler.name!r} draws from torch's global generator, which --rng {sampler.rng} does not "
                "seed: the same --seed will not give the same counts; pass --rng torch-global "
                "(rng='torch-global'), or draw from the generator passed in")
    if before[1] != after[1]:
        return (f"sampler {sampler.name!r} draws from numpy's global generator (np.random.*), which specsample "
                "does not seed: the same --seed will not give the same counts; draw from the generator passed "
                "in (rng='numpy')")
    return None


class _Caller:
    """Calls the sampler on a batch with the randomness and array type it asked for."""

    def __init__(self, sampler: HostSampler, seed: int, label: str, warnings: Optional[list] = None):
        self.s, self.seed, self.label, self.calls = sampler, int(seed), label, 0
        self.warnings = warnings if warnings is not None else []
        self.bonus_rng = np.random.default_rng(_derive(seed, label, "bonus"))
        self.seed_global = True  # torch-global: seed before each call (the boundary pass sets a state itself)
        self.generator = None
        if sampler.rng == "numpy":
            self.generator = np.random.default_rng(_derive(seed, label, "sampler"))
        elif sampler.rng == "torch":
            import torch

            self.generator = torch.Generator().manual_seed(_derive(seed, label, "sampler"))

    def _arrays(self, *xs):
        if self.s.arrays == "torch":
            import torch

            return tuple(torch.from_numpy(np.ascontiguousarray(x)) for x in xs)
        return xs

    def call_self(self, context, draft_model, target_model, k: int):
        """A self-drafting sampler: (tokens, n_emitted, drafts) from the context and both models."""
        self._seed_global()
        self.calls += 1
        ctx = self._arrays(context)[0]
        kw = {"k": k} if _takes_k(self.s.fn) else {}
        try:
            if self.s.batched:
                tokens, n, drafts = self._invoke(lambda: self.s.fn(ctx, draft_model, target_model, self.generator,
                                                                   **kw))
                return _as_int(tokens, "tokens"), _as_int(n, "n_emitted"), _as_int(drafts, "drafts")
            outs = self._invoke(lambda: [self.s.fn(ctx[b], draft_model, target_model, self.generator, **kw)
                                         for b in range(len(context))])
            return tuple(np.stack([_as_int(o[i], name).ravel() for o in outs]) if i != 1 else
                         np.array([int(_as_int(o[1], name).ravel()[0]) for o in outs])
                         for i, name in enumerate(("tokens", "n_emitted", "drafts")))
        except HostSamplerError:
            raise
        except Exception as e:
            raise self._error(e) from e

    def _invoke(self, fn):
        """``fn()`` on the main thread; the first calls watch the global generators (see _moved_global)."""
        if self.calls > GLOBAL_WATCH_CALLS:
            return mainthread.call(fn)
        before = _global_states()
        out = mainthread.call(fn)
        note = _moved_global(before, _global_states(), self.s)
        if note and note not in self.warnings:
            self.warnings.append(note)
        return out

    def _flat(self, drafts, q_rows, p_rows, n_draft, extra):
        """The flat (ragged) layout: requests one after another, outputs padded with -1."""
        b, k = drafts.shape
        i = np.arange(k + 1)
        has = i[None, :k] < n_draft[:, None]  # [B, k]: drafts each request has
        rows = i[None] < (n_draft + (0 if extra else 1))[:, None]  # target rows passed: + the bonus row
        args = self._arrays(drafts[has], n_draft, q_rows[has], p_rows[rows], *extra)
        self._seed_global()
        self.calls += 1
        try:
            out = _as_int(self._invoke(lambda: self.s.fn(*args, self.generator)), "tokens")
        except HostSamplerError:
            raise
        except Exception as e:
            raise self._error(e) from e
        if out.ndim != 2 or out.shape[0] != b or out.shape[1] > k + 1:
            raise HostSamplerError(f"sampler {self.s.name!r} returned tokens of shape {out.shape} for {b} requests "
                                   f"of at most {int(n_draft.max(initial=0))} drafts; expected ({b}, max drafts + 1) "
                                   "padded with -1")
        tokens = np.zeros((b, k + 1), np.int64)
        tokens[:, : out.shape[1]] = np.where(out >= 0, out, 0)
        return tokens, (out != -1).sum(1)

    def _seed_global(self):
        if self.s.rng == "torch-global" and self.seed_global:
            import torch

            # the CPU generator torch.rand uses (torch.manual_seed would also visit every device: 250 us a call)
            torch.default_generator.manual_seed(_derive(self.seed, self.label, "global", self.calls))

    def _error(self, e: Exception) -> "HostSamplerError":
        from .schemes import user_location

        return HostSamplerError(f"sampler {self.s.name!r} raised: {type(e).__name__}: "
                                f"{(str(e).strip().splitlines() or [''])[0][:300]}{user_location(e)}")

    def __call__(self, drafts, q_rows, p_rows, n_draft=None):
        """(tokens [B, k + 1], n_emitted [B]) for drafts [B, k] and their rows; ``n_draft`` [B] (flat
        layout) says how many of each row's drafts the request has (default: all k)."""
        b, k = drafts.shape
        n_draft = np.full(b, k, np.int64) if n_draft is None else np.asarray(n_draft, np.int64)
        extra = ()
        if self.s.bonus == "given":  # drawn here from p's row after each request's drafts, as an engine would
            row = p_rows[np.arange(b), n_draft].astype(np.float64)
            extra = (_draw(np.cumsum(row, -1), row > 0, self.bonus_rng.random(b)),)
        with np.errstate(divide="ignore"):
            if self.s.draft_inputs == "logits":
                q_rows = np.log(q_rows)
            if self.s.target_inputs == "logits":
                p_rows = np.log(p_rows)
        if self.s.layout == "flat":
            return self._flat(drafts, q_rows, p_rows, n_draft, extra)
        if extra:
            p_rows = p_rows[:, :k]  # the bonus row is not passed when the bonus is given
        d, q, p, *extra = self._arrays(drafts, q_rows, p_rows, *extra)
        self._seed_global()
        self.calls += 1
        try:
            if self.s.batched:
                tokens, n = self._invoke(lambda: self.s.fn(d, q, p, *extra, self.generator))
                return _as_int(tokens, "tokens"), _as_int(n, "n_emitted")
            outs = self._invoke(lambda: [self.s.fn(d[i], q[i], p[i], *(x[i] for x in extra), self.generator)
                                         for i in range(b)])
            k1 = drafts.shape[1] + 1
            tokens = np.zeros((len(outs), k1), np.int64)
            n = np.zeros(len(outs), np.int64)
            for b, (t, m) in enumerate(outs):
                t = _as_int(t, "tokens").ravel()
                tokens[b, : min(k1, t.size)] = t[:k1]
                n[b] = int(_as_int(m, "n_emitted").ravel()[0])
            return tokens, n
        except HostSamplerError:
            raise
        except Exception as e:
            raise self._error(e) from e


class _HostModel:
    """A table model as a self-drafting sampler sees it: ``model(tokens [..., W + t]) -> [..., t + 1, V]``."""

    def __init__(self, table32: np.ndarray, order: int, width: int, logits: bool, torch_arrays: bool):
        self.table, self.order, self.width, self.torch = table32, order, width, torch_arrays
        if logits:
            with np.errstate(divide="ignore"):
                self.table = np.log(table32)
        self.vocab_size = table32.shape[-1]

    def __call__(self, tokens):
        if hasattr(tokens, "detach"):
            tokens = tokens.detach().cpu().numpy()
        toks = np.asarray(tokens, np.int64)
        if toks.shape[-1] < self.width:
            raise ValueError(f"a model call needs the {self.width} context tokens first, got {toks.shape[-1]} tokens")
        toks = toks[..., self.width - self.order :]
        rows = window_index(toks, self.order, self.vocab_size, np) if self.order else \
            np.zeros(toks.shape[:-1] + (toks.shape[-1] + 1,), np.int64)
        out = self.table[rows]
        if self.torch:
            import torch

            return torch.from_numpy(np.ascontiguousarray(out))
        return out


def _as_int(x, what: str) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, possibly on a device
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind == "f":
        raise HostSamplerError(f"the sampler returned {what} as floats ({a.dtype}); return integer token ids "
                               "and counts")
    return a.astype(np.int64)


def _draw(cdf: np.ndarray, positive: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One inverse-CDF draw per row from cumulative rows ``cdf`` (float64) with uniforms ``u`` in
    [0, 1); never a token of weight zero (``positive`` marks the others)."""
    hit = positive & (cdf > (u * cdf[:, -1])[:, None])
    last = cdf.shape[1] - 1 - np.argmax(positive[:, ::-1], axis=1)
    return np.where(hit.any(axis=1), np.argmax(hit, axis=1), last)


def run_host(sampler: HostSampler, target: TableModel, draft: TableModel, *, k: int, sequences: int,
             length: int, seed: int = 0, batch: int = 4096, label: str = "",
             progress: Optional[Callable[[int, int], None]] = None, stats: Optional[HostRun] = None,
             deadline: Optional[float] = None) -> Counts:
    """Run a host sampler on one pair of table models; count exactly ``sequences`` sequences.

    Each of ``batch`` lanes generates sequences of the first ``length`` stream tokens (from the
    context "token 0 repeated", as the engine's); a lane whose sequence is complete starts the
    next one while any are left, else drops out of the batch, so every call carries only rounds
    that still need tokens. Returns :class:`specsample.engine.Counts` (pair axis of 1).

    With a ``deadline`` (a ``time.perf_counter()`` value) no sequence starts after it, and every
    sequence started is finished (dropping unfinished ones would keep those that needed fewer
    rounds, a biased sample); so fewer than ``sequences`` may be counted, a number that depends
    on the machine's speed. Lanes then start few and grow while a call stays short
    (:data:`CALL_SECONDS`), so finishing takes little time past the deadline even for a slow
    sampler called one round at a time.
    """
    k, sequences, length = int(k), int(sequences), int(length)
    for name, val in (("k", k), ("sequences", sequences), ("length", length), ("batch", batch)):
        if val < 1:
            raise ValueError(f"{name} must be >= 1, got {val}")
    tt = validate_table(np.asarray(target.table), "target table")
    dt = validate_table(np.asarray(draft.table), "draft table")
    tt, dt = (t[0] if t.ndim == 3 else t for t in (tt, dt))
    v = tt.shape[-1]
    if dt.shape[-1] != v:
        raise ValueError(f"target has V={v} tokens but draft has V={dt.shape[-1]}; they must share a vocabulary")
    mt, md = target.order, draft.order
    width = max(mt, md)
    batch = int(max(1, min(batch, sequences, ROW_BUDGET // ((2 * k + 1) * v))))
    joint = v**length <= (1 << 16)
    rng = np.random.default_rng(_derive(seed, label, "drafts"))
    stats = stats if stats is not None else HostRun()
    call = _Caller(sampler, seed, label, stats.warnings)
    # the flat layout's ragged draft counts: specsample's own draws, apart from the drafting stream
    ragged = np.random.default_rng(_derive(seed, label, "ragged")) if sampler.layout == "flat" else None
    t_start = time.perf_counter()
    # tables once: float32 rows as passed, the draft's float64 cumulative rows for drafting
    t32, d32, d_cdf = tt.astype(np.float32), dt.astype(np.float32), np.cumsum(dt, axis=-1)
    self_drafting = sampler.drafts == "self"
    if self_drafting:
        torch_arrays = sampler.arrays == "torch"
        draft_model = _HostModel(d32, md, width, sampler.draft_inputs == "logits", torch_arrays)
        target_model = _HostModel(t32, mt, width, sampler.target_inputs == "logits", torch_arrays)

    position = np.zeros((length, v), np.int64)
    joint_c = np.zeros(v**length, np.int64) if joint else None
    trans = np.zeros((v**mt, v), np.int64) if (mt > 0 and not joint) else None
    accepted = np.zeros(k + 1, np.int64)
    emitted = np.zeros(k + 2, np.int64)
    drafted = np.zeros(v, np.int64)
    draft_acc = np.zeros(v, np.int64)
    rps = np.zeros(length + 1, np.int64)
    invalid = 0

    ctx = np.zeros((batch, width), np.int64)
    pos = np.zeros(batch, np.int64)
    code = np.zeros(batch, np.int64)
    rnd = np.zeros(batch, np.int64)
    live = np.zeros(batch, bool)
    cap = batch if deadline is None else min(batch, FIRST_LANES)  # lanes allowed to run at once
    started, done = 0, 0

    def start_lanes() -> int:
        """Start new sequences on free lanes (lowest first) while any are left, under the lane cap."""
        if deadline is not None and time.perf_counter() >= deadline:
            return 0
        free = np.flatnonzero(~live)[: max(0, min(cap - int(live.sum()), sequences - started))]
        ctx[free], pos[free], code[free], rnd[free] = 0, 0, 0, 0
        live[free] = True
        return free.size

    started += start_lanes()
    while live.any():
        a = np.flatnonzero(live)
        n_a = a.size
        t0 = time.perf_counter()
        if self_drafting:  # the sampler drafts from the draft model itself
            tokens, n_em, drafts = call.call_self(ctx[a], draft_model, target_model, k)
            if drafts.shape != (n_a, k):
                raise HostSamplerError(f"sampler {sampler.name!r} returned drafts of shape {drafts.shape} for a "
                                       f"batch of {n_a}; expected ({n_a}, {k})")
            drafts = np.clip(drafts, 0, v - 1)
        else:  # draft k tokens from q, keeping the row each came from
            full = np.concatenate([ctx[a], np.zeros((n_a, k), np.int64)], axis=1)
            q_rows = np.empty((n_a, k, v), np.float32)
            for i in range(k):
                win = window_index(full[:, width - md + i : width + i], md, v, np)[:, 0] if md else np.zeros(n_a, int)
                q_rows[:, i] = d32[win]
                full[:, width + i] = _draw(d_cdf[win], dt[win] > 0, rng.random(n_a))
            drafts = full[:, width:]
            p_win = window_index(full[:, width - mt :], mt, v, np) if mt else np.zeros((n_a, k + 1), int)
            p_rows = t32[p_win]  # [n_a, k + 1, V], float32 as a sampler sees them
            n_draft = ragged.integers(0, k + 1, n_a) if ragged is not None else np.full(n_a, k)
            t0 = time.perf_counter()
            tokens, n_em = call(drafts, q_rows, p_rows, n_draft)
        call_seconds = time.perf_counter() - t0
        stats.sampler_seconds += call_seconds
        if deadline is not None:  # grow (or shrink) the lanes so that a call lasts about CALL_SECONDS
            cap = int(np.clip(n_a * CALL_SECONDS / max(call_seconds, 1e-6), 1, batch))
        stats.calls += 1 if sampler.batched else n_a
        stats.rounds += n_a
        if tokens.shape != (n_a, k + 1) or n_em.shape != (n_a,):
            raise HostSamplerError(f"sampler {sampler.name!r} returned tokens of shape {tokens.shape} and n_emitted "
                                   f"of shape {n_em.shape} for a batch of {n_a}; expected ({n_a}, {k + 1}) and ({n_a},)")
        if self_drafting:
            n_draft = np.full(n_a, k)
        bad_round = (n_em < 1) | (n_em > n_draft + 1)
        n_em = np.clip(n_em, 1, n_draft + 1)
        i = np.arange(k + 1)
        em = i[None] < n_em[:, None]
        bad_tok = em & ((tokens < 0) | (tokens >= v))
        if sampler.rule == "standard":  # every emitted token but the last is the draft at its place
            bad_tok[:, :k] |= (i[None, :k] < (n_em - 1)[:, None]) & (tokens[:, :k] != drafts)
        invalid += int(bad_round.sum() + bad_tok.sum())
        tok = np.clip(tokens, 0, v - 1)
        n_acc = n_em - 1
        accepted += np.bincount(n_acc, minlength=k + 1)
        emitted += np.bincount(n_em, minlength=k + 2)
        tested = (i[None, :k] <= n_acc[:, None]) & (i[None, :k] < n_draft[:, None])  # a request's drafts only
        ok = i[None, :k] < n_acc[:, None]
        np.add.at(drafted, drafts[tested], 1)
        np.add.at(draft_acc, drafts[ok], 1)
        # count the stream tokens of each lane's sequence
        seq_full = np.concatenate([ctx[a], tok], axis=1)
        for t in range(k + 1):
            m = em[:, t] & (pos[a] + t < length)
            if not m.any():
                continue
            np.add.at(position, (pos[a][m] + t, tok[m, t]), 1)
            if joint:
                code[a[m]] = code[a[m]] * v + tok[m, t]
            elif mt:
                w = window_index(seq_full[m][:, width + t - mt : width + t], mt, v, np)[:, 0]
                np.add.at(trans, (w, tok[m, t]), 1)
        new_pos = pos[a] + n_em
        complete = new_pos >= length
        rnd[a] += 1
        if joint:
            np.add.at(joint_c, code[a[complete]], 1)
        np.add.at(rps, np.minimum(rnd[a[complete]], length), 1)
        # the context: the last `width` tokens of each sequence
        if width:
            idx = n_em[:, None] + np.arange(width)[None]
            ctx[a] = np.take_along_axis(seq_full, idx, axis=1)
        pos[a] = new_pos
        fin = a[complete]
        done += fin.size
        live[fin] = False
        started += start_lanes()
        if progress is not None and fin.size:
            progress(done, sequences)
    stats.seconds += time.perf_counter() - t_start
    if joint:
        position = np.stack([joint_c.reshape((v,) * length).sum(axis=tuple(x for x in range(length) if x != t))
                             for t in range(length)])
        if mt:
            trans = transitions_from_joint(joint_c[None], v, length, mt)[0]
    one = lambda x: None if x is None else x[None]  # noqa: E731 - the engine's pair axis
    rounds = int(emitted.sum())
    return Counts(np.array([done]), np.array([rounds]), position[None], one(joint_c), one(trans), accepted[None],
                  emitted[None], drafted[None], draft_acc[None], rps[None], np.array([invalid]))


# --- the floating-point edge of the sampler's generator ---------------------------------------------

EXTREME_VALUES = (0.0, float(np.float32(1.0) - np.float32(2.0**-24)))  # float32 uniforms: 0 and 1 - 2^-24
MAX_SLOT = 64  # a found state serves every uniform slot below this


def _float32_draws(kind: str, seed: int, n: int):
    """The first ``n`` float32 uniforms of a generator of ``kind`` seeded with ``seed``."""
    if kind == "numpy":
        return np.random.Generator(np.random.PCG64(seed)).random(n, dtype=np.float32)
    import torch

    return torch.rand(n, generator=torch.Generator().manual_seed(seed)).numpy()


@functools.lru_cache(maxsize=None)
def extreme_states(kind: str, draws: int = 1 << 16, max_seeds: int = 1 << 15) -> dict:
    """Generator states whose next float32 uniform is exactly 0, and exactly 1 - 2^-24.

    Each value is ``(seed, position)``: seeded with ``seed``, the generator's float32 draw at index
    ``position`` (>= :data:`MAX_SLOT`) is the extreme value. So a sampler's i-th uniform is that value
    when ``position - i`` draws are burnt after seeding. Either value comes once in 2^24 draws, so the
    search reads about 2^24 draws per value (~0.5 s for numpy, ~3 s for torch on a 2-core CPU).
    ``kind`` is "torch" (torch's CPU generator, also the global one) or "numpy" (PCG64, draws made
    with ``random(dtype=np.float32)``).
    """
    found = {}
    for seed in range(max_seeds):
        x = _float32_draws(kind, seed, draws)
        for value in EXTREME_VALUES:
            if value not in found:
                hit = np.flatnonzero(x[MAX_SLOT:] == np.float32(value))
                if hit.size:
                    found[value] = (seed, int(hit[0]) + MAX_SLOT)
        if len(found) == len(EXTREME_VALUES):
            return found
    raise RuntimeError(f"no {kind} generator state with an extreme float32 uniform in {max_seeds} seeds")


def host_boundary_check(sampler, target: TableModel, draft: TableModel, *, k: int):
    """Call the sampler with each of its first k uniforms at exactly 0 and at 1 - 2^-24; hard checks only.

    For each slot i and value: the drafts before slot i are a token the target accepts whatever
    the uniform (p >= q), the draft at slot i a token the target gives probability 0 but the draft
    does not (what an ``u <= p / q`` rule lets through at u = 0), or, without such a token, the least
    likely token under p; the sampler's generator (numpy or torch, passed or global) is set to a
    state whose i-th next float32 uniform is the value (:func:`extreme_states`). One round per slot
    and value, batch of 1. A round fails when it emits a token outside [0, V), a token the target
    gives probability 0, a number of tokens outside [1, k + 1], or (rule "standard") a token before
    the last that is not the draft at its place. Returns a :class:`specsample.boundary.BoundaryResult`.

    This assumes the sampler draws its acceptance uniforms first, one float32 per draft in order
    (as ``torch.rand(k)`` / ``rng.random(k, dtype=np.float32)`` do); a sampler drawing float64 numpy
    uniforms meets 0 with probability 2^-53 per draw, which this pass does not try to reach.
    """
    from .boundary import BoundaryResult

    s = load_sampler(sampler)
    p = validate_table(np.asarray(target.table), "target table").reshape(-1, np.shape(target.table)[-1])[0]
    q = validate_table(np.asarray(draft.table), "draft table").reshape(-1, np.shape(draft.table)[-1])[0]
    v = p.size
    if k >= MAX_SLOT:
        raise ValueError(f"the boundary pass covers k < {MAX_SLOT}, got k = {k}")
    kind = "numpy" if s.rng == "numpy" else "torch"
    states = extreme_states(kind)
    safe = int(np.argmax(np.where(q > 0, p - q, -np.inf)))  # accepted whatever u when p >= q
    hazards = np.flatnonzero((p == 0) & (q > 0))
    hazard = int(hazards[0]) if hazards.size else int(np.argmin(np.where(q > 0, p / np.maximum(q, 1e-300), np.inf)))
    q_rows = np.broadcast_to(q, (1, k, v)).astype(np.float32)
    p_rows = np.broadcast_to(p, (1, k + 1, v)).astype(np.float32)
    rounds, violations, first = 0, 0, ""
    for i in range(k):
        drafts = np.array([[safe] * i + [hazard] * (k - i)], np.int64)
        for value in EXTREME_VALUES:
            seed, position = states[value]
            call = _Caller(s, 0, "boundary")
            burn = position - i
            if kind == "numpy":
                call.generator = np.random.Generator(np.random.PCG64(seed))
                call.generator.random(burn, dtype=np.float32)
            else:
                import torch

                gen = torch.Generator().manual_seed(seed)
                torch.rand(burn, generator=gen)
                if s.rng == "torch":
                    call.generator = gen
                else:  # the global generator, put in the same state
                    torch.default_generator.set_state(gen.get_state())
                    call.seed_global = False
            tokens, n = call(drafts, q_rows, p_rows)
            rounds += 1
            bad = _round_violation(tokens, n, drafts, p, k, s.rule)
            if bad:
                violations += 1
                first = first or f"uniform {i} = {value:.9g}: {bad} (drafts {drafts[0].tolist()})"
    detail = (f"{rounds} rounds, each acceptance uniform at 0 and 1 - 2^-24 via {kind} generator states; "
              + (f"first violation: {first}" if violations else "no violation"))
    return BoundaryResult(rounds, violations, detail)


def _round_violation(tokens, n, drafts, p, k: int, rule) -> str:
    """What a single round broke, in words ("" when nothing)."""
    v = p.size
    if tokens.shape != (1, k + 1) or n.shape != (1,):
        return f"output shapes {tokens.shape} and {n.shape}"
    m = int(n[0])
    if not 1 <= m <= k + 1:
        return f"n_emitted = {m} outside [1, {k + 1}]"
    out = tokens[0, :m]
    if np.any((out < 0) | (out >= v)):
        return f"token ids {out.tolist()} outside [0, {v})"
    zero = [int(t) for t in out if p[t] == 0]
    if zero:
        return f"emitted token {zero[0]}, which the target gives probability 0"
    if rule == "standard" and np.any(out[: m - 1] != drafts[0, : m - 1]):
        return f"emitted {out.tolist()}, whose first {m - 1} are not the drafts"
    return ""


# --- the battery for host samplers ---------------------------------------------------------------

HOST_CAPS = {"quick": 1 << 14, "default": 1 << 17, "thorough": 1 << 20}  # sequences per case at most


def load_sampler(spec, **options) -> HostSampler:
    """A :class:`HostSampler` from a callable, a HostSampler, or ``path.py:attr`` / ``module:attr``.

    ``options`` (inputs, batched, rng, arrays, rule, name) apply to a plain callable; a
    HostSampler loaded from a file keeps its own, and an option given here overrides it (None means
    "not given"; ``rule="none"`` drops the rule).
    """
    obj = spec
    if isinstance(spec, str):
        from .schemes import SchemeLoadError, _load_object

        if ":" not in spec:
            raise SchemeLoadError(f"a sampler is given as path.py:function or module:function, got {spec!r}")
        obj = _load_object(spec)
    options = {k: v for k, v in options.items() if v is not None}
    if callable(obj) and not isinstance(obj, HostSampler) and _is_factory(obj):
        obj = obj()  # a factory such as specsample.adapters:torch_batched
    if isinstance(obj, HostSampler):
        return dataclasses.replace(obj, **options)
    if not callable(obj):
        raise TypeError(f"{spec!r} is a {type(obj).__name__}, not a callable sampler")
    options.setdefault("name", getattr(obj, "__name__", "host"))
    return HostSampler(obj, **options)


def _is_factory(fn) -> bool:
    """A callable that takes no required argument (an adapter factory), not a sampler."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return not any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _rule_scheme(sampler: HostSampler, k: int):
    """What the battery's tests read from a scheme (k and the acceptance theory), for a host sampler."""
    import stats

    from .schemes import Scheme
    from .schemes.standard import standard_law

    standard = sampler.rule == "standard"
    fixed_k = sampler.layout != "flat"  # ragged draft counts: accepted drafts per round follow no fixed-k law
    return Scheme(sampler.name, k, k + 1, None, accepted_law=standard_law(k) if standard and fixed_k else None,
                  token_acceptance=stats.per_token_acceptance if standard else None,
                  description=f"host sampler ({sampler.inputs}, rng {sampler.rng})")


def _parse_time(value) -> Optional[float]:
    """Seconds from ``90``, ``90s``, ``10m`` or ``1h``; None passes through."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:], None)
        try:
            seconds = float(text[:-1]) * scale if scale else float(text)
        except ValueError:
            raise ValueError(f"a time budget is a number of seconds or 90s / 10m / 1h, got {value!r}") from None
    if not seconds > 0:
        raise ValueError(f"a time budget must be positive, got {value!r}")
    return seconds


def verify_host(sampler, *, budget="quick", seed: int = 0, alpha: float = 0.01, power: float = 0.99,
                cases: Optional[str] = None, k=(1, 4, 8), tv: Optional[float] = None, time_budget=None,
                batch: int = 4096, progress: Optional[Callable[[str, int, int], None]] = None,
                checkpoint_dir: Optional[str] = None, **options):
    """Run the battery against a host sampler; returns a :class:`~specsample.report.Report`.

    Parameters
    ----------
    sampler : callable, HostSampler or str
        The sampler (``path.py:fn`` or ``module:fn`` for a file's callable); ``options``
        (``inputs``, ``batched``, ``rng``, ``arrays``, ``rule``) say how to call it.
    budget : {"quick", "default", "thorough"} or int
        Sequences per case: what the power calculation asks for at the budget's TV, capped at
        :data:`HOST_CAPS` (host samplers are slower than the engine); an int is used as is.
    tv : float, optional
        Target minimum detectable total variation: each case runs exactly the sequences the power
        calculation asks for (no cap).
    time_budget : float or str, optional
        A bound on the whole run's time (``"10m"``). The boundary pass runs first; then each case
        in turn gets an equal share of the time left, and runs until its share is spent or its
        power calculation (at the budget's or ``tv``'s TV) is met. No sequence starts after a
        case's deadline and every started one is finished, so the counts are unbiased but depend
        on the machine's speed: for reproducible counts give ``budget`` or ``tv`` instead.
    checkpoint_dir : str, optional
        Each finished case's counts are kept here (one file a case); a killed run started again
        with the same arguments loads them instead of sampling again, and ends with the counts of
        an uninterrupted run. A case is the unit: one killed half way is sampled again.
    k, cases, seed, alpha, power
        As :func:`specsample.verify`. The cases are the battery's table cases (pair families and
        n-gram models; not the sweep, the boundary pass or the transformer cases).

    Examples
    --------
    >>> report = verify_host("my_sampler.py:verify", budget="quick", k=4)  # doctest: +SKIP
    """
    import jax

    import stats

    from . import battery
    from .report import CaseResult, Report, TestResult

    s = load_sampler(sampler, **options)
    alpha = stats.multiplicity.check_level(alpha)
    power = stats.multiplicity.check_level(power, "power")
    seed = battery.check_seed(seed)
    ks = battery._draft_lengths(k)
    seconds = _parse_time(time_budget)
    if tv is not None and not 0 < float(tv) < 1:
        raise ValueError(f"tv is a total variation in (0, 1), got {tv!r}")
    bud, explicit, budget = battery.resolve_budget(budget)
    plan = [c for c in battery.default_cases(bud, ks) if c.k in ks and not (c.neural or c.sweep)]
    plan = battery.select(plan, cases)
    schemes = {kk: _rule_scheme(s, kk) for kk in ks}
    m = sum(battery._planned_tests(c, schemes[c.k]) for c in plan)
    level = alpha / max(1, m)
    target_tv = float(tv) if tv is not None else bud.tv

    def need(c):
        if explicit:
            return explicit
        n = stats.samples_for_tv(target_tv, c.vocab - 1, level, power).n
        return n if tv is not None else min(n, HOST_CAPS.get(bud.name, HOST_CAPS["default"]))

    t_start = time.perf_counter()
    rank = {c.name: i for i, c in enumerate(plan)}  # the report keeps the plan's order
    boundary = [c for c in plan if c.boundary]
    plan = [c for c in plan if not c.boundary]
    sizes = {c.name: need(c) for c in plan}
    results = []
    for c in boundary:  # first, so that a time budget shares what is left among the statistical cases
        results.append(_boundary_case(s, c, seed))
    run_stats = HostRun()
    total = sum(sizes.values())
    done_before = 0
    for i, c in enumerate(plan):
        pair = c.pair(seed)
        n = sizes[c.name]

        def tick(done, _total, _label=c.name, _base=done_before):
            if progress is not None:
                progress(_label, _base + done, total)

        deadline = None
        if seconds is not None:  # an equal share of the time left, so a case that ends early leaves more
            now = time.perf_counter()
            deadline = now + max(0.0, t_start + seconds - now) / (len(plan) - i)
        case_stats = HostRun()
        ck = _case_checkpoint(checkpoint_dir, s, c, seed, n, seconds)
        counts = _load_case(ck, case_stats)
        if counts is None:
            counts = run_host(s, pair.target, pair.draft, k=c.k, sequences=n, length=c.length, seed=seed,
                              batch=batch, label=c.name, progress=tick, stats=case_stats, deadline=deadline)
            _save_case(ck, counts, case_stats)
        done_before += n
        for f in ("calls", "rounds", "sampler_seconds", "seconds"):
            setattr(run_stats, f, getattr(run_stats, f) + getattr(case_stats, f))
        run_stats.warnings += [w for w in case_stats.warnings if w not in run_stats.warnings]
        tests, extra = battery._case_tests(c, schemes[c.k], pair.target, pair.draft, counts.pair(0), level, power)
        results.append(CaseResult(name=c.name, scheme=s.name, family=c.family, model=c.model, vocab=c.vocab, k=c.k,
                                  length=c.length, sequences=int(counts.sequences[0]), rounds=int(counts.rounds[0]),
                                  tests=tests, seconds=case_stats.seconds, **extra))
    results.sort(key=lambda r: rank[r.name])
    battery._holm_all(results, alpha)
    host_info = dict(sampler=s.name, inputs=s.inputs, batched=s.batched, rng=s.rng, arrays=s.arrays, rule=s.rule,
                     calls=run_stats.calls, rounds=run_stats.rounds, rounds_per_s=run_stats.rounds_per_s,
                     sampler_share=run_stats.sampler_seconds / run_stats.seconds if run_stats.seconds else None,
                     wasted_fraction=run_stats.wasted_fraction, tv=target_tv, time_budget_s=seconds,
                     warnings=run_stats.warnings)
    for w in run_stats.warnings:
        warnings.warn(w, HostNondeterminismWarning, stacklevel=2)
    return Report(scheme=s.name, alpha=alpha, seed=int(seed), budget=str(budget), cases=results,
                  seconds=time.perf_counter() - t_start, power=power,
                  engine=dict(host=host_info, devices=jax.device_count()))


def _boundary_case(s: HostSampler, c, seed: int):
    """The boundary pass as a case: the sampler's generator set to states whose uniforms are 0 and 1 - 2^-24."""
    from .report import CaseResult, TestResult

    pair = c.pair(seed)
    t0 = time.perf_counter()
    r = host_boundary_check(s, pair.target, pair.draft, k=c.k)
    test = TestResult("boundary-uniforms", float(r.violations), 1.0 if r.passed else 0.0, hard=True, detail=r.detail)
    return CaseResult(name=c.name, scheme=s.name, family=c.family, model=c.model, vocab=c.vocab, k=c.k,
                      length=c.length, sequences=0, rounds=r.rounds, tests=[test], min_detectable_tv=float("nan"),
                      seconds=time.perf_counter() - t0)


# --- checkpoints: one file per finished case -------------------------------------------------------

def _case_checkpoint(folder: Optional[str], s: HostSampler, c, seed: int, n: int, seconds) -> Optional[tuple]:
    """(path, signature) of a case's checkpoint, or None without a folder."""
    if folder is None:
        return None
    from .engine import STREAM_VERSION

    fn = s.fn
    code = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    fields = {f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name != "fn"}
    sig = repr(("host", STREAM_VERSION, code, sorted(fields.items()), c.name, c.k, c.length, int(seed), int(n),
                seconds))
    digest = hashlib.sha256(sig.encode()).hexdigest()
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"host-{s.name}-{c.name.replace('/', '_')}-s{seed}-{digest[:10]}.npz"), digest


def _load_case(ck: Optional[tuple], run_stats: HostRun) -> Optional[Counts]:
    saved = checkpoint.load(*ck) if ck else None
    if saved is None:
        return None
    for f in ("calls", "rounds"):
        setattr(run_stats, f, int(saved[f"stats_{f}"]))
    for f in ("sampler_seconds", "seconds"):
        setattr(run_stats, f, float(saved[f"stats_{f}"]))
    return Counts(**{name: (saved[name] if name in saved else None) for name in Counts._fields})


def _save_case(ck: Optional[tuple], counts: Counts, run_stats: HostRun) -> None:
    if not ck:
        return
    arrays = {name: v for name, v in counts._asdict().items() if v is not None}
    arrays.update({f"stats_{f}": getattr(run_stats, f) for f in ("calls", "rounds", "sampler_seconds", "seconds")})
    checkpoint.save(ck[0], ck[1], arrays)
