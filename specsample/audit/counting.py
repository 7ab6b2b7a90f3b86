"""Counting recorded rounds: :class:`Tally`, whose counts add exactly across batches, files and workers.

The uniforms of the randomised PIT come from a hash of the seed, request id, round and slot, never
from reading order, and the acceptance sums are kept in fixed point: a tally of the same rounds is
the same, bit for bit, however they were split. Imports numpy and the record reader only (workers
start fast).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import numpy as np

from .records import files, read_batches, work_units

BINS = 20
# the PIT in token-id order, and (record format 2) in each law's own probability-rank order
PIT_STAGES = ("drafting", "rejection", "bonus", "drafting[rank]", "rejection[rank]", "bonus[rank]")
_ONE = float(2 ** 32)  # fixed-point unit of the acceptance sums


_BLOCK = 8192  # rows hashed at a time: the hash's arrays stay in cache (2.7 x faster than a 65,536-row batch at once)
_ROWS = 16_384  # rounds a tally counts at a time, for the same reason


def _sliced(batch: dict, b: int, start: int, end: int) -> dict:
    """Rounds ``start:end`` of a batch of ``b`` (views: nothing copied)."""
    out = {key: (v[start:end] if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == b else v)
           for key, v in batch.items()}
    out["request_id"] = batch["request_id"].slice(start, end - start)
    return out


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser of ``x + golden ratio`` (uint64 arithmetic wraps; ``x`` is left as it is)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):  # numpy scalars warn on the wrap arrays do silently
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def round_bases(seed: int, request_hash: np.ndarray, round_: np.ndarray) -> np.ndarray:
    """Each round's 64-bit base, SplitMix64 of (seed, request id's hash, round): its uniforms are drawn
    from it (:func:`uniforms`), and it is the round's key when repeats are looked for (:func:`round_keys64`)."""
    mix = _splitmix(np.uint64(seed))
    return _splitmix(_splitmix(request_hash ^ mix) ^ round_.astype(np.uint64))


def uniforms(seed: int, request_hash: np.ndarray, round_: np.ndarray, slots: int) -> np.ndarray:
    """(b, slots) uniforms on (0, 1), a function of (seed, request id, round, slot) alone."""
    return uniforms_of(round_bases(seed, request_hash, round_), slots)


def uniforms_of(base: np.ndarray, slots: int) -> np.ndarray:
    """The (b, slots) uniforms of rounds whose :func:`round_bases` are ``base`` (a tally has them already)."""
    b = base.shape[0]
    out = np.empty((b, slots), np.float64)
    step = np.arange(1, slots + 1, dtype=np.uint64)[None, :]
    for start in range(0, b, _BLOCK):
        end = min(start + _BLOCK, b)
        x = _splitmix(base[start:end, None] + step)
        x >>= np.uint64(11)  # 53 bits, centred in their cell: never 0, never 1
        np.multiply(x, 2.0 ** -53, out=out[start:end], casting="unsafe")
        out[start:end] += 2.0 ** -54
    return out


def round_keys(batch: dict) -> np.ndarray:
    """Each round's identity, (request id's hash, round), as one 16-byte value a round (numpy void)."""
    pair = np.stack([batch["request_hash"].astype(np.uint64), batch["round"].astype(np.uint64)], axis=1)
    return np.ascontiguousarray(pair).view(np.dtype((np.void, 16))).ravel()


def round_keys64(batch: dict, seed: int) -> np.ndarray:
    """A 64-bit hash of each round's identity (its :func:`round_bases` under the audit's seed): what a tally
    keeps (8 bytes a round) to find repeats fast; a repeat of the hash is confirmed on the 16-byte identity
    (:func:`round_keys`) before anything is said."""
    return round_bases(seed, batch["request_hash"], batch["round"])


class DuplicateRounds(ValueError):
    """Rounds recorded more than once (log shipping at least once does this): the audit refuses them."""


def duplicate_keys(tallies: dict) -> np.ndarray:
    """The 64-bit keys that appear more than once across ``tallies``: candidates, confirmed by
    :func:`_repeated` (a 64-bit collision among a billion rounds has probability about 3 %)."""
    parts = [k for t in tallies.values() for k in t.keys]
    if not parts:
        return np.zeros(0, np.uint64)
    keys = np.sort(np.concatenate(parts))
    return np.unique(keys[1:][keys[1:] == keys[:-1]])


def _repeated(paths, candidates: np.ndarray, batch_size: int, seed: int) -> tuple[np.ndarray, int]:
    """The exact identities (16-byte keys) recorded more than once among ``candidates``, and how many
    copies beyond the first there are: a second reading of the files, made only when there are candidates."""
    found = []
    for _, _, batch in read_batches(paths, batch_size):
        hit = np.isin(round_keys64(batch, seed), candidates)
        if hit.any():
            found.append(round_keys(batch)[hit])
    if not found:
        return np.zeros(0, np.dtype((np.void, 16))), 0
    keys, counts = np.unique(np.concatenate(found), return_counts=True)
    return keys[counts > 1], int((counts[counts > 1] - 1).sum())


def _dedupe(batch: dict, dups: np.ndarray, seen: set) -> Optional[dict]:
    """``batch`` without the repeats of a duplicated round (its first copy kept), or None when nothing is left."""
    keys = round_keys(batch)
    hit = np.flatnonzero(np.isin(keys, dups))
    if not hit.size:
        return batch
    keep = np.ones(keys.size, bool)
    for i in hit:
        kb = keys[i].tobytes()
        keep[i] = kb not in seen
        seen.add(kb)
    if keep.all():
        return batch
    if not keep.any():
        return None
    import pyarrow

    b = keys.size
    out = {name: (v[keep] if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == b else v)
           for name, v in batch.items()}
    out["request_id"] = batch["request_id"].filter(pyarrow.array(keep))
    return out


def pit_bins(values: np.ndarray) -> np.ndarray:
    """The bin (0..BINS - 1) of each PIT value: BINS equiprobable cells of [0, 1]."""
    return np.clip((np.clip(values, 0.0, 1.0) * BINS).astype(np.int64), 0, BINS - 1)


@dataclasses.dataclass
class Tally:
    """The counts of one draft length's rounds; ``a + b`` merges two tallies exactly."""

    k: int
    rounds: int = 0
    invalid: int = 0
    draft_zero: int = 0  # drafts of q(x) = 0
    stop_zero: int = 0  # tokens emitted where their law is 0
    impossible: int = 0  # accepted with probability 0, or rejected with probability 1
    tested: np.ndarray = None
    accepted: np.ndarray = None
    # sums of acceptance probabilities a, and of a (1 - a), per slot, in fixed point (units of 2^-32):
    # integer sums add exactly in any order, so files, batches and workers merge bit for bit
    mean: np.ndarray = None
    var: np.ndarray = None
    pit: dict = None  # stage -> BINS counts
    first: str = ""  # the first hard violation, in words
    # each round's (request, round) hash, 8 bytes a round: a record shipped twice is found (round_keys64)
    keys: list = dataclasses.field(default_factory=list, repr=False, compare=False)

    def __post_init__(self):
        z = np.zeros(self.k, np.int64)
        self.tested = z.copy() if self.tested is None else self.tested
        self.accepted = z.copy() if self.accepted is None else self.accepted
        self.mean = z.copy() if self.mean is None else self.mean
        self.var = z.copy() if self.var is None else self.var
        self.pit = self.pit or {s: np.zeros(BINS, np.int64) for s in PIT_STAGES}

    def __add__(self, o: "Tally") -> "Tally":
        return Tally(self.k, self.rounds + o.rounds, self.invalid + o.invalid, self.draft_zero + o.draft_zero,
                     self.stop_zero + o.stop_zero, self.impossible + o.impossible, self.tested + o.tested,
                     self.accepted + o.accepted, self.mean + o.mean, self.var + o.var,
                     {s: self.pit[s] + o.pit[s] for s in self.pit}, self.first or o.first, self.keys + o.keys)

    def add(self, batch: dict, rule: str, seed: int, path: str = "", observe: bool = False) -> Optional[dict]:
        """Check and count one batch of rounds (:func:`~.records.read_batches`' dicts), ``_ROWS`` at a time.

        With ``observe``, also return what each stage observed, in the batch's order, for tests that
        read observations one by one (:mod:`.monitor`): ``{"rounds": the counted rounds' dict, stage:
        (row of each observation in it, its PIT value)}`` for the PIT stages, and ``"acceptance": (rows,
        accepted 0/1, acceptance probability)``. None when no round of the batch was counted."""
        b = batch["drafts"].shape[0]
        if observe or b <= _ROWS:
            return self._add(batch, rule, seed, path, observe)
        for start in range(0, b, _ROWS):  # slices small enough that their arrays stay in cache
            self._add(_sliced(batch, b, start, min(start + _ROWS, b)), rule, seed, path)
        return None

    def _add(self, batch: dict, rule: str, seed: int, path: str = "", observe: bool = False) -> Optional[dict]:
        k, drafts, tokens, n = self.k, batch["drafts"], batch["tokens"], batch["n_emitted"]
        b = drafts.shape[0]
        base = round_bases(seed, batch["request_hash"], batch["round"])  # the uniforms' seed, and the round's key
        self.keys.append(base)
        n_acc = n - 1
        rate_logged, vocab = "accept_rate" in batch, batch.get("vocab")
        ok = (n >= 1) & (n <= k + 1) & (tokens[np.arange(b), np.clip(n_acc, 0, k)] >= 0)
        # slot by slot: k is small, and k passes over b rounds cost less than one reduction along a short axis
        for j in range(k):
            reached = n_acc >= j
            ok &= (n_acc <= j) | (tokens[:, j] == drafts[:, j])  # the emitted start with the accepted drafts
            if rate_logged:  # every reached slot has its rate; an unlogged draft is -1
                ok &= ~reached | np.isfinite(batch["accept_rate"][:, j])
            else:
                ok &= ~reached | (drafts[:, j] >= 0)
            if vocab is not None:  # every draft in range; -1 only for a draft not logged (a file with accept_rate)
                ok &= ((drafts[:, j] >= 0) | rate_logged) & (drafts[:, j] < vocab)
        if vocab is not None:
            for j in range(k + 1):
                ok &= (tokens[:, j] < vocab) | (n <= j)
        self._note(~ok, batch, path, "emitted tokens that do not start with the accepted drafts, or a count "
                                     "outside 1..k + 1, or a token outside the vocabulary, or a draft (or its "
                                     "accept_rate) missing")
        counted = int(np.count_nonzero(ok))
        self.invalid += b - counted
        self.rounds += counted
        if not counted:
            return None
        sel = batch if counted == b else {key: (v[ok] if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == b
                                                else v) for key, v in batch.items()}
        if sel is not batch:
            sel["request_id"] = batch["request_id"].filter(_arrow_mask(ok))
        q, p, n_acc = sel["q_draft"], sel["p_draft"], sel["n_emitted"] - 1
        with np.errstate(invalid="ignore", divide="ignore"):  # NaN: a draft not logged (only with accept_rate)
            a_x = np.minimum(1.0, p / np.where(q > 0, q, 1.0)) if rule == "standard" else p
        rate = sel.get("accept_rate")  # the drafts were not all logged: acceptance against the mean over q
        a = a_x if rate is None else rate
        zero_q = q <= 0
        self._note(zero_q, sel, path, "a draft of q(x) = 0 (the draft cannot have come from q)")
        self.draft_zero += int(np.count_nonzero(zero_q))
        slots = np.arange(k)
        tested = slots[None, :] <= n_acc[:, None]
        acc = slots[None, :] < n_acc[:, None]
        never, sure = a_x <= 0, a_x >= 1  # NaN (a draft not logged) is neither
        if rate is not None:  # a slot whose mean acceptance is 0 or 1 decides alike whatever the draft
            never, sure = never | (rate <= 0), sure | (rate >= 1)
        imp = tested & ((acc & never) | (~acc & sure))
        self._note(imp, sel, path, "a draft accepted with probability 0 (p(x) = 0), or rejected with "
                                   "probability 1 (p(x) >= q(x))")
        self.impossible += int(np.count_nonzero(imp))
        t = tested & ~zero_q
        obs = {"rounds": sel} if observe else None
        if observe:
            rows, slot = np.nonzero(t)
            obs["acceptance"] = (rows, acc[rows, slot].astype(np.float64), a[rows, slot])
        # slot j is tested in the rounds that accepted at least j drafts, and accepted in those that accepted
        # more: counted from the histogram of n_acc (a sum along the rounds of a (b, k) array costs 10 x more)
        at_least = np.cumsum(np.bincount(n_acc, minlength=k + 1)[::-1])[::-1]
        tested_n, accepted_n = at_least[:k].copy(), at_least[1:].copy()
        if zero_q.any():  # a draft of q(x) = 0 is not tested (a hard violation, counted above)
            tested_n -= _column_sums(tested & zero_q)
            accepted_n -= _column_sums(acc & zero_q)
        self.tested += tested_n
        self.accepted += accepted_n
        # a and a (1 - a) at the tested slots, in fixed point (integers, so their sums are exact in any order)
        a_t = np.where(t, a, 0.0)
        self.mean += _column_sums(np.rint(a_t * _ONE))
        self.var += _column_sums(np.rint(a_t * (1 - a_t) * _ONE))
        # drafting: every draft's PIT under its own row of q (untestable where rejected drafts went unlogged:
        # the logged ones alone are a sample of the accepted, not of q)
        u = uniforms_of(base if sel is batch else base[ok], k + 1)
        cells = []
        if rate is None:
            lo, hi = sel["q_cdf_lo"], sel["q_cdf_hi"]
            cells.append(_cells(lo + u[:, :k] * (hi - lo), _OFFSET["drafting"], zero_q))
            if observe:
                obs["drafting"] = (np.nonzero(~zero_q)[0], (lo + u[:, :k] * (hi - lo))[~zero_q])
            if "q_rank_lo" in sel:
                rlo, rhi = sel["q_rank_lo"], sel["q_rank_hi"]
                cells.append(_cells(rlo + u[:, :k] * (rhi - rlo), _OFFSET["drafting[rank]"], zero_q))
                if observe:
                    obs["drafting[rank]"] = (np.nonzero(~zero_q)[0], (rlo + u[:, :k] * (rhi - rlo))[~zero_q])
        # the stop: a rejection (fewer than k accepted) or the bonus
        lo, hi = sel["stop_cdf_lo"], sel["stop_cdf_hi"]
        zero = hi - lo <= 0
        bonus = n_acc >= k
        # the slot says which stage emitted it: a rejection's residual, or the bonus after k acceptances
        self._note(zero & ~bonus, sel, path, "a token emitted at a rejection where its law, the residual "
                                             "norm(max(0, p - q)), gives probability 0 (stage: rejection)")
        self._note(zero & bonus, sel, path, "a bonus token emitted where p gives probability 0 (stage: bonus)")
        self.stop_zero += int(np.count_nonzero(zero))
        u_stop = u[:, k]
        pits = {"": lo + u_stop * (hi - lo)}
        if "stop_rank_lo" in sel:
            pits["[rank]"] = sel["stop_rank_lo"] + u_stop * (sel["stop_rank_hi"] - sel["stop_rank_lo"])
        stage_of = np.where(bonus, _OFFSET["bonus"] - _OFFSET["rejection"], 0)  # each round's stop stage
        for order, values in pits.items():
            cells.append(_cells(values, stage_of + _OFFSET["rejection" + order], zero))
        counts = sum(np.bincount(c.ravel(), minlength=_TRASH + 1) for c in cells)
        for stage, off in _OFFSET.items():
            self.pit[stage] += counts[off:off + BINS]
        if observe:
            for order, values in pits.items():
                for stage, where in (("rejection", ~bonus & ~zero), ("bonus", bonus & ~zero)):
                    obs[stage + order] = (np.nonzero(where)[0], values[where])
        return obs

    @property
    def expected(self) -> np.ndarray:
        """Sum of acceptance probabilities per slot."""
        return self.mean / _ONE

    @property
    def variance(self) -> np.ndarray:
        """Sum of a (1 - a) per slot: the variance of the accepted count."""
        return self.var / _ONE

    def _note(self, bad: np.ndarray, batch: dict, path: str, what: str) -> None:
        """Keep the first hard violation in words: ``bad`` a round's flag (b,) or a slot's (b, slots)."""
        if self.first or not np.any(bad):
            return
        j = int(np.flatnonzero(bad if bad.ndim == 1 else bad.any(axis=1))[0])
        self.first = (f"{path}: request {batch['request_id'][j].as_py()} round {int(batch['round'][j])}: {what} (drafts "
                      f"{batch['drafts'][j].tolist()}, emitted {batch['tokens'][j][:max(1, batch['n_emitted'][j])].tolist()})")


_OFFSET = {stage: i * BINS for i, stage in enumerate(PIT_STAGES)}  # each stage's cells in one bincount
_TRASH = len(PIT_STAGES) * BINS  # the cell of values not counted


def _column_sums(x: np.ndarray) -> np.ndarray:
    """Each column's sum of a (b, k) array of integers (booleans, or whole numbers up to 2^32 as floats), exact
    in int64. A matrix-vector product, 10 x faster than ``x.sum(axis=0)`` over a short row; exact because every
    partial sum is a whole number below 2^53 (b at most 2^20); longer arrays are summed in integers."""
    if x.shape[0] > 2 ** 20:
        return x.astype(np.int64).sum(axis=0)
    return (np.ones(x.shape[0]) @ x.astype(np.float64, copy=False)).astype(np.int64)


def _cells(values: np.ndarray, offset, skip: np.ndarray) -> np.ndarray:
    """Each PIT value's cell in the joint count: its bin (:func:`pit_bins`) plus its stage's ``offset``,
    or the trash cell where ``skip``."""
    c = np.clip(values, 0.0, 1.0)
    c *= BINS
    bins = c.astype(np.int64)
    np.clip(bins, 0, BINS - 1, out=bins)
    bins += offset
    bins[skip] = _TRASH
    return bins


def _arrow_mask(ok: np.ndarray):
    import pyarrow

    return pyarrow.array(ok)


def tally(paths, seed: int = 0, batch_size: int = 65_536, workers: int = 1, progress=None,
          dedupe: bool = False) -> dict:
    """``{(rule, k): Tally}`` over every round of the record files under ``paths``.

    ``workers > 1`` tallies files (and a Parquet file's row groups) in that many processes; the
    counts are identical to a serial tally's, bit for bit. ``progress(label, done, total)``, when
    given, is called as files (or a worker's units) finish. A round recorded twice (the same request
    id and round) raises :class:`DuplicateRounds` naming the count and the first one; with ``dedupe``
    its first copy is counted and the others dropped (serially, in file order).
    """
    out = Tallies(_tally_parallel(paths, seed, batch_size, workers, progress) if workers > 1 else
                  _tally_serial(paths, seed, batch_size, progress))
    candidates = duplicate_keys(out)
    dups, repeats = _repeated(paths, candidates, batch_size, seed) if candidates.size else \
        (np.zeros(0, np.dtype((np.void, 16))), 0)
    if dups.size and not dedupe:
        raise DuplicateRounds(f"{repeats:,} rounds recorded more than once; first: "
                              f"{_first_duplicate(paths, dups, batch_size)}. Log shipping at least once repeats "
                              "files: drop the repeats with --dedupe (dedupe=True), or audit each file once")
    if dups.size:
        out = Tallies(_tally_serial(paths, seed, batch_size, None, dups))
        out.dropped = repeats
    return out


class Tallies(dict):
    """``{(rule, k): Tally}``, and how many repeated rounds ``dropped`` were left out (``dedupe``)."""

    dropped: int = 0


def _first_duplicate(paths, dups: np.ndarray, batch_size: int) -> str:
    """The first repeated round in file order, and where its next copy is."""
    key, where = None, []
    for path, _, batch in read_batches(paths, batch_size):
        keys = round_keys(batch)
        hits = np.flatnonzero(np.isin(keys, dups) if key is None else keys == key)
        for i in hits:
            key = keys[i] if key is None else key
            if keys[i] == key:
                where.append(f"{path} (request {batch['request_id'][int(i)].as_py()}, round {int(batch['round'][i])})")
            if len(where) == 2:
                return " and ".join(where)
    return " and ".join(where)


def _tally_serial(paths, seed: int, batch_size: int, progress=None, dups=None) -> dict:
    out: dict = {}
    seen: set = set()
    names = files(paths) if progress is not None else None
    for i, path in enumerate(names if names is not None else [paths]):
        for where, rule, batch in read_batches(path, batch_size, ahead=True, mapped=True):
            if dups is not None:
                batch = _dedupe(batch, dups, seen)
                if batch is None:
                    continue
            t = out.setdefault((rule, batch["k"]), Tally(batch["k"]))
            t.add(batch, rule, seed, where)
        if progress is not None:
            progress("audit " + os.path.basename(path), i + 1, len(names))
    return out


def cores() -> int:
    """The cores this process may run on (its affinity where the system says, else the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def processes(workers: int) -> int:
    """How many processes ``workers`` asks for are worth starting: at most one per two cores. A serial
    audit already keeps two cores busy (its reader thread decodes the next batch while it counts this
    one), so on two cores a second process only shares them, and pays its start besides."""
    return max(1, min(workers, cores() // 2))


def _merge(parts) -> dict:
    out: dict = {}
    for part in parts:
        for key, t in part.items():
            out[key] = out[key] + t if key in out else t
    return out


def _tally_part(task) -> dict:
    path, groups, seed, batch_size, ahead = task
    out: dict = {}
    for _, rule, batch in read_batches(path, batch_size, row_groups=groups, ahead=ahead, mapped=True):
        out.setdefault((rule, batch["k"]), Tally(batch["k"])).add(batch, rule, seed, path)
    return out


def _tally_parallel(paths, seed: int, batch_size: int, workers: int, progress=None) -> dict:
    import concurrent.futures
    import multiprocessing

    # a worker reads ahead in a thread only where each has two cores: on 2 cores, two workers that each
    # read ahead ran at 0.74 x the serial audit's rate (four busy threads on two cores)
    ahead = cores() >= 2 * workers
    tasks = [(path, groups, seed, batch_size, ahead) for path, groups in work_units(paths, workers)]
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold JAX's threads
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as ex:
        parts = []
        for i, part in enumerate(ex.map(_tally_part, tasks)):
            parts.append(part)
            if progress is not None:
                progress("audit", i + 1, len(tasks))
        return _merge(parts)
