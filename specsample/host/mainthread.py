"""Run the user's callables on the main thread while specsample's own work runs in a worker.

The command line runs its work in a worker thread, so that Ctrl-C acts at once even while
XLA holds a thread for seconds (see ``cli._interruptible``). Some libraries keep state that
belongs to the main thread (MLX's random state on CPU, GUI toolkits, signal handlers): a
sampler, ``generate`` or ``next_token`` built on them breaks when called from another thread.
So the main thread *serves*: it waits for the worker in short, interruptible slices and runs
every user call the worker posts. Ctrl-C during a user call raises KeyboardInterrupt on the
main thread, as in any Python program, and the command line exits as usual.

Outside the command line (the Python API, tests) nothing serves and :func:`call` simply
calls the function in the calling thread.

>>> call(sum, [1, 2, 3])
6
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

_posted: "queue.Queue | None" = None  # set while the main thread serves


def call(fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` on the main thread when it is serving, else right here.

    Exceptions raised by ``fn`` are raised again in the caller's thread.
    """
    posted = _posted
    if posted is None or threading.current_thread() is threading.main_thread():
        return fn(*args, **kwargs)
    box: dict = {}
    done = threading.Event()
    posted.put((fn, args, kwargs, box, done))
    done.wait()
    if "error" in box:
        raise box["error"]
    if "value" not in box:  # the main thread was interrupted inside the call and is leaving
        raise RuntimeError(f"{getattr(fn, '__name__', 'call')} was interrupted on the main thread")
    return box["value"]


def serve(worker: threading.Thread, poll: float = 0.05) -> None:
    """On the main thread: start ``worker``, then run the calls it posts until it ends.

    The worker is started here, after the main thread is ready to serve, so that none of its
    calls runs on the worker's thread. KeyboardInterrupt (Ctrl-C) propagates to the caller,
    whether it arrives while waiting or inside a user call.
    """
    global _posted
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("serve() runs on the main thread")
    _posted = queue.Queue()
    try:
        worker.start()
        while worker.is_alive():
            try:
                fn, args, kwargs, box, done = _posted.get(timeout=poll)
            except queue.Empty:
                continue
            try:
                box["value"] = fn(*args, **kwargs)
            except Exception as e:  # handed back to the worker, which reports it as usual
                box["error"] = e
            finally:
                done.set()
    finally:
        _posted = None
