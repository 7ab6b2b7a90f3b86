"""``specsample verify`` and ``specsample measure``."""

from __future__ import annotations

import json
import shlex
import sys

from .options import check_output_file
from .run import _confirmation, _print_report, _progress_bar, _run, _write_outputs

def _lossy_note(args) -> None:
    """Below a lossy rule's verdict: that a FAIL is what it declares, and where to see how far it is."""
    if args.scheme is None or args.sampler is not None or args.generate is not None:
        return
    from ..schemes import make_scheme

    try:
        scheme = make_scheme(args.scheme, args.k[0])
    except Exception:  # a scheme that cannot be built again has already said so
        return
    if not scheme.lossless:
        print(f"note: {scheme.name} declares itself lossy (lossless=False): a FAIL is what it expects; "
              f"`specsample measure --scheme '{args.scheme}'` says how far each position's law is from p.")


def _cmd_measure(args) -> int:
    """``specsample measure``: the run of ``verify``, read as distances from p (specsample.measure)."""
    check_output_file(args.json, "--json")
    check_output_file(args.html, "--html")
    from ..measure import exact_laws, has_exact, measure
    from ..measure import text

    if args.sweep is not None:
        return _measure_sweep(args)
    if args.budget is None and args.sampler is None and args.generate is None:
        args.budget = "certify"  # sized to certify each law within the min detectable TV verify states
    report, reporter, sink, tree = _run(args)
    exact = None
    name = args.scheme or "standard"
    if not tree and args.sampler is None and args.generate is None and has_exact(name):
        from ..battery.suite import resolve_budget

        exact = exact_laws(name, resolve_budget(args.budget)[0], args.seed, args.k)
    m = measure(report, tolerance=args.tolerance, exact=exact)
    if not m.rows:
        raise ValueError("this run kept no position law to measure (a tree or boundary-only run?); measure a "
                         "scheme, host sampler or loop whose battery counts each position")
    if not reporter:
        return m.exit_code
    print(text.table(m))
    print()
    print(text.headline(m))
    print(f"the tests on these counts: {'PASS' if report.passed else 'FAIL'} (specsample verify with the same "
          f"options prints them)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(m.to_dict(), f, indent=1)
    if args.html:
        from ..figures.distortion import write_html

        write_html(m, args.html, command="specsample " + " ".join(shlex.quote(a) for a in args.argv))
        print(f"HTML report: {args.html}")
    if sink is not None:
        print(f"recorded {sum(sink.rounds.values()):,} rounds to {args.record}: specsample audit {args.record}")
    return m.exit_code


def _measure_sweep(args) -> int:
    """``measure --sweep KEY=V1,V2,...``: a lossy rule at each value on one case, beside the standard rule."""
    from ..measure import text
    from ..measure.sweep import parse_sweep, sweep

    if args.sampler is not None or args.generate is not None:
        raise ValueError("--sweep moves a registered lossy rule's parameter (--scheme relaxed or typical); "
                         "a host sampler or loop carries its own thresholds")
    if args.tolerance is not None:
        raise ValueError("--tolerance certifies one run; a sweep reports each setting's distance instead")
    rule, keys, points = parse_sweep(args.scheme or "", args.sweep)
    case = args.cases or "dirichlet/V8/k4"
    show = not args.no_progress and sys.stderr.isatty()
    update, close = _progress_bar(show, unit="setting")
    try:
        result = sweep(points, case=case, budget=args.budget or "default", seed=args.seed, alpha=args.alpha,
                       progress=update)
    finally:
        close()
    table = text.sweep_table(result)
    print(table)
    print()
    print(f"{rule} on {case}: TV of the farthest position's law from p, {100 * (1 - args.alpha):g}% intervals "
          f"simultaneous over {len(result)} settings and their positions (Bonferroni); standard: lossless reference.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rule": rule, "keys": keys, "case": case, "alpha": args.alpha, "seed": args.seed,
                       "points": [p.to_dict() for p in result]}, f, indent=1)
    if args.html:
        from ..figures.distortion import write_sweep_html

        write_sweep_html(rule, result, table, args.html,
                         command="specsample " + " ".join(shlex.quote(a) for a in args.argv))
        print(f"HTML report: {args.html}")
    return 0


def _cmd_verify(args) -> int:
    report, reporter, sink, tree = _run(args)
    if not reporter:
        return 0 if report.passed else 1
    if tree:
        print(report.table())
        print()
        print(report.headline())
        _write_outputs(args, report)
        return 0 if report.passed else 1
    _print_report(report)
    _lossy_note(args)
    if report.narrow and reporter:
        print(f"confirm: {_confirmation(args.argv, args.seed)}")
    host = report.engine.get("host") if isinstance(report.engine, dict) else None
    if host and not host["rounds"]:
        print(f"host sampler {host['sampler']}: hard checks only (no battery rounds were played)")
    elif host:
        print(f"host sampler {host['sampler']}: {host['calls']:,} calls, {host['rounds']:,} rounds, "
              f"{host['rounds_per_s']:.3g} rounds/s ({100 * (host['sampler_share'] or 0):.0f}% of the time in the "
              f"sampler), wasted calls {100 * host['wasted_fraction']:.0f}%"
              + (f", peak memory {host['peak_rss_mib']:,.0f} MiB" if host.get("peak_rss_mib") else ""))
        for w in host.get("warnings", []):
            print(f"WARNING: {w}")
    _write_outputs(args, report)
    if args.record is not None and reporter:
        rounds = sum(sink.rounds.values())
        files = f"{len(sink.files)} file{'s' * (len(sink.files) != 1)}"
        print(f"recorded {rounds:,} rounds in {files} to {args.record}: specsample audit {args.record}")
    return 0 if report.passed else 1
