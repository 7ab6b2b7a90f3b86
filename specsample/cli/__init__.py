"""Command line: ``specsample verify | measure | list | figures | calibrate | bench | decode | audit``.

Exit codes: 0 no deviation found, 1 a deviation found, 2 bad usage or input (3: ``measure`` undecided).
This module starts a command and keeps Ctrl-C prompt; the rooms beside it hold the options and parser
(:mod:`.options`), a battery run shared by ``verify`` and ``measure`` (:mod:`.run`), those two commands
(:mod:`.verify`), the audit (:mod:`.audit`) and the other tools (:mod:`.tools`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from ..host import mainthread
from .audit import _cmd_audit
from .options import SHARED_REPORT_OPTIONS, _parser
from .run import _INTERRUPT_HOOKS, _default_battery
from .tools import _cmd_bench, _cmd_calibrate, _cmd_decode, _cmd_figures, _cmd_list
from .verify import _cmd_measure, _cmd_verify

_PKG = "specsample"  # the package whose modules are looked up by name in sys.modules
__all__ = ["SHARED_REPORT_OPTIONS", "entry", "main"]

def _exit_at_once(signum, frame):
    """Ctrl-C before any work (while JAX and the schemes import): nothing to save, leave now.

    Raising KeyboardInterrupt inside an import can leave a module lock half released, and the
    interpreter then may hang on its way out; os._exit does not wait for anything.
    """
    print("\nspecsample: interrupted", file=sys.stderr, flush=True)
    os._exit(130)


def entry() -> int:
    """The ``specsample`` command: :func:`main` with traced programs kept between runs
    (:mod:`specsample.program_cache`; a process that calls :func:`main` itself, a test, leaves them off).

    When the command is done it flushes its output and leaves at once (``os._exit``): everything it writes
    is written and closed by then, and tearing down JAX's backends and the interpreter took a warm
    battery another second."""
    from .. import program_cache

    program_cache.enable()
    code = main()
    stage_worker = sys.modules.get(f"{_PKG}.battery.stage_worker")
    if stage_worker is not None:  # its exit handler will not run: end the child here (at once if it has jobs)
        stage_worker.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else int(code is not None))  # sys.exit's reading of None


def main(argv=None) -> int:
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _exit_at_once) if in_main else None
    try:
        return _main(argv)
    finally:  # a caller in the same process (a test) gets its own handler back
        if in_main:
            signal.signal(signal.SIGINT, previous)


def _main(argv=None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from .. import use_all_cpu_cores
    from ..heap import keep_freed_memory

    use_all_cpu_cores()
    keep_freed_memory()  # a battery's large numpy temporaries reuse freed memory (specsample.heap)
    args = _parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command, as the HTML report shows it
    if args.command in ("verify", "measure") and getattr(args, "sweep", None) is None and _default_battery(args):  # its stage worker imports beside this process
        from ..battery import stage_worker

        stage_worker.start_early()

    command = {"verify": _cmd_verify, "measure": _cmd_measure, "list": _cmd_list, "figures": _cmd_figures, "calibrate": _cmd_calibrate,
               "bench": _cmd_bench, "decode": _cmd_decode, "audit": _cmd_audit}[args.command]
    try:
        return _interruptible(command, args)
    except BrokenPipeError:  # output piped into `head` and closed: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, TypeError, OSError, *_user_errors()) as e:
        print(f"specsample: error: {e}", file=sys.stderr)
        return 2


def _user_errors() -> tuple:
    """The package's own error classes that are not ValueErrors, from the modules already loaded: a
    command that never imported them (``audit`` imports no JAX) cannot have raised them."""
    where = (("schemes", "SchemeLoadError"), ("battery.suite", "SchemeError"), ("host.sampler", "HostSamplerError"),
             ("loops.runner", "LoopError"))
    found = (getattr(sys.modules.get(f"{_PKG}.{m}"), name, None) for m, name in where)
    return tuple(c for c in found if isinstance(c, type))


def _interruptible(command, args) -> int:
    """Run ``command(args)`` in a worker thread so that Ctrl-C acts at once.

    A Python signal handler runs only between bytecodes of the main thread, and a jitted
    chunk or a compile holds that thread for seconds; so the work runs in a daemon thread
    while the main thread waits in short, interruptible slices, running the user's samplers,
    generate and next_token functions when the worker posts them (:mod:`specsample.host.mainthread`:
    some libraries' state belongs to the main thread). On Ctrl-C the main thread
    writes every checkpoint whose newest counts are not on disk yet and leaves at once
    (exit code 130), without waiting for XLA to finish its chunk.
    """
    result = {}

    def work():
        try:
            result["rc"] = command(args)
        except BaseException as e:  # handed to the main thread, which reports it
            result["error"] = e

    worker = threading.Thread(target=work, name="specsample-work", daemon=True)
    if threading.current_thread() is threading.main_thread():
        # from here Ctrl-C raises KeyboardInterrupt in the join loop below, which saves checkpoints
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if threading.current_thread() is threading.main_thread():
            mainthread.serve(worker)  # starts it, and runs the user's callables here, where their libraries expect them
        else:
            worker.start()
            while worker.is_alive():
                worker.join(0.05)
    except KeyboardInterrupt:
        saved = []
        engine = sys.modules.get(f"{_PKG}.engine.lanes")  # only a run that started has counts to save
        if engine is not None:
            try:
                saved = engine.save_pending_checkpoints()
            except Exception as e:  # never let a failed save hide the interrupt
                print(f"specsample: could not save checkpoints: {e}", file=sys.stderr)
        for hook in list(_INTERRUPT_HOOKS):  # a monitor's report at Ctrl-C
            try:
                hook()
            except Exception as e:
                print(f"specsample: could not write the report: {e}", file=sys.stderr)
        note = f"; counts so far saved to {len(saved)} checkpoint(s), rerun the same command to resume" if saved else ""
        sys.stdout.flush()
        print(f"\nspecsample: interrupted{note}", file=sys.stderr, flush=True)
        os._exit(130)  # the worker may be inside XLA: do not wait for it
    if "error" in result:
        raise result["error"]
    return result["rc"]
