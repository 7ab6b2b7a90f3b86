"""Running a host sampler on a pair of table models: drafting, calling it in batches, counting."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from typing import Callable, Optional

import numpy as np

from . import mainthread, observe
from ..engine.lanes import Counts, transitions_from_joint
from ..models.tables import TableModel, validate_table, window_index

from .sampler import HostSampler, HostSamplerError, _derive


from ..battery.memory import ROW_BUDGET, rounds_per_call  # noqa: F401  (ROW_BUDGET: its old home)
FIRST_LANES = 16  # lanes a time-bounded run starts with, before it has timed a call
CALL_SECONDS = 0.25  # a time-bounded run sizes its lanes so that one call lasts about this long


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

class OutOfTime(BaseException):
    """A pass's share of ``--time`` ran out before a sampler call. A BaseException, so that no handler of the
    sampler's own errors (which wrap every Exception) mistakes it for one: the pass that set the clock
    catches it and reports what it did not reach."""


_CLOCK: dict = {"deadline": None, "tick": None, "calls": 0}


@contextlib.contextmanager
def clock(deadline: Optional[float] = None, tick: Optional[Callable[[int], None]] = None):
    """Within the block every sampler call first checks ``deadline`` (``time.perf_counter()``; raises
    :class:`OutOfTime` past it) and then calls ``tick(calls so far)``: how ``--time`` bounds the boundary
    and batch passes, whose calls are many and whose progress shows from the first one."""
    old = dict(_CLOCK)
    _CLOCK.update(deadline=deadline, tick=tick, calls=0)
    try:
        yield _CLOCK
    finally:
        _CLOCK.update(old)


GLOBAL_WATCH_CALLS = 4  # calls checked for draws from a global generator (a sampler that does, does so at once)


def _global_states() -> tuple:
    """Snapshots of the global generators a sampler could draw from behind specsample's back."""
    import sys

    torch = sys.modules.get("torch")
    t = torch.default_generator.get_state().numpy().tobytes() if torch is not None else None
    n = np.random.get_state(legacy=False)["state"]  # the legacy global generator: always MT19937
    return t, (n["key"].tobytes(), n["pos"])


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
        self.observed = False  # True for the battery's random rounds: shown to host.observe's observers
        self.generator = None
        if sampler.rng == "numpy":
            self.generator = np.random.default_rng(_derive(seed, label, "sampler"))
        elif sampler.rng == "torch":
            import torch

            self.generator = torch.Generator(device=sampler.device).manual_seed(_derive(seed, label, "sampler"))

    def _arrays(self, *xs):
        if self.s.arrays == "torch":
            import torch

            return tuple(torch.from_numpy(np.ascontiguousarray(x)).to(self.s.device) for x in xs)
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
        """``fn()`` on the main thread; the first calls watch the global generators (see _moved_global). Under a
        :func:`clock`, the deadline is checked before the call and the tick made after it."""
        if _CLOCK["deadline"] is not None and time.perf_counter() > _CLOCK["deadline"]:
            raise OutOfTime(self.label)
        if self.calls > GLOBAL_WATCH_CALLS:
            out = mainthread.call(fn)
        else:
            before = _global_states()
            out = mainthread.call(fn)
            note = _moved_global(before, _global_states(), self.s)
            if note and note not in self.warnings:
                self.warnings.append(note)
        _CLOCK["calls"] += 1
        if _CLOCK["tick"] is not None:
            _CLOCK["tick"](_CLOCK["calls"])
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

    def shown_self(self, context, drafts, tokens, n, rows) -> None:
        """A self-drafting sampler's round, shown to observers with the rows ``rows(context, drafts)``
        gives (computed only when someone watches)."""
        if self.observed and observe.active():
            observe.notify(self.label, drafts, *rows(context, drafts), tokens, n)

    def _shown(self, drafts, q_rows, p_rows, tokens, n):
        if self.observed and observe.active():
            observe.notify(self.label, drafts, q_rows, p_rows, tokens, n)
        return tokens, n

    def _seed_global(self):
        if self.s.rng == "torch-global" and self.seed_global:
            import torch

            # the CPU generator torch.rand uses (torch.manual_seed would also visit every device: 250 us a call)
            seed = _derive(self.seed, self.label, "global", self.calls)
            torch.default_generator.manual_seed(seed)
            if self.s.device.startswith("cuda"):  # the global generator of the device the sampler draws on
                torch.cuda.manual_seed(seed)

    def _error(self, e: Exception) -> "HostSamplerError":
        from ..schemes import user_location

        return HostSamplerError(f"sampler {self.s.name!r} raised: {type(e).__name__}: "
                                f"{(str(e).strip().splitlines() or [''])[0][:300]}{user_location(e)}")

    def __call__(self, drafts, q_rows, p_rows, n_draft=None):
        """(tokens [B, k + 1], n_emitted [B]) for drafts [B, k] and their rows; ``n_draft`` [B] (flat
        layout) says how many of each row's drafts the request has (default: all k)."""
        b, k = drafts.shape
        n_draft = np.full(b, k, np.int64) if n_draft is None else np.asarray(n_draft, np.int64)
        probs = (q_rows, p_rows)  # as drawn, before any log: what an observer is shown
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
            tokens, n = self._flat(drafts, q_rows, p_rows, n_draft, extra)
            for kk in np.unique(n_draft) if self.observed and observe.active() else ():  # a round per draft count
                m = n_draft == kk
                observe.notify(self.label, drafts[m, :kk], probs[0][m, :kk], probs[1][m, : kk + 1],
                               tokens[m, : kk + 1], n[m])
            return tokens, n
        if extra:
            p_rows = p_rows[:, :k]  # the bonus row is not passed when the bonus is given
        d, q, p, *extra = self._arrays(drafts, q_rows, p_rows, *extra)
        self._seed_global()
        self.calls += 1
        try:
            if self.s.batched:
                tokens, n = self._invoke(lambda: self.s.fn(d, q, p, *extra, self.generator))
                return self._shown(drafts, *probs, _as_int(tokens, "tokens"), _as_int(n, "n_emitted"))
            outs = self._invoke(lambda: [self.s.fn(d[i], q[i], p[i], *(x[i] for x in extra), self.generator)
                                         for i in range(b)])
            k1 = drafts.shape[1] + 1
            tokens = np.zeros((len(outs), k1), np.int64)
            n = np.zeros(len(outs), np.int64)
            for b, (t, m) in enumerate(outs):
                t = _as_int(t, "tokens").ravel()
                tokens[b, : min(k1, t.size)] = t[:k1]
                n[b] = int(_as_int(m, "n_emitted").ravel()[0])
            return self._shown(drafts, *probs, tokens, n)
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

            out = torch.from_numpy(np.ascontiguousarray(out))
            return out.to(self.torch) if isinstance(self.torch, str) else out  # the sampler's device
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
    batch = rounds_per_call(k, v, min(batch, sequences))  # rows sized from V and the memory free
    joint = v**length <= (1 << 16)
    rng = np.random.default_rng(_derive(seed, label, "drafts"))
    stats = stats if stats is not None else HostRun()
    call = _Caller(sampler, seed, label, stats.warnings)
    call.observed = True  # the battery's random rounds (rounds layout): what `verify --record` keeps
    # the flat layout's ragged draft counts: specsample's own draws, apart from the drafting stream
    ragged = np.random.default_rng(_derive(seed, label, "ragged")) if sampler.layout == "flat" else None
    t_start = time.perf_counter()
    # tables once: float32 rows as passed, the draft's float64 cumulative rows for drafting
    t32, d32, d_cdf = tt.astype(np.float32), dt.astype(np.float32), np.cumsum(dt, axis=-1)
    self_drafting = sampler.drafts == "self"
    if self_drafting:
        torch_arrays = sampler.device if sampler.arrays == "torch" else False
        draft_model = _HostModel(d32, md, width, sampler.draft_inputs == "logits", torch_arrays)
        target_model = _HostModel(t32, mt, width, sampler.target_inputs == "logits", torch_arrays)

    def target_rows(full):  # p's rows at each draft slot and the bonus slot of [n, width + k] tokens
        p_win = window_index(full[:, width - mt :], mt, v, np) if mt else np.zeros((full.shape[0], k + 1), int)
        return t32[p_win]

    def laws_at(context, drafts):  # (q rows, p rows) of a round: what an observer of a self-drafting round sees
        full = np.concatenate([context, drafts], axis=1)
        q_win = [window_index(full[:, width - md + i : width + i], md, v, np)[:, 0] if md
                 else np.zeros(full.shape[0], int) for i in range(k)]
        return d32[np.stack(q_win, 1)], target_rows(full)

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

    def start_lanes(first: bool = False) -> int:
        """Start new sequences on free lanes (lowest first) while any are left, under the lane cap;
        after the deadline none, except a case's first lanes (a case of no sequence tests nothing)."""
        if deadline is not None and time.perf_counter() >= deadline and not first:
            return 0
        free = np.flatnonzero(~live)[: max(0, min(cap - int(live.sum()), sequences - started))]
        ctx[free], pos[free], code[free], rnd[free] = 0, 0, 0, 0
        live[free] = True
        return free.size

    started += start_lanes(first=True)
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
            p_rows = target_rows(full)  # [n_a, k + 1, V], float32 as a sampler sees them
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
            call.shown_self(ctx[a], drafts, tokens, n_em, laws_at)
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
