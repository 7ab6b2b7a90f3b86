"""Drawing sequences from a user's generate loop: one call a sequence, batched calls, or worker processes.

Sequence i is always generated with the seed ``seed_of(seed, label, i)`` and kept at row i, so
the sequences do not depend on how they were drawn: serially, ``batch`` at a time (a loop that
takes ``generate(prompts [B, P], n, seeds [B]) -> [B, n]``), or by ``workers`` processes (each
loads the loop by its ``path.py:fn`` name and returns its sequences by index), nor on where a
checkpointed run was stopped. With a deadline, no call starts after it (but the first, so that
there is something to test); the sequences drawn by then are a prefix of the full run's, so they
are an unbiased sample whatever the speed.
"""

from __future__ import annotations

import hashlib
import time
from typing import Callable, Optional

import numpy as np

from ..engine import checkpoint
from ..host import mainthread

SERIAL_CHUNK = 64  # sequences between progress reports (and checkpoint checks) for one-at-a-time loops


class LoopError(RuntimeError):
    """The user's ``generate`` or ``next_token`` raised (reported in one line, exit code 2)."""


def user_call(fn: Callable, role: str, *args):
    """``fn(*args)`` on the main thread; an exception of the user's code becomes one LoopError line."""
    from ..schemes import user_location

    try:
        return mainthread.call(fn, *args)
    except LoopError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        name = getattr(fn, "__name__", role)
        raise LoopError(f"{role} {name!r} raised: {type(e).__name__}: {first}{user_location(e)}") from e


def seed_of(seed: int, label: str, i: int) -> int:
    """Sequence i's seed: a function of the run's seed, the arm and i only."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{label}/{i}".encode()).digest()[:4], "little") >> 1


def _raw(generate: Callable, label: str, prompt: np.ndarray, length: int, seed: int, idx: range,
         batched: bool) -> list:
    """The loop's outputs for sequences ``idx``: (tokens, from_draft or None) each, not yet checked."""
    seeds = [seed_of(seed, label, i) for i in idx]
    if batched:
        out = user_call(generate, label, np.broadcast_to(prompt, (len(idx), prompt.size)).copy(), length,
                        np.asarray(seeds, np.int64))
        toks, flags = _split(out)
        if toks.ndim != 2 or toks.shape[0] != len(idx):
            raise LoopError(f"batched {label} returned shape {toks.shape} for {len(idx)} prompts; expected "
                            f"({len(idx)}, n)")
        return [(t, None if flags is None else flags[i]) for i, t in enumerate(toks)]
    return [_split(user_call(generate, label, prompt, length, s)) for s in seeds]


def _split(out) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """A loop's output: tokens, or (tokens, from_draft) with per-token provenance (True: an accepted draft)."""
    if isinstance(out, dict):
        return _numpy(out["tokens"]), _flags(out.get("from_draft"))
    if isinstance(out, tuple) and len(out) == 2:
        return _numpy(out[0]), _flags(out[1])
    return _numpy(out), None


def _flags(x) -> Optional[np.ndarray]:
    if x is None:
        return None
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, bool)


def _numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, np.int64)


def _clean(toks: np.ndarray, length: int, eos: Optional[int], vocab: Optional[int]) -> tuple[np.ndarray, bool]:
    """The first ``length`` tokens (EOS-padded after an EOS) and whether the output broke the contract."""
    toks = toks.ravel()[:length]
    bad = vocab is not None and bool(np.any((toks < 0) | (toks >= vocab)))
    if eos is not None and toks.size and np.any(toks == eos):
        first = int(np.argmax(toks == eos))
        bad |= bool(np.any(toks[first:] != eos))
        toks = np.concatenate([toks[: first + 1], np.full(length - first - 1, eos)])
    elif toks.size < length:
        bad = True
        toks = np.concatenate([toks, np.zeros(length - toks.size, np.int64)])
    return np.clip(toks, 0, (vocab or 1 << 62) - 1), bad


# --- worker processes: each loads the loop by name --------------------------------------------------

_WORKER_LOOP: dict = {}


def _worker_init(spec) -> None:
    from ..schemes import _load_object

    _WORKER_LOOP["fn"] = _load_object(spec) if isinstance(spec, str) else spec


def _worker_chunk(label: str, prompt: np.ndarray, length: int, seed: int, start: int, stop: int, batched: bool):
    return _raw(_WORKER_LOOP["fn"], label, prompt, length, seed, range(start, stop), batched)


def draw(generate, prompt, length: int, sequences: int, *, seed: int = 0, label: str = "generate",
         eos: Optional[int] = None, vocab: Optional[int] = None, progress=None,
         checkpoint_path: Optional[str] = None, checkpoint_every: float = 30.0, batch: int = 0, workers: int = 1,
         deadline: Optional[float] = None, provenance: bool = False) -> tuple:
    """Draw up to ``sequences`` sequences; returns (tokens [done, length], invalid outputs), and with
    ``provenance`` also ``from_draft`` [done, length] (a loop that returned none for a sequence is an error).

    ``generate`` is a callable, or (needed with ``workers > 1``, which loads it in each process)
    a ``path.py:fn`` / ``module:fn`` name. ``batch > 0`` calls it ``batch`` sequences at a time,
    batched. ``deadline`` (a ``time.perf_counter()`` value) stops new calls after it.
    """
    prompt = np.asarray(prompt, np.int64).ravel()
    out = np.zeros((sequences, length), np.int64)
    from_draft = np.zeros((sequences, length), bool)
    invalid, done = 0, 0
    signature = repr(("e2e", label, int(seed), int(length), int(sequences), prompt.tolist(), eos, vocab))
    saved = checkpoint.load(checkpoint_path, signature) if checkpoint_path else None
    if saved is not None:
        done, invalid = int(saved["done"]), int(saved["invalid"])
        out[:done] = saved["tokens"]
        from_draft[:done] = saved["from_draft"]
    last_save = time.monotonic()
    chunk = batch if batch > 0 else SERIAL_CHUNK
    starts = range(done, sequences, chunk)

    def save() -> None:
        checkpoint.save(checkpoint_path, signature,
                        {"done": done, "invalid": invalid, "tokens": out[:done], "from_draft": from_draft[:done]})

    def keep(rows: list) -> None:
        nonlocal invalid, done, last_save
        for toks, flags in rows:
            out[done], bad = _clean(toks, length, eos, vocab)
            if provenance:
                if flags is None or flags.size < min(length, toks.size):
                    raise LoopError(f"{label} returned no provenance (tokens, from_draft) for a sequence, though "
                                    "the run tests acceptance from it")
                from_draft[done, : min(length, flags.size)] = flags.ravel()[:length]
            invalid += int(bad)
            done += 1
        if progress is not None:
            progress(label, done, sequences)
        if checkpoint_path and time.monotonic() - last_save >= checkpoint_every:
            save()
            last_save = time.monotonic()

    def late() -> bool:
        return deadline is not None and time.perf_counter() >= deadline

    if workers > 1:
        _parallel(generate, label, prompt, length, seed, starts, chunk, sequences, batch > 0, workers, keep, late)
    else:
        fn = generate
        if isinstance(fn, str):
            from ..schemes import _load_object

            fn = mainthread.call(_load_object, fn)
        for s in starts:
            if late() and done:  # the first chunk is drawn whatever the clock says (nothing to test without it)
                break
            keep(_raw(fn, label, prompt, length, seed, range(s, min(s + chunk, sequences)), batch > 0))
    if checkpoint_path:
        save()
    return (out[:done], invalid, from_draft[:done]) if provenance else (out[:done], invalid)


def _parallel(generate, label, prompt, length, seed, starts, chunk, sequences, batched, workers, keep, late) -> None:
    """Chunks in worker processes, kept in index order (so the sequences do not depend on ``workers``)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if callable(generate) and getattr(generate, "__module__", "").startswith("_specsample_user_"):
        raise ValueError("workers load the loop by name in each process: give generate as 'path.py:fn'")
    pending, queue, submitted = [], iter(starts), [0]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                             initargs=(generate,)) as pool:
        def submit() -> bool:
            s = next(queue, None)
            if s is None or (late() and submitted[0]):  # as serially: the first chunk whatever the clock says
                return False
            pending.append(pool.submit(_worker_chunk, label, prompt, length, seed, s, min(s + chunk, sequences),
                                       batched))
            submitted[0] += 1
            return True

        for _ in range(2 * workers):
            if not submit():
                break
        while pending:
            keep(pending.pop(0).result())  # in order of index
            submit()
