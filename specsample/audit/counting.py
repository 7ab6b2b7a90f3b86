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

from .records import files, prefetched, read_batches, work_units

BINS = 20
# the PIT in token-id order, and (record format 2) in each law's own probability-rank order
PIT_STAGES = ("drafting", "rejection", "bonus", "drafting[rank]", "rejection[rank]", "bonus[rank]")
_ONE = float(2 ** 32)  # fixed-point unit of the acceptance sums


def _fixed(x: np.ndarray) -> np.ndarray:
    return np.rint(x * _ONE).astype(np.int64)
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _M64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
        return x ^ (x >> np.uint64(31))


def uniforms(seed: int, request_hash: np.ndarray, round_: np.ndarray, slots: int) -> np.ndarray:
    """(b, slots) uniforms on (0, 1), a function of (seed, request id, round, slot) alone."""
    with np.errstate(over="ignore"):
        base = _splitmix(request_hash ^ _splitmix(np.uint64(seed)))
        base = _splitmix(base ^ round_.astype(np.uint64))
        x = _splitmix(base[:, None] + np.arange(1, slots + 1, dtype=np.uint64)[None, :])
    return ((x >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53


def round_keys(batch: dict) -> np.ndarray:
    """Each round's identity, (request id's hash, round), as one 16-byte value a round (numpy void)."""
    pair = np.stack([batch["request_hash"].astype(np.uint64), batch["round"].astype(np.uint64)], axis=1)
    return np.ascontiguousarray(pair).view(np.dtype((np.void, 16))).ravel()


def round_keys64(batch: dict) -> np.ndarray:
    """A 64-bit hash of each round's identity: what a tally keeps (8 bytes a round) to find repeats fast;
    a repeat of the hash is confirmed on the 16-byte identity (:func:`round_keys`) before anything is said."""
    with np.errstate(over="ignore"):
        return _splitmix(batch["request_hash"].astype(np.uint64) ^ _splitmix(batch["round"].astype(np.uint64)))


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


def _repeated(paths, candidates: np.ndarray, batch_size: int) -> tuple[np.ndarray, int]:
    """The exact identities (16-byte keys) recorded more than once among ``candidates``, and how many
    copies beyond the first there are: a second reading of the files, made only when there are candidates."""
    found = []
    for _, _, batch in read_batches(paths, batch_size):
        hit = np.isin(round_keys64(batch), candidates)
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
        """Check and count one batch of rounds (:func:`~.records.read_batches`' dicts).

        With ``observe``, also return what each stage observed, in the batch's order, for tests that
        read observations one by one (:mod:`.monitor`): ``{"rounds": the counted rounds' dict, stage:
        (row of each observation in it, its PIT value)}`` for the PIT stages, and ``"acceptance": (rows,
        accepted 0/1, acceptance probability)``. None when no round of the batch was counted."""
        k, drafts, tokens, n = self.k, batch["drafts"], batch["tokens"], batch["n_emitted"]
        b = drafts.shape[0]
        self.keys.append(round_keys64(batch))
        slots = np.arange(k)
        n_acc = n - 1
        prefix_ok = np.all((slots[None, :] >= n_acc[:, None]) | (tokens[:, :k] == drafts), axis=1)
        ok = (n >= 1) & (n <= k + 1) & prefix_ok & (tokens[np.arange(b), np.clip(n_acc, 0, k)] >= 0)
        reached = slots[None, :] <= n_acc[:, None]
        if "accept_rate" in batch:  # every reached slot has its rate; an unlogged draft is -1
            ok &= np.all(~reached | np.isfinite(batch["accept_rate"]), axis=1)
        else:
            ok &= np.all(~reached | (drafts >= 0), axis=1)
        if "vocab" in batch:
            ok &= np.all((tokens < batch["vocab"]) | (np.arange(k + 1)[None, :] >= n[:, None]), axis=1)
            # every draft in range; -1 only for a draft not logged (a file with accept_rate)
            ok &= np.all(((drafts >= 0) | ("accept_rate" in batch)) & (drafts < batch["vocab"]), axis=1)
        self._note(~ok, batch, path, "emitted tokens that do not start with the accepted drafts, or a count "
                                     "outside 1..k + 1, or a token outside the vocabulary, or a draft (or its "
                                     "accept_rate) missing")
        self.invalid += int((~ok).sum())
        self.rounds += int(ok.sum())
        if not ok.any():
            return None
        sel = batch if ok.all() else {key: (v[ok] if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == b else v)
                                      for key, v in batch.items()}
        if sel is not batch:
            sel["request_id"] = batch["request_id"].filter(_arrow_mask(ok))
        q, p, n_acc = sel["q_draft"], sel["p_draft"], sel["n_emitted"] - 1
        with np.errstate(invalid="ignore"):  # NaN: a draft not logged (only with accept_rate)
            a_x = np.minimum(1.0, p / np.where(q > 0, q, 1.0)) if rule == "standard" else p
        rate = sel.get("accept_rate")  # the drafts were not all logged: acceptance against the mean over q
        a = a_x if rate is None else rate
        zero_q = q <= 0
        self._note(zero_q.any(1), sel, path, "a draft of q(x) = 0 (the draft cannot have come from q)")
        self.draft_zero += int(zero_q.sum())
        tested = slots[None, :] <= n_acc[:, None]
        acc = slots[None, :] < n_acc[:, None]
        never, sure = a_x <= 0, a_x >= 1  # NaN (a draft not logged) is neither
        if rate is not None:  # a slot whose mean acceptance is 0 or 1 decides alike whatever the draft
            never, sure = never | (rate <= 0), sure | (rate >= 1)
        imp = tested & ((acc & never) | (~acc & sure))
        self._note(imp.any(1), sel, path, "a draft accepted with probability 0 (p(x) = 0), or rejected with "
                                          "probability 1 (p(x) >= q(x))")
        self.impossible += int(imp.sum())
        t = tested & ~zero_q
        obs = {"rounds": sel} if observe else None
        if observe:
            rows, slot = np.nonzero(t)
            obs["acceptance"] = (rows, acc[rows, slot].astype(np.float64), a[rows, slot])
        self.tested += t.sum(0)
        self.accepted += (acc & t).sum(0)
        self.mean += _fixed(np.where(t, a, 0)).sum(0)
        self.var += _fixed(np.where(t, a * (1 - a), 0)).sum(0)
        # drafting: every draft's PIT under its own row of q (untestable where rejected drafts went unlogged:
        # the logged ones alone are a sample of the accepted, not of q)
        u = uniforms(seed, sel["request_hash"], sel["round"], k + 1)
        if rate is None:
            lo, hi = sel["q_cdf_lo"], sel["q_cdf_hi"]
            self._pit("drafting", (lo + u[:, :k] * (hi - lo))[~zero_q])
            if observe:
                obs["drafting"] = (np.nonzero(~zero_q)[0], (lo + u[:, :k] * (hi - lo))[~zero_q])
            if "q_rank_lo" in sel:
                rlo, rhi = sel["q_rank_lo"], sel["q_rank_hi"]
                self._pit("drafting[rank]", (rlo + u[:, :k] * (rhi - rlo))[~zero_q])
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
        self.stop_zero += int(zero.sum())
        pit = lo + u[:, k] * (hi - lo)
        self._pit("rejection", pit[~bonus & ~zero])
        self._pit("bonus", pit[bonus & ~zero])
        pits = {"": pit}
        if "stop_rank_lo" in sel:
            pits["[rank]"] = sel["stop_rank_lo"] + u[:, k] * (sel["stop_rank_hi"] - sel["stop_rank_lo"])
            self._pit("rejection[rank]", pits["[rank]"][~bonus & ~zero])
            self._pit("bonus[rank]", pits["[rank]"][bonus & ~zero])
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

    def _pit(self, stage: str, values: np.ndarray) -> None:
        self.pit[stage] += np.bincount(pit_bins(values), minlength=BINS)

    def _note(self, bad: np.ndarray, batch: dict, path: str, what: str) -> None:
        if self.first or not np.any(bad):
            return
        j = int(np.flatnonzero(bad)[0])
        self.first = (f"{path}: request {batch['request_id'][j].as_py()} round {int(batch['round'][j])}: {what} (drafts "
                      f"{batch['drafts'][j].tolist()}, emitted {batch['tokens'][j][:max(1, batch['n_emitted'][j])].tolist()})")


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
    dups, repeats = _repeated(paths, candidates, batch_size) if candidates.size else \
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
        for where, rule, batch in prefetched(read_batches(path, batch_size)):
            if dups is not None:
                batch = _dedupe(batch, dups, seen)
                if batch is None:
                    continue
            t = out.setdefault((rule, batch["k"]), Tally(batch["k"]))
            t.add(batch, rule, seed, where)
        if progress is not None:
            progress("audit " + os.path.basename(path), i + 1, len(names))
    return out


def _merge(parts) -> dict:
    out: dict = {}
    for part in parts:
        for key, t in part.items():
            out[key] = out[key] + t if key in out else t
    return out


def _tally_part(task) -> dict:
    path, groups, seed, batch_size, ahead = task
    out: dict = {}
    batches = read_batches(path, batch_size, row_groups=groups)
    for _, rule, batch in prefetched(batches) if ahead else batches:
        out.setdefault((rule, batch["k"]), Tally(batch["k"])).add(batch, rule, seed, path)
    return out


def _tally_parallel(paths, seed: int, batch_size: int, workers: int, progress=None) -> dict:
    import concurrent.futures
    import multiprocessing

    # a worker reads ahead in a thread only where cores are left over: on 2 cores, two workers that each
    # read ahead ran at 0.74 x the serial audit's rate (four busy threads on two cores)
    ahead = (os.cpu_count() or 1) > workers
    tasks = [(path, groups, seed, batch_size, ahead) for path, groups in work_units(paths, workers)]
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold JAX's threads
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as ex:
        parts = []
        for i, part in enumerate(ex.map(_tally_part, tasks)):
            parts.append(part)
            if progress is not None:
                progress("audit", i + 1, len(tasks))
        return _merge(parts)
