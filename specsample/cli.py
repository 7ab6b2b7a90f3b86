"""Command line: ``specsample verify | list | figures | calibrate | bench``.

Exit codes: 0 no deviation found, 1 a deviation found, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import os
import sys


def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {s}")
    return v


def _ks(s: str) -> tuple:
    try:
        ks = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k takes comma-separated integers, got {s!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError("draft lengths must be integers >= 1")
    return ks


def _distributed_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("several processes or hosts (jax.distributed; run the same command in each)")
    g.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="address of process 0; with --num-processes and --process-id")
    g.add_argument("--num-processes", type=int, default=None, metavar="N")
    g.add_argument("--process-id", type=int, default=None, metavar="I")


def _init_distributed(args) -> bool:
    """Join the jax.distributed cluster the options describe; True if this process reports."""
    given = [args.coordinator is not None, args.num_processes is not None, args.process_id is not None]
    if not any(given):
        return True
    if not all(given):
        raise ValueError("--coordinator, --num-processes and --process-id go together; give all three")
    if args.num_processes < 1 or not 0 <= args.process_id < args.num_processes:
        raise ValueError(f"--process-id must lie in [0, {args.num_processes}), got {args.process_id}")
    import jax

    jax.distributed.initialize(args.coordinator, num_processes=args.num_processes, process_id=args.process_id)
    return jax.process_index() == 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specsample", description="Statistical verification of speculative sampling.")
    sub = ap.add_subparsers(dest="command", required=True)

    v = sub.add_parser("verify", help="run the battery against a scheme and print a verdict")
    v.add_argument("--scheme", default="standard", help="registered name, module:attr or path.py:attr (default: standard)")
    v.add_argument("--budget", default="default", help="quick | default | thorough | sequences per case (default: default)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--alpha", type=_positive_float, default=0.01, help="family-wise error rate, Holm (default 0.01)")
    v.add_argument("--cases", default=None, help="glob over case names, comma-separated (see `specsample list`)")
    v.add_argument("--k", type=_ks, default=(1, 4, 8), help="draft lengths, comma-separated (default 1,4,8)")
    v.add_argument("--prng", default=None, help="JAX PRNG implementation: threefry2x32 (default), rbg, unsafe_rbg")
    v.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    v.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    v.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="keep per-case counts here; a killed run resumes where it stopped")
    _distributed_options(v)

    ls = sub.add_parser("list", help="list schemes, controls, pair families and cases")
    ls.add_argument("--budget", default="default")

    f = sub.add_parser("figures", help="write the diagnostic PNGs")
    f.add_argument("--out", default="figures", help="output folder (default: figures)")
    f.add_argument("--budget", default="default", help="quick | default | thorough | a scale factor")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--only", default=None, help="comma-separated figure names")

    c = sub.add_parser("calibrate", help="run the battery many times: false-alarm / detection rates")
    c.add_argument("--scheme", default="standard")
    c.add_argument("--runs", type=int, default=100)
    c.add_argument("--budget", default="quick")
    c.add_argument("--seed", type=int, default=1000)
    c.add_argument("--alpha", type=_positive_float, default=0.01)
    c.add_argument("--cases", default=None)
    c.add_argument("--k", type=_ks, default=(4,), help="draft lengths (default 4)")
    c.add_argument("--json", default=None, metavar="PATH")

    b = sub.add_parser("bench", help="engine rounds/s next to numpy and the random-number ceiling")
    b.add_argument("--json", default=None, metavar="PATH")
    b.add_argument("--grid", default=None,
                   help="V:k points, comma-separated (default: V in 8, 64, 1024, 32768 times k in 1, 4, 8)")
    b.add_argument("--sequences", type=int, default=1 << 22)
    return ap


def _progress_bar(enabled: bool):
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=1, unit="seq", unit_scale=True, file=sys.stderr, dynamic_ncols=True, leave=False)

    def update(label, done, total):
        bar.total = total
        bar.set_description_str(label[:40])
        bar.n = done
        bar.refresh()

    return update, bar.close


def _cmd_verify(args) -> int:
    from . import engine
    from .battery import verify

    reporter = _init_distributed(args)  # every process runs the battery; process 0 reports
    show = reporter and not args.no_progress and sys.stderr.isatty()
    update, close = _progress_bar(show)
    try:
        report = verify(args.scheme, budget=args.budget, seed=args.seed, alpha=args.alpha, cases=args.cases,
                        ks=args.k, prng=args.prng or engine.DEFAULT_PRNG, progress=update,
                        checkpoint_dir=args.checkpoint)
    finally:
        close()
    if not reporter:
        return 0 if report.passed else 1
    print(report.table())
    print()
    print(report.headline())
    if args.json:
        with open(args.json, "w") as f:
            f.write(report.to_json())
    return 0 if report.passed else 1


def _cmd_list(args) -> int:
    from .pairs import FAMILIES
    from .schemes import CONTROLS, SCHEMES
    from .battery import BUDGETS, NGRAM_FAMILIES, default_cases

    print("schemes (lossless):")
    for name, f in SCHEMES.items():
        print(f"  {name:28s} {f(4).description}")
    print("negative controls (must be rejected):")
    for name, f in CONTROLS.items():
        print(f"  {name:28s} {f(4).description}")
    print("pair families:")
    for f in FAMILIES.values():
        print(f"  {f.name:28s} {f.description}")
    for name, (order, conc, mix) in NGRAM_FAMILIES.items():
        print(f"  {name:28s} order-{order} tables, Dirichlet({conc:g}) rows, q mixes in {mix:g} of another table")
    print("budgets:", ", ".join(BUDGETS), "or a number of sequences per case")
    print("cases:")
    bud = BUDGETS.get(args.budget, BUDGETS["default"])
    for c in default_cases(bud):
        print(f"  {c.name:28s} {c.model}, V={c.vocab}, k={c.k}, L={c.length}")
    return 0


def _cmd_figures(args) -> int:
    from .figures import render_all

    only = [x.strip() for x in args.only.split(",")] if args.only else None
    for path in render_all(args.out, args.budget, args.seed, only,
                           progress=lambda name: print(f"rendering {name} ...", file=sys.stderr)):
        print(path)
    return 0


def _cmd_calibrate(args) -> int:
    from .calibrate import calibrate, to_json

    show = sys.stderr.isatty()
    res = calibrate(args.scheme, args.runs, budget=args.budget, seed=args.seed, alpha=args.alpha, cases=args.cases,
                    ks=args.k, progress=(lambda d, t: print(f"run {d}/{t}", file=sys.stderr)) if show else None)
    print(res.summary())
    if args.json:
        with open(args.json, "w") as f:
            f.write(to_json(res))
    return 0


def _cmd_bench(args) -> int:
    from .bench import GRID, main as bench_main

    try:
        grid = GRID if args.grid is None else tuple(tuple(int(x) for x in p.split(":")) for p in args.grid.split(","))
        assert all(len(g) == 2 and g[0] >= 2 and g[1] >= 1 for g in grid)
    except (ValueError, AssertionError):
        raise ValueError(f"--grid takes V:k points (V >= 2, k >= 1) separated by commas, got {args.grid!r}") from None
    bench_main(grid=grid, json_path=args.json, sequences=args.sequences)
    return 0


def main(argv=None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from . import use_all_cpu_cores

    use_all_cpu_cores()
    args = _parser().parse_args(argv)
    from .schemes import SchemeLoadError
    from .battery import SchemeError

    try:
        return {"verify": _cmd_verify, "list": _cmd_list, "figures": _cmd_figures, "calibrate": _cmd_calibrate,
                "bench": _cmd_bench}[args.command](args)
    except BrokenPipeError:  # output piped into `head` and closed: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (SchemeLoadError, SchemeError, ValueError, TypeError, OSError) as e:
        print(f"specsample: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specsample: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
