"""The stage pass in a second process, beside the engine.

A case's stage pass depends on the scheme, the pair and the seed, not on the case's counts
(:func:`specsample.battery.suite._stage_pass`), so ``verify`` starts it before it samples. It is
Python and numpy work (a tree's replay, the stage laws) and tracing, and in a thread it takes turns
with the engine's own tracing on Python's one lock: a quick ``tree-wor`` battery ran 32-42 s with
the pass in a thread and 24-31 s with it here, the report unchanged. A transformer case plays no
stage pass (its stage tests read the rounds its engine run recorded), so a battery over KV caches
runs without the worker (:data:`KV_CACHE_SCHEMES`); where one runs anyway (``SPECSAMPLE_STAGE_WORKER=1``)
it computes those cases' exact prefix laws.

A scheme that specsample registers is named by strings (scheme, k), so a worker process rebuilds
the scheme; the case's pair comes over the pipe (the very arrays: a transformer pair took the child
a tenth of a second per case to build again), and the child plays the same pass with the same
programs (from the same compile cache): the same results, bit for bit. The worker is one long-lived child per
process (``python -m specsample.battery.stage_worker``, jobs and results pickled over its pipes),
started by the first battery that uses it. It is used only where it pays and cannot change a
result: a registered scheme (not a user's, which the child could not rebuild), on CPU (a second
process on one GPU would contend for its memory), with at least two cores and
:data:`MIN_CASES` stage passes to play. Anything else, or a worker that died, runs the pass in the
battery's thread as before. A battery that is done with its own work before the worker takes back the
worker's last jobs not started yet and plays them itself (:meth:`StageWorker.steal`).
"""

from __future__ import annotations

import atexit
import functools
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future
from typing import Callable, Optional

MIN_CASES = 8  # stage passes a battery must have before a worker process pays for its start (about 3 s)
# the registered schemes whose lanes carry KV caches: their batteries play no stage pass (a transformer case's
# stage tests read the rounds its engine run recorded), so the command starts no worker for them; named here,
# where the command looks before it imports JAX (tests/test_stage_worker.py holds it to the registry)
KV_CACHE_SCHEMES = frozenset({
    "cached", "recompute", "tree-cached", "control:bonus-not-in-target-cache", "control:draft-cache-not-rolled-back",
    "control:last-token-not-in-draft-cache", "control:target-cache-not-rolled-back",
    "control:tree-compact-first-branch", "control:tree-flat-positions", "control:tree-mask-siblings"})
ENV = "SPECSAMPLE_STAGE_WORKER"  # "0" / "off": never; "1" / "on": whenever it cannot change a result

_WORKER: Optional["StageWorker"] = None
_LOCK = threading.Lock()


def _send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the stage worker's pipe closed")
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


def eligible(spec, n_cases: int) -> bool:
    """Whether a battery of ``n_cases`` stage passes of scheme ``spec`` plays them in the worker."""
    setting = os.environ.get(ENV, "").strip().lower()
    if setting in ("0", "off", "false", "no"):
        return False
    import jax

    from ..schemes import builtin_scheme

    rebuilt = isinstance(spec, str) and builtin_scheme(spec)  # the child builds the scheme from its name
    if not rebuilt or jax.default_backend() != "cpu" or jax.process_count() > 1:
        return False
    return setting in ("1", "on", "true", "yes") or (n_cases >= MIN_CASES and _cores() >= 2)


class StageWorker:
    """A child process that plays stage passes one after another, in the order they were submitted."""

    def __init__(self):
        import importlib.util

        env = dict(os.environ)
        # the child's programs come from this process's compile cache (or none, as here); started before this
        # process imports JAX (the command), the child finds the same folder: the same environment, the same rule
        jax = sys.modules.get("jax")
        if jax is not None:
            env["SPECSAMPLE_COMPILE_CACHE"] = jax.config.jax_compilation_cache_dir or "off"
        # it imports the packages this process does (a checkout on sys.path, not installed), found unimported
        here = os.path.abspath(__file__)  # specsample/battery/stage_worker.py
        roots = {os.path.dirname(os.path.dirname(os.path.dirname(here))),
                 os.path.dirname(os.path.dirname(os.path.abspath(importlib.util.find_spec("stats").origin)))}
        env["PYTHONPATH"] = os.pathsep.join(sorted(roots) + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self._proc = subprocess.Popen([sys.executable, "-m", "specsample.battery.stage_worker"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._pending: dict = {}
        self._asked: dict = {}  # job -> Future[bool]: given back unstarted (True) or played there (False)
        self.stolen = 0  # jobs the child gave back and this process played
        self._next = 0
        self._lock = threading.Lock()
        self.broken: Optional[BaseException] = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # written by a thread: a full pipe never blocks verify
        threading.Thread(target=self._read, name="specsample-stage-results", daemon=True).start()
        threading.Thread(target=self._write, name="specsample-stage-jobs", daemon=True).start()

    def submit(self, fn: Callable, name: str, case, scheme, pair, sequences: int, seed: int) -> Future:
        """``fn(case, scheme, pair, sequences, seed)`` as a future: in the child, which imports ``fn`` by its
        module and name, rebuilds ``scheme`` from its registered ``name`` and takes ``pair`` as sent; here,
        with the objects given, if the worker cannot."""
        future: Future = Future()
        fallback = functools.partial(fn, case, scheme, pair, sequences, seed)
        with self._lock:
            if self.broken is None:
                job = self._next
                self._next += 1
                self._pending[job] = (future, fallback)
                self._jobs.put((job, f"{fn.__module__}:{fn.__qualname__}", name, scheme.k, case, pair, sequences,
                                seed))
                return future
        _run_into(future, fallback)
        return future

    def _write(self) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    break
                _send(self._proc.stdin, job)
            self._proc.stdin.close()
        except (OSError, ValueError):  # the child is gone: the reader settles what it owed
            pass

    def _read(self) -> None:
        try:
            while True:
                job, ok, value = _receive(self._proc.stdout)
                with self._lock:
                    future, _ = self._pending.pop(job)
                    asked = self._asked.pop(job, None)
                if ok is None:  # given back unstarted: the parent that asked plays it (steal)
                    asked.set_result(True)
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
                if asked is not None:
                    asked.set_result(False)
        except BaseException as e:  # the child died: what it still owed is computed here
            with self._lock:
                self.broken = e
                owed, self._pending = list(self._pending.values()), {}
                asked, self._asked = list(self._asked.values()), {}
            for future, fallback in owed:
                _run_into(future, fallback)
            for answer in asked:
                answer.set_result(False)  # played just above, whoever asked for it

    def steal(self) -> bool:
        """Play here the last job the child has not started (the parent, done with its own work, would
        otherwise wait for it); False when every job is started, done or asked for already.

        The child gives a job back only before it starts it, so each job runs once, on one side; it is
        the same call either way (:meth:`submit`'s fallback), so its result is the same."""
        with self._lock:
            left = [job for job in self._pending if job not in self._asked]
            if self.broken is not None or not left:
                return False
            job = max(left)  # the child works from the first: take from the other end
            asked = self._asked[job] = Future()
            future, fallback = self._pending[job]
        self._jobs.put(("give-back", job))
        if asked.result():  # waits for the child's answer, or for the result it was already making
            self.stolen += 1
            _run_into(future, fallback)
        return True

    def close(self) -> None:
        """End the child: at once if it still has jobs (nobody waits for them) or never had one (started
        early by a command that then stopped on an error: it may still be importing), else when its pipe
        closes."""
        if self._pending or self._next == 0:
            self._proc.kill()
            self._proc.wait()
            return
        self._jobs.put(None)
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()


def _run_into(future: Future, fn: Callable) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn())
    except BaseException as e:
        future.set_exception(e)


def worker() -> Optional[StageWorker]:
    """The process's stage worker, started on first use; None once it has broken."""
    global _WORKER
    with _LOCK:
        if _WORKER is None:
            _WORKER = StageWorker()
            atexit.register(_WORKER.close)
        return None if _WORKER.broken is not None else _WORKER


def start_early() -> None:
    """Start this process's worker now, before this process imports JAX, when a battery will likely use it
    (the command, for a registered scheme's default cases): the child's imports, about 1.5 s, then run
    beside this process's own instead of after them. A battery that turns out not to use it (not
    :func:`eligible`) leaves it idle; it ends with this process (:func:`shutdown`)."""
    if os.environ.get(ENV, "").strip().lower() in ("0", "off", "false", "no") or _cores() < 2:
        return
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    import importlib.util

    # a GPU or TPU plugin installed (or asked for): the battery would run there, without the worker
    if platforms not in ("", "cpu") or importlib.util.find_spec("jax_plugins") is not None:
        return
    worker()


def _cores() -> int:
    """The cores this process may run on (a taskset or a container's share), not the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def shutdown() -> None:
    """End this process's worker, if it started one (what :func:`worker` registers to run at exit, for a
    process that leaves without running its exit handlers: the command)."""
    with _LOCK:
        if _WORKER is not None:
            _WORKER.close()


def _serve() -> None:
    """The child: read (job, function, scheme, k, case, pair, sequences, seed), run it, write the result.

    A reader thread queues the jobs as they come, so that a ``("give-back", job)`` message (the parent's
    :meth:`StageWorker.steal`) can take back one not started yet: the child answers ``(job, None, None)``
    and never plays it. A job already started or done is not answered; its result comes as usual."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; the child ends when its pipe does
    from ..engine import compile_cache
    from ..heap import keep_freed_memory

    keep_freed_memory()  # as its parent, the command: large temporaries reuse freed memory

    compile_cache.enable()
    import collections
    import importlib

    from ..schemes import get_factory, make_scheme

    stdin = sys.stdin.buffer
    stdout = os.fdopen(os.dup(sys.stdout.fileno()), "wb")  # the results' pipe, on a descriptor of its own
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # anything else written to stdout (C too) goes to stderr
    sys.stdout = sys.stderr
    sending = threading.Lock()  # results (this thread) and answers (the reader) share the pipe
    waiting: collections.deque = collections.deque()
    arrived = threading.Condition()
    ended = []

    def send(message) -> None:
        try:
            with sending:
                _send(stdout, message)
        except OSError:  # the parent left without waiting for this result (it stopped on an error)
            os._exit(0)

    def read() -> None:
        while True:
            try:
                message = _receive(stdin)
            except EOFError:
                message = None
            with arrived:
                if message is None:  # the parent is done
                    ended.append(True)
                elif message[0] == "give-back":
                    left = [m for m in waiting if m[0] != message[1]]
                    if len(left) < len(waiting):  # not started: the parent plays it
                        waiting.clear()
                        waiting.extend(left)
                        send((message[1], None, None))
                else:
                    waiting.append(message)
                arrived.notify()
            if message is None:
                return

    threading.Thread(target=read, name="specsample-stage-jobs", daemon=True).start()
    while True:
        with arrived:
            while not waiting and not ended:
                arrived.wait()
            if not waiting:  # every result is sent, and JAX's teardown would keep the parent waiting
                stdout.flush()
                os._exit(0)
            job, fn, name, k, case, pair, sequences, seed = waiting.popleft()
        try:
            compile_cache.release_if_crowded()  # a long-lived child plays many batteries, as its parent does
            scheme = make_scheme(get_factory(name), k)
            module, _, attr = fn.partition(":")
            run = getattr(importlib.import_module(module), attr)  # by name: the battery imports this module
            result = (job, True, run(case, scheme, pair, sequences, seed))
        except Exception as e:
            result = (job, False, e)
        try:
            send(result)
        except (pickle.PicklingError, TypeError, AttributeError):  # an exception that does not pickle
            send((job, False, RuntimeError(f"{type(result[2]).__name__}: {result[2]}")))


if __name__ == "__main__":
    _serve()
