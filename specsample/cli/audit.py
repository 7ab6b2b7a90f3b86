"""``specsample audit``: record files read once, or a folder followed as a live engine writes it."""

from __future__ import annotations

import sys

from .options import check_output_file
from .run import _INTERRUPT_HOOKS, _print_report, _progress_bar, _write_outputs

def _cmd_audit(args) -> int:
    check_output_file(args.json, "--json")
    check_output_file(args.html, "--html")
    if args.follow is not None:
        return _audit_follow(args)
    if not args.paths:
        raise ValueError("give record files or folders to audit (PATH ...), or --follow DIR to watch a live engine's")
    if args.idle_exit is not None:
        raise ValueError("--idle-exit belongs to --follow DIR (a batch audit ends when its files are read)")
    from ..audit.run import audit

    update, close = _progress_bar(not args.no_progress and sys.stderr.isatty(), unit="file")
    try:
        report = audit(args.paths, alpha=args.alpha, seed=args.seed, batch_size=args.batch_size,
                       workers=args.workers, dask=args.dask, progress=update, dedupe=args.dedupe)
    finally:
        close()
    _print_report(report)
    info = report.engine["audit"]
    if info.get("dropped"):
        print(f"WARNING: dropped {info['dropped']:,} repeated rounds (--dedupe): each (request id, round) counted once")
    if info.get("workers", 1) < info.get("workers_asked", 1):
        print(f"NOTE: --workers {info['workers_asked']} on {info['cores']} cores: counted in {info['workers']} "
              f"process{'es' * (info['workers'] != 1)} (each reads ahead in a thread of its own, two cores a process)")
    print(f"audited {info['rounds']:,} rounds at {info['rounds_per_s']:.3g} rounds/s")
    _write_outputs(args, report)
    return 0 if report.passed else 1




def _audit_follow(args) -> int:
    """``audit --follow DIR``: the anytime-valid monitor (:mod:`specsample.audit.monitor`)."""
    from ..audit.monitor import Monitor, follow

    if args.paths:
        raise ValueError("--follow DIR watches one folder; give no other PATH beside it")
    if args.dask is not None or args.workers != 1:
        raise ValueError("--follow reads each file as it arrives, in this process: drop --dask and --workers")
    monitor = Monitor(args.alpha, args.seed, args.batch_size)
    label = f"live records {args.follow}"

    def at_exit():  # Ctrl-C: the report of what was read so far, where --json / --html asked for it
        _write_outputs(args, monitor.report(label))

    _INTERRUPT_HOOKS.append(at_exit)
    quiet = args.no_progress
    print(f"following {args.follow}: alarm when a deviation is established (any false alarm over the whole stream "
          f"at most alpha = {args.alpha:g}); Ctrl-C to stop", flush=True)
    try:
        follow(args.follow, alpha=args.alpha, seed=args.seed, batch_size=args.batch_size, poll=args.poll,
               idle_exit=args.idle_exit, status=None if quiet else (lambda line: print(line, flush=True)),
               monitor=monitor)
    finally:
        _INTERRUPT_HOOKS.remove(at_exit)
    report = monitor.report(label)
    _print_report(report)
    if monitor.alarm:
        print(f"ALARM: {monitor.alarm}")
    else:
        print(f"no deviation established over {monitor.files:,} files, {monitor.rounds:,} rounds "
              f"({args.idle_exit:g} s without a new file)")
    _write_outputs(args, report)
    return 1 if monitor.alarm else 0
