"""``specsample list | figures | calibrate | decode | bench``."""

from __future__ import annotations

import sys
import time

from .options import check_output_dir, check_output_file

def _cmd_list(args) -> int:
    from ..models.pairs import FAMILIES
    from ..schemes import CONTROLS, SCHEMES
    from ..battery.suite import BUDGETS, NGRAM_FAMILIES, default_cases
    from ..models.pairs import NEURAL_FAMILIES

    width = max(28, max(len(n) for n in {**SCHEMES, **CONTROLS}))
    print("schemes (lossless):")
    for name, f in SCHEMES.items():
        print(f"  {name:{width}s} {f(4).description}")
    print("negative controls (must be rejected):")
    for name, f in CONTROLS.items():
        print(f"  {name:{width}s} {f(4).description}")
    from ..schemes.lossy import RULES

    print("lossy rules engines ship (NAME[key=value,...]; specsample measure says how far from p):")
    for name, rule in RULES.items():
        print(f"  {name:{width}s} {rule().spec}")
    print("pair families:")
    for f in FAMILIES.values():
        print(f"  {f.name:{width}s} {f.description}")
    for name, (order, conc, mix) in NGRAM_FAMILIES.items():
        print(f"  {name:{width}s} order-{order} tables, Dirichlet({conc:g}) rows, q mixes in {mix:g} of another table")
    for name, desc in NEURAL_FAMILIES.items():
        print(f"  {name:{width}s} {desc}")
    print("budgets:", ", ".join(BUDGETS), "or a number of sequences per case")
    print("cases (transformer-* run for schemes whose lanes carry KV caches, the others for table schemes):")
    bud = BUDGETS.get(args.budget, BUDGETS["default"])  # a number of sequences lists the default cases
    for c in default_cases(bud):
        print(f"  {c.name:28s} {c.model}, V={c.vocab}, k={c.k}, L={c.length}")
    return 0


def _cmd_figures(args) -> int:
    from ..figures.gallery import check_names, render_all

    only = [x.strip() for x in args.only.split(",") if x.strip()] if args.only is not None else None
    check_names(only)
    check_output_dir(args.out, "--out")
    for path in render_all(args.out, args.budget, args.seed, only,
                           progress=lambda d, t, name, _show=_eta_printer("figures done:"): _show(
                               d, t, f"now rendering {name}")):
        print(path)
    return 0


def _eta_printer(what: str):
    """A progress callback ``(done, total, label)`` printing one line each time, with an ETA."""
    t0 = time.monotonic()

    def show(done, total, label=""):
        el = time.monotonic() - t0
        eta = el / done * (total - done) if done else float("nan")
        print(f"{what} {done}/{total}  {_clock(el)} elapsed, ETA {_clock(eta)}" + (f"  ({label})" if label else ""),
              file=sys.stderr, flush=True)

    return show


def _clock(s: float) -> str:
    if s != s:
        return "?"
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _cmd_calibrate(args) -> int:
    check_output_file(args.json, "--json")
    from ..calibrate import calibrate, to_json

    res = calibrate(args.scheme, args.runs, budget=args.budget, seed=args.seed, alpha=args.alpha, cases=args.cases,
                    k=args.k, progress=_eta_printer("run"))
    print(res.summary())
    if args.json:
        with open(args.json, "w") as f:
            f.write(to_json(res))
    return 0


def _cmd_decode(args) -> int:
    import json

    check_output_file(args.json, "--json")
    from .. import decode

    if args.example:
        print(decode.example_text(3))
        if args.json:
            model = decode.two_letter_example()
            res = {"example": [{"sequence": s, "prob": str(p), "float": float(p)} for s, p in decode.example_law(3)],
                   "greedy": "".join("AB"[x] for x in decode.greedy(model, 3).sequence),
                   "map": "".join("AB"[x] for x in decode.dp_map(model, 3).sequence)}
            with open(args.json, "w") as f:
                json.dump(res, f, indent=2)
        return 0
    res = decode.decode_random(args.vocab, args.order, args.length, args.seed)
    print(decode.format_random(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0

def _cmd_bench(args) -> int:
    check_output_file(args.json, "--json")
    from ..bench import GRID, main as bench_main

    try:
        grid = GRID if args.grid is None else tuple(tuple(int(x) for x in p.split(":")) for p in args.grid.split(","))
        assert all(len(g) == 2 and g[0] >= 2 and g[1] >= 1 for g in grid)
    except (ValueError, AssertionError):
        raise ValueError(f"--grid takes V:k points (V >= 2, k >= 1) separated by commas, got {args.grid!r}") from None
    if args.neural < 0:
        raise ValueError(f"--neural takes a number of sequences >= 0 (0 skips the transformer pair), got {args.neural}")
    bench_main(grid=grid, json_path=args.json, sequences=args.sequences, neural_sequences=args.neural)
    return 0
