"""``specsample audit --follow DIR``: watch a live engine's record files, alarm the moment a deviation is established.

Each new record file in the folder is read once, when it is complete, and its rounds feed one
e-process per stage and draft length (:mod:`stats.anytime`):

* ``stage:drafting``, ``stage:rejection``, ``stage:bonus``: the randomised PIT of each token under
  the law it must follow (the batch audit's PIT, :class:`~.counting.Tally`), binned into
  ``BINS`` equiprobable cells, against the uniform law, by Dirichlet-mixture likelihood ratios
  averaged over views of 2, 4, 10 and 20 bins and of each bin against the rest
  (:func:`stats.anytime.multiscale_log_e`);
* ``stage:acceptance``: each tested draft's acceptance (0 or 1) against its probability
  (min(1, p/q), or the logged ``accept_rate``), by a mixture of betting martingales.

Under a correct engine each is a martingale of expectation 1, so by Ville's inequality it ever
reaches 1 / a with probability at most a, however long the stream and however often it is read.
The (rule, k) streams get ``alpha / (i (i + 1))`` in the order they first appear (a family of
unknown size; it sums to alpha), split evenly over the seven stage tests (the PIT stages in token-id and,
in record format 2, rank order): the probability that a correct
engine ever raises an alarm is at most alpha. Hard checks (a token its law forbids, a malformed
round) alarm at once. The state is the counts and wealths alone, plus the names of the files of
the last ``horizon`` seconds: memory does not grow with the stream.

A file counts once it is complete: its size and modification time unchanged over ``settle``
seconds and its format's closing bytes present (Parquet's ``PAR1``, Arrow IPC's ``ARROW1``). Names
that start with ``.`` or end in ``.tmp`` or ``.partial`` are skipped, so a writer that writes under
such a name and renames the file when done is read exactly once, whole.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Callable, Optional

import numpy as np

import stats
from stats import anytime

from ..battery.report import Report, TestResult
from .counting import BINS, Tally, pit_bins
from .records import SUFFIXES, read_batches

# the PIT stages in token-id order and (record format 2) in rank order: alpha is split over all seven
STAGES = ("drafting", "acceptance", "rejection", "bonus", "drafting[rank]", "rejection[rank]", "bonus[rank]")
MULTIPLICITY = "anytime-valid e-process"  # the headline: "(anytime-valid e-process family-wise alpha = 0.01)"
_UNIFORM = np.full(BINS, 1.0 / BINS)
_VIEWS = anytime.coarsenings(BINS)  # 2, 4, 10, 20 bins and each bin alone: broad shifts and spikes show early
_TAILS = (b"PAR1", b"ARROW1")


def _e(log_e: float) -> str:
    """An e-value for people, from its log: 3.2, 1.6e+03, or 10^512 past what a float holds."""
    return f"{np.exp(log_e):.3g}" if log_e < 700 else f"10^{log_e / np.log(10):.0f}"


@dataclasses.dataclass
class _Stage:
    """One e-process: its sufficient statistics, the largest log e-value it has reached, and where it
    first reached its alarm line."""

    alpha: float
    counts: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(BINS, np.int64))
    wealth: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(anytime.BETS.size))
    log_e: float = 0.0
    max_log_e: float = 0.0
    n: int = 0
    where: str = ""

    @property
    def line(self) -> float:
        return float(np.log(1.0 / self.alpha))


@dataclasses.dataclass
class _Stream:
    index: int
    tally: Tally
    stages: dict
    first_file: str = ""


class Monitor:
    """The anytime-valid state of a live audit; :meth:`add_file` feeds it, :meth:`report` reads it.

    Parameters
    ----------
    alpha : float
        The bound on the probability of any false alarm over the whole stream.
    seed : int
        Seeds the randomised PIT's uniforms, as in the batch audit.
    """

    def __init__(self, alpha: float = 0.01, seed: int = 0, batch_size: int = 65_536):
        self.alpha = stats.multiplicity.check_level(alpha)
        self.seed, self.batch_size = seed, batch_size
        self.streams: dict = {}
        self.files = 0
        self.rounds = 0
        self.alarm: Optional[str] = None  # what established the deviation, in words
        self.started = time.perf_counter()
        self._lock = threading.Lock()  # a report read on Ctrl-C, beside the reading thread

    def _stream(self, rule: str, k: int, path: str) -> _Stream:
        key = (rule, k)
        if key not in self.streams:
            i = len(self.streams) + 1
            share = anytime.alpha_share(self.alpha, i) / len(STAGES)
            self.streams[key] = _Stream(i, Tally(k), {s: _Stage(share) for s in STAGES}, path)
        return self.streams[key]

    def add_file(self, path: str) -> Optional[str]:
        """Read one complete record file; returns the alarm (in words) when this file established one."""
        with self._lock:
            for where, rule, batch in read_batches(path, self.batch_size):
                s = self._stream(rule, batch["k"], where)
                hard_before = s.tally.first
                obs = s.tally.add(batch, rule, self.seed, where, observe=True)
                s.tally.keys.clear()  # a stream's round keys would grow without end: the monitor keeps none
                self.rounds = sum(x.tally.rounds for x in self.streams.values())
                if s.tally.first and not hard_before:
                    self.alarm = f"records/{rule}/k{s.tally.k}: hard check: {s.tally.first}"
                    break
                if obs is not None and self._update(s, rule, obs, where):
                    break
            self.files += 1
            return self.alarm

    def _update(self, s: _Stream, rule: str, obs: dict, path: str) -> bool:
        rounds = obs["rounds"]
        for stage in STAGES:
            if stage not in obs:
                continue
            st = s.stages[stage]
            if stage == "acceptance":
                rows, x, mu = obs[stage]
                before = st.wealth.copy()
                st.wealth += anytime.betting_log_wealth(x, mu)
                st.log_e = anytime.betting_log_e(st.wealth)
                path_of = (lambda rows=rows, x=x, mu=mu, before=before: anytime.betting_path(x, mu, before))
            else:
                rows, values = obs[stage]
                cells = pit_bins(values)
                before = st.counts.copy()
                st.counts += np.bincount(cells, minlength=BINS)
                st.log_e = anytime.multiscale_log_e(st.counts, _UNIFORM, _VIEWS)
                path_of = (lambda cells=cells, before=before:
                           anytime.multiscale_path(cells, before, _UNIFORM, _VIEWS))
            st.n += int(rows.size)
            st.max_log_e = max(st.max_log_e, st.log_e)
            if st.max_log_e >= st.line and not st.where:
                # the first observation at which the evidence reached the line: the round to look at
                trace = path_of()
                i = int(np.argmax(trace >= st.line)) if np.any(trace >= st.line) else trace.size - 1
                row = int(rows[i])
                st.where = (f"{path}: request {rounds['request_id'][row].as_py()} round {int(rounds['round'][row])}")
                self.alarm = (f"records/{rule}/k{s.tally.k}: stage:{stage}: e-value {_e(st.max_log_e)} "
                              f">= {1 / st.alpha:.3g} after {st.n:,} observations; first decisive evidence at "
                              f"{st.where}")
                return True
        return False

    def strongest(self) -> tuple:
        """``(case, stage, log e-value, alarm line)`` of the stage nearest its alarm line, or None."""
        best = None
        for (rule, k), s in self.streams.items():
            for name, st in s.stages.items():
                ratio = st.max_log_e / st.line
                if best is None or ratio > best[0]:
                    best = (ratio, f"records/{rule}/k{k}", name, st.max_log_e, 1 / st.alpha)
        return best[1:] if best else None

    def status(self) -> str:
        """One short line: files, rounds and the strongest evidence so far."""
        best = self.strongest()
        top = (f"strongest {best[0]} stage:{best[1]} e = {_e(best[2])} (alarm at {best[3]:.3g})" if best
               else "no rounds yet")
        return f"{time.strftime('%H:%M:%S')}  {self.files:,} files, {self.rounds:,} rounds; {top}"

    def report(self, name: str = "") -> Report:
        """The monitor's state as a :class:`Report`: the batch audit's hard checks and stage diagnosis per
        draft length, each stage's test its e-process (statistic: the e-value now; p-value:
        ``min(1, 1 / max e)``, adjusted to the family's alpha)."""
        from .run import _case

        with self._lock:
            cases = []
            for (rule, _), s in sorted(self.streams.items()):
                c = _case(rule, s.tally, self.alpha, 0.99, time.perf_counter() - self.started)
                tests = []
                for t in c.tests:
                    if t.hard:
                        t.adjusted, t.rejected = t.pvalue, t.pvalue == 0.0
                        tests.append(t)
                        continue
                    stage = t.name.split(":", 1)[1]  # "bonus" or "bonus[rank]"
                    st = s.stages[stage]
                    p = anytime.anytime_pvalue(st.max_log_e)
                    detail = (f"e-process over {st.n:,} observations: e now {_e(st.log_e)}, largest "
                              f"{_e(st.max_log_e)}, alarm at {1 / st.alpha:.3g}"
                              + (f"; reached at {st.where}" if st.where else "") + f"; fixed-sample view: {t.detail}")
                    tests.append(TestResult(t.name, float(np.exp(min(st.log_e, 700.0))), p, 0, detail=detail,
                                            min_detectable_tv=None, adjusted=min(1.0, p * self.alpha / st.alpha),
                                            rejected=st.max_log_e >= st.line))
                c.tests = tests
                c.min_detectable_tv, c.min_tv_note = float("nan"), "anytime-valid: no fixed sample size"
                cases.append(c)
            return Report(scheme=name or "live records", alpha=self.alpha, seed=self.seed, budget="follow",
                          cases=cases, seconds=time.perf_counter() - self.started, power=0.99,
                          engine={"audit": {"rounds": self.rounds, "files": self.files, "alarm": self.alarm,
                                            "rounds_per_s": self.rounds / max(1e-9, time.perf_counter()
                                                                              - self.started)}},
                          multiplicity=MULTIPLICITY)


def complete(path: str) -> bool:
    """Whether a record file looks whole: its format's closing bytes are there (Parquet, Arrow IPC)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size < 12 and not path.endswith(".jsonl"):
                return False
            f.seek(size - 8)
            tail = f.read()
    except OSError:
        return False
    if path.endswith(".jsonl"):
        return tail.endswith(b"\n")  # a line being written has no newline yet
    return tail.endswith(_TAILS[0] if path.endswith(".parquet") else _TAILS[1])


class Folder:
    """New, complete record files under a folder, each returned once (memory bounded by ``horizon``)."""

    def __init__(self, folder: str, settle: float = 1.0, horizon: float = 3600.0, clock: Callable = time.time):
        if not os.path.isdir(folder):
            raise ValueError(f"--follow {folder!r}: not a folder; give the folder the engine writes its record "
                             f"files into")
        self.folder, self.settle, self.horizon, self.clock = folder, settle, horizon, clock
        self.done: dict = {}  # path -> mtime, for the files of the last `horizon` seconds
        self.pending: dict = {}  # path -> (size, mtime_ns, since): seen, not yet settled
        self.newest = float("-inf")

    def _candidates(self):
        for root, dirs, names in os.walk(self.folder):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for n in names:
                if n.startswith(".") or n.endswith((".tmp", ".partial")) or not n.endswith(SUFFIXES):
                    continue
                path = os.path.join(root, n)
                try:
                    st = os.stat(path)
                except OSError:  # rotated away between the listing and the stat
                    continue
                yield path, st

    def ready(self) -> list:
        """The files that completed since the last call, oldest first."""
        now, out = self.clock(), []
        for path, st in self._candidates():
            mtime = st.st_mtime
            if path in self.done or mtime < self.newest - self.horizon:
                continue  # read already (or older than the horizon: read before it was forgotten)
            seen = self.pending.get(path)
            if seen is None or seen[:2] != (st.st_size, st.st_mtime_ns):
                self.pending[path] = (st.st_size, st.st_mtime_ns, now)
                if self.settle > 0:
                    continue
                seen = self.pending[path]
            if now - seen[2] >= self.settle and complete(path):
                out.append((mtime, path))
        for mtime, path in sorted(out):
            del self.pending[path]
            self.done[path] = mtime
            self.newest = max(self.newest, mtime)
        self.done = {p: m for p, m in self.done.items() if m >= self.newest - self.horizon}
        return [p for _, p in sorted(out)]


def follow(folder: str, *, alpha: float = 0.01, seed: int = 0, batch_size: int = 65_536, poll: float = 1.0,
           settle: float = 1.0, idle_exit: Optional[float] = None, status: Optional[Callable] = print,
           monitor: Optional[Monitor] = None, sleep: Callable = time.sleep) -> Monitor:
    """Watch ``folder`` until a deviation is established (``monitor.alarm`` set) or, with ``idle_exit``,
    until that many seconds pass without a new file; returns the monitor (:meth:`Monitor.report`).

    Examples
    --------
    >>> from specsample.audit.monitor import follow
    >>> m = follow("rounds/", idle_exit=600)  # doctest: +SKIP
    >>> m.alarm, m.report().passed  # doctest: +SKIP
    """
    watch = Folder(folder, settle=settle)
    m = monitor or Monitor(alpha, seed, batch_size)
    last = time.monotonic()
    while True:
        new = watch.ready()
        for path in new:
            m.add_file(path)
            if status is not None:
                status(m.status())
            if m.alarm:
                return m
        if new or watch.pending:  # a file still settling is not idleness
            last = time.monotonic()
        elif idle_exit is not None and time.monotonic() - last >= idle_exit:
            return m
        sleep(poll)
