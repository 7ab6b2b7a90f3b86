"""Command line: ``specsample verify | list | figures | calibrate | bench | decode``.

Exit codes: 0 no deviation found, 1 a deviation found, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shlex
import signal
import sys
import threading
import time

from . import SEED_MAX
from .host import mainthread


def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {s}")
    return v


def _seconds(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number of seconds") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {s}")
    return v


def _ks(s: str) -> tuple:
    try:
        ks = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k takes comma-separated integers, got {s!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError("draft lengths must be integers >= 1")
    return ks


def _seed(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed takes an integer, got {s!r}") from None
    if not 0 <= v <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"--seed must lie in [0, {SEED_MAX}], got {v} (seeds are folded into "
                                         "31 bits, so a negative or larger one would repeat another)")
    return v


def _budget(s: str) -> str:
    """quick | default | thorough | certify | a positive number (checked here, before any work)."""
    if s in ("quick", "default", "thorough", "certify"):
        return s
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budget takes quick, default, thorough, certify or a number, "
                                         f"got {s!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"--budget must be positive, got {s}")
    return s


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def check_output_file(path, option: str) -> None:
    """Refuse, before any work, an output file that could not be written at the end."""
    if path is None:
        return
    if os.path.isdir(path):
        raise ValueError(f"{option} {path!r} is a folder; give a file path")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path!r}: folder {folder!r} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{option} {path!r}: folder {folder!r} is not writable")


def check_output_dir(path, option: str) -> None:
    """Create an output folder now (or refuse it), so a run never fails at its end."""
    if path is None:
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{option} {path!r} cannot be created: {e.strerror}") from None
    if not os.access(path, os.W_OK):
        raise ValueError(f"{option} {path!r} is not writable")


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


def _report_options(p: argparse.ArgumentParser) -> None:
    """The options every command that prints a verdict takes (``verify``, ``audit``), with one meaning each."""
    p.add_argument("--seed", type=_seed, default=0,
                   help="seed of the run's random numbers: the same seed, the same report (default 0)")
    p.add_argument("--alpha", type=_positive_float, default=0.01, help="family-wise error rate, Holm (default 0.01)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.add_argument("--html", default=None, metavar="PATH",
                   help="also write a self-contained HTML report (figures inline; opens offline)")
    p.add_argument("--no-progress", action="store_true", help="do not show a progress bar")


SHARED_REPORT_OPTIONS = ("--seed", "--alpha", "--json", "--html", "--no-progress")


def _run_options(v: argparse.ArgumentParser) -> None:
    """What a run is made of (a scheme, a host sampler or a whole loop, and its budget): ``verify`` and
    ``measure`` take the same options."""
    v.add_argument("--scheme", default=None, help="registered name, module:attr or path.py:attr (default: standard)")
    v.add_argument("--budget", type=_budget, default=None,
                   help="quick | default | thorough | certify | sequences per case (default: default; quick for "
                        "--sampler; measure: certify, twice the default's sequences)")
    _report_options(v)
    v.add_argument("--cases", default=None,
                   help="case names or globs, comma-separated; !PATTERN excludes (see `specsample list`)")
    v.add_argument("--k", type=_ks, default=(1, 4, 8), help="draft lengths, comma-separated (default 1,4,8)")
    v.add_argument("--prng", default=None, help="JAX PRNG implementation: threefry2x32 (default), rbg, unsafe_rbg")
    v.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="keep per-case counts here; a killed run resumes where it stopped")
    h = v.add_argument_group("a host sampler (numpy, torch, ...) instead of a JAX scheme")
    h.add_argument("--sampler", default=None, metavar="PATH.py:FN",
                   help="verify this callable fn(drafts, draft_rows, target_rows, rng) -> (tokens, n_emitted)")
    h.add_argument("--device", default=None, metavar="DEV",
                   help="torch device for the rows, inputs and generator (cuda, cuda:1; needs --arrays torch)")
    h.add_argument("--record", default=None, metavar="DIR",
                   help="also write the battery's random rounds (a loop: the rounds its provenance reveals, with --k K) "
                        "to DIR as records (specsample audit DIR)")
    h.add_argument("--inputs", default=None, metavar="KIND[,KIND]",
                   help="rows passed as (default) probs or logits; DRAFT,TARGET gives them apart (probs,logits)")
    h.add_argument("--ragged", action="store_true",
                   help="the serving engines' flat batch: ragged draft counts 0..k per request, outputs padded -1; "
                        "with --tree, a tree per request (flattened, per-request parents and node counts)")
    h.add_argument("--bonus-given", action="store_true",
                   help="specsample samples the bonus token and passes its ids in, before rng")
    h.add_argument("--rng", choices=("numpy", "torch", "torch-global"), default=None,
                   help="randomness passed: a seeded numpy Generator (default), a torch Generator, or torch's "
                        "global generator seeded before each call")
    h.add_argument("--arrays", choices=("numpy", "torch"), default=None, help="array type passed in (default numpy)")
    h.add_argument("--unbatched", action="store_true", help="fn takes one round at a time (specsample loops)")
    h.add_argument("--self-drafting", action="store_true",
                   help="fn drafts too: fn(context, draft_model, target_model, rng) -> (tokens, n_emitted, drafts)")
    h.add_argument("--rule", choices=("standard", "exact-match", "none", "rrs", "rrs-wor", "topk"), default=None,
                   help="standard (default): also test acceptance against the standard rule; none: output law only; "
                        "exact-match (a loop with --draft-next-token: the target samples, a draft kept when equal); "
                        "rrs (default with --tree), rrs-wor, topk: the tree rule a --tree sampler claims")
    h.add_argument("--tree", default=None, metavar="B1,B2,...",
                   help="the sampler follows the tree convention fn(tokens, parents, draft_rows, target_rows, "
                        "generator) -> (path, final); trees drafted with these children per depth (e.g. 3,2,1); "
                        "'dynamic': it builds its own trees (self-drafting, output law only)")
    h.add_argument("--tv", type=_positive_float, default=None, metavar="TV",
                   help="target min detectable TV: sequences per case from the power calculation")
    h.add_argument("--batch-calls", type=_positive_int, default=None, metavar="N",
                   help="calls of the batch pass with the probe alone, half as many amid neighbours (default 3000); "
                        "its detail states the shift it detects, which shrinks as 1/sqrt(N)")
    h.add_argument("--time", default=None, metavar="T",
                   help="a bound on the whole run's time (90s, 10m, 1h): each case gets its share of what is left, "
                        "and stops early once its power calculation is met; counts then depend on speed")
    e = v.add_argument_group("a whole generate loop, end to end")
    e.add_argument("--generate", default=None, metavar="PATH.py:FN",
                   help="generate(prompt, n, seed) -> tokens: the loop under test (e.g. assisted generation)")
    e.add_argument("--next-token", default=None, metavar="PATH.py:FN",
                   help="next_token(tokens [N, T]) -> [N, T, V]: the target's teacher-forced rows")
    e.add_argument("--plain", default=None, metavar="PATH.py:FN", help="the same model sampled plainly: a control arm")
    e.add_argument("--draft-next-token", default=None, metavar="PATH.py:FN",
                   help="the draft's teacher-forced rows; generate then returns (tokens, from_draft) and acceptance "
                        "at round starts is tested against --rule")
    e.add_argument("--prompt", default="0", help="prompt token ids, comma-separated (default 0)")
    e.add_argument("--length", type=_positive_int, default=3, help="generated tokens tested, L (default 3)")
    e.add_argument("--sequences", type=_positive_int, default=None,
                   help="sequences per arm, exactly (default: sized by --budget / --tv; --time bounds the run)")
    e.add_argument("--bonus-generate", default=None, metavar="PATH.py:FN",
                   help="the same loop with the target as its own draft (every round emits its bonus); the "
                        "boundary pass forces its draws too")
    e.add_argument("--offset", type=_positive_float, default=None, metavar="D",
                   help="with --draft-next-token: size the run so that an acceptance-rate offset D at round starts "
                        "is found with probability 0.99 (a pilot of 256 sequences)")
    e.add_argument("--batch", type=_positive_int, default=None, metavar="B",
                   help="generate is batched: generate(prompts [B, P], n, seeds [B]) -> [B, n]")
    e.add_argument("--workers", type=_positive_int, default=1, metavar="N",
                   help="processes drawing sequences (each loads the loop by name; counts independent of N)")
    e.add_argument("--eos", type=int, default=None, help="end-of-sequence token id (law truncated at it)")
    e.add_argument("--mode", choices=("auto", "exact", "sequential"), default="auto")
    _distributed_options(v)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specsample", description="Statistical verification of speculative sampling.")
    sub = ap.add_subparsers(dest="command", required=True)

    v = sub.add_parser("verify", help="run the battery against a scheme and print a verdict")
    _run_options(v)

    ms = sub.add_parser("measure", help="how far from p each position's law is: TV estimates, simultaneous intervals, "
                                        "an equivalence verdict with --tolerance")
    _run_options(ms)
    g = ms.add_argument_group("measuring")
    g.add_argument("--tolerance", type=_positive_float, default=None, metavar="EPS",
                   help="certify every position's law within TV EPS of p: exit 0 when every upper bound is below "
                        "it, 1 when some lower bound is above, 3 when undecided at this budget")
    g.add_argument("--sweep", default=None, metavar="KEY[,KEY]=V1,V2,...",
                   help="move a lossy rule's parameter (--scheme relaxed or typical) over these values on one case "
                        "(--cases, default dirichlet/V8/k4): distortion against tokens per round")

    ls = sub.add_parser("list", help="list schemes, controls, pair families and cases")
    ls.add_argument("--budget", type=_budget, default="default")

    f = sub.add_parser("figures", help="write the diagnostic PNGs")
    f.add_argument("--out", default="figures", help="output folder (default: figures)")
    f.add_argument("--budget", type=_budget, default="default", help="quick | default | thorough | a scale factor")
    f.add_argument("--seed", type=_seed, default=0)
    f.add_argument("--only", default=None, help="comma-separated figure names")

    c = sub.add_parser("calibrate", help="run the battery many times: false-alarm / detection rates")
    c.add_argument("--scheme", default="standard")
    c.add_argument("--runs", type=_positive_int, default=100)
    c.add_argument("--budget", type=_budget, default="quick")
    c.add_argument("--seed", type=_seed, default=1000)
    c.add_argument("--alpha", type=_positive_float, default=0.01)
    c.add_argument("--cases", default=None)
    c.add_argument("--k", type=_ks, default=(4,), help="draft lengths (default 4)")
    c.add_argument("--json", default=None, metavar="PATH")

    d = sub.add_parser("decode", help="greedy against MAP decoding: exact MAP by dynamic programming")
    d.add_argument("--example", action="store_true", help="the two-letter model where greedy is not MAP")
    d.add_argument("--order", type=int, default=1, metavar="m", help="n-gram order of the random model (default 1)")
    d.add_argument("--vocab", type=int, default=4, metavar="V", help="vocabulary size (default 4)")
    d.add_argument("--length", type=int, default=8, metavar="T", help="tokens to decode (default 8)")
    d.add_argument("--seed", type=_seed, default=0, metavar="S")
    d.add_argument("--json", default=None, metavar="PATH", help="also write the result as JSON")

    b = sub.add_parser("bench", help="engine rounds/s next to numpy and the random-number ceiling")
    b.add_argument("--json", default=None, metavar="PATH")
    b.add_argument("--grid", default=None,
                   help="V:k points, comma-separated (default: V in 8, 64, 1024, 32768 times k in 1, 4, 8)")
    b.add_argument("--sequences", type=_positive_int, default=1 << 22)
    b.add_argument("--neural", type=int, default=1 << 15, metavar="N",
                   help="sequences for the transformer pair's cached and recompute rows (0: skip; default 32768)")

    a = sub.add_parser("audit", help="verify an engine from the rounds it recorded (Parquet / Arrow files)")
    a.add_argument("paths", nargs="*", metavar="PATH", help="record files, or folders of them (searched recursively)")
    _report_options(a)  # --seed seeds the randomised PIT's uniforms
    a.add_argument("--dedupe", action="store_true",
                   help="count the first copy of a round recorded twice (same request id and round: a log shipped "
                        "at least once) and drop the others, with a warning; without it such files are refused")
    f = a.add_argument_group("a live engine: watch a folder as record files arrive (anytime-valid)")
    f.add_argument("--follow", default=None, metavar="DIR",
                   help="audit each new, complete record file in DIR as it appears; exit 1 the moment a deviation "
                        "is established (false alarms over the whole stream at most --alpha)")
    f.add_argument("--idle-exit", type=_seconds, default=None, metavar="SECONDS",
                   help="with --follow: exit 0 after this long without a new file (default: run until Ctrl-C)")
    f.add_argument("--poll", type=_seconds, default=1.0, metavar="SECONDS",
                   help="with --follow: how often to look for new files (default 1)")
    a.add_argument("--batch-size", type=_positive_int, default=65_536, metavar="N",
                   help="rounds read at a time: memory stays flat whatever the files' size (default 65536)")
    a.add_argument("--workers", type=_positive_int, default=1, metavar="N",
                   help="processes reading and counting files and Parquet row groups (same report; default 1)")
    a.add_argument("--dask", default=None, metavar="ADDRESS",
                   help="count on a Dask cluster: a scheduler address, or 'local' (--workers processes)")
    return ap


def _progress_bar(enabled: bool, unit: str = "seq"):
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError):
        size = os.terminal_size((0, 0))
    # a terminal may report 0 x 0 (a pty nobody sized: docker exec, script, some CI runners), and
    # tqdm then hides its bar as "below the screen"; follow resizes only when there is a size to follow
    sized = size.columns > 0 and size.lines > 0
    bar = tqdm(total=1, unit=unit, unit_scale=unit == "seq", file=sys.stderr, leave=False, dynamic_ncols=sized,
               **({} if sized else {"ncols": 80, "nrows": 24}))

    def update(label, done, total):
        bar.total = total
        bar.set_description_str(label[:40])
        bar.n = done
        bar.refresh()

    return update, bar.close


def _verify_tree(args, update, close):
    """``verify --sampler F --tree 3,2,1``: a host tree sampler (:mod:`specsample.host.tree`)."""
    close()
    if args.sampler is None:
        raise ValueError("--tree verifies a host tree sampler; give it with --sampler PATH.py:FN")
    try:
        branching = tuple(int(x) for x in args.tree.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--tree takes children per depth separated by commas (3,2,1), got {args.tree!r}") from None
    other = [f"--{n.replace('_', '-')}" for n in ("rng", "arrays", "device", "tv", "time", "checkpoint", "cases", "inputs")
             if getattr(args, n, None) is not None]
    other += [f"--{n.replace('_', '-')}" for n in ("unbatched", "self_drafting", "bonus_given") if getattr(args, n)]
    if other:
        raise ValueError(f"{', '.join(other)} do not apply to a tree sampler (--tree): it takes --rule, --budget, "
                         "--seed, --alpha, --ragged, --json and --html")
    if args.rule not in (None, "rrs", "rrs-wor", "topk"):
        raise ValueError(f"a tree sampler claims a tree rule: --rule rrs, rrs-wor or topk, not {args.rule}")
    from .host.sampler import _is_factory
    from .host.tree import TreeSampler
    from .host.tree_verify import verify_tree_host
    from .schemes import _load_object

    obj = mainthread.call(_load_object, args.sampler)
    if callable(obj) and not isinstance(obj, TreeSampler) and _is_factory(obj):
        obj = obj()  # a factory such as specsample.host.tree:tree_reference
    if args.ragged:  # a tree per request: the ragged convention (specsample.host.tree_ragged)
        if isinstance(obj, TreeSampler) and obj.layout != "ragged":
            raise ValueError(f"--ragged calls fn(tokens, parents, num_nodes, draft_rows, target_rows, generator); "
                             f"{obj.name} takes one tree shape a batch: drop --ragged, or give a ragged sampler "
                             "such as specsample.host.tree_ragged:ragged_reference")
        if not isinstance(obj, TreeSampler):
            obj = TreeSampler(obj, rule=args.rule or "rrs", name=args.sampler, layout="ragged")
    budget = args.budget or "quick"
    return verify_tree_host(obj, branching=branching, budget=budget, seed=args.seed, alpha=args.alpha, rule=args.rule)


def _print_report(report) -> None:
    """The table, the diagnosis when a stage was named, and the headline."""
    print(report.table())
    print()
    diag = report.diagnosis()
    if diag:
        print("Diagnosis:")
        print(diag)
        print()
    print(report.headline())


def _write_outputs(args, report) -> None:
    """``--json`` and ``--html``, after the verdict is printed."""
    if args.json:
        with open(args.json, "w") as f:
            f.write(report.to_json())
    if args.html:
        from .figures.html import write_html

        write_html(report, args.html, command="specsample " + " ".join(shlex.quote(a) for a in args.argv))
        print(f"HTML report: {args.html}")


def _default_battery(args) -> bool:
    """Whether ``verify`` runs a registered scheme's default cases in one process (a battery that plays its
    stage passes in :mod:`specsample.battery.stage_worker`), judged from the arguments alone."""
    from .battery.stage_worker import KV_CACHE_SCHEMES  # imports nothing heavy

    scheme = args.scheme or "standard"
    if scheme in KV_CACHE_SCHEMES:  # its transformer cases play no stage pass
        return False
    registered = not any(c in scheme for c in ":/\\") and not scheme.endswith(".py")
    one_process = args.num_processes in (None, 1)
    return (registered and one_process and args.cases is None and args.sampler is None and args.generate is None
            and args.tree is None)


def _run(args) -> tuple:
    """The run ``verify`` and ``measure`` share: ``(report, reporter, sink, tree)`` from the options (a JAX
    scheme's battery, a host sampler, a tree sampler or a whole loop); ``sink`` is the --record folder's
    writer (or None), ``tree`` whether a host tree sampler ran."""
    check_output_file(args.json, "--json")
    check_output_file(args.html, "--html")
    check_output_dir(args.checkpoint, "--checkpoint")
    from .engine import lanes as engine
    from .battery.suite import verify

    shared = ("tv", "time", "rule") if args.generate is None else ()  # for host samplers and whole loops
    host_only = [f"--{n.replace('_', '-')}" for n in ("rng", "arrays", "device", "batch_calls") + shared
                 if getattr(args, n) is not None]
    if args.inputs is not None and args.generate is None:
        host_only.append("--inputs")
    host_only += ["--unbatched"] if args.unbatched else []
    host_only += ["--self-drafting"] if args.self_drafting else []
    host_only += ["--ragged"] if args.ragged else []
    host_only += ["--bonus-given"] if args.bonus_given else []
    if args.sampler is None and host_only:
        verb = "applies" if len(host_only) == 1 else "apply"
        raise ValueError(f"{', '.join(host_only)} {verb} to a host sampler; give it with --sampler PATH.py:FN")
    if args.prng is not None and (args.sampler is not None or args.generate is not None):
        raise ValueError("--prng chooses the JAX engine's random-number generator; a host sampler or generate loop "
                         "draws its own (for a host sampler, choose it with --rng)")
    if args.sampler is not None and args.scheme is not None:
        raise ValueError("give either --scheme (a JAX scheme) or --sampler (a host callable), not both")
    if args.record is not None:
        _check_record(args)
    reporter = _init_distributed(args)  # every process runs the battery; process 0 reports
    show = reporter and not args.no_progress and sys.stderr.isatty()
    update, close = _progress_bar(show)
    loop = [f"--{n.replace('_', '-')}" for n in ("generate", "next_token", "plain", "eos", "sequences", "batch",
                                                 "draft_next_token", "offset", "bonus_generate")
            if getattr(args, n) is not None] + (["--workers"] if args.workers != 1 else [])
    if loop and (args.generate is None or args.next_token is None):
        raise ValueError(f"{', '.join(loop)}: an end-to-end run needs both --generate and --next-token")
    if args.generate is not None and args.rule is not None and args.draft_next_token is None:
        raise ValueError("--rule for a loop is the acceptance rule its provenance is tested against; give "
                         "--draft-next-token too (and have generate return (tokens, from_draft))")
    if args.generate is not None and args.cases is not None:
        raise ValueError("--cases chooses battery cases; an end-to-end run tests the loop it is given")
    if args.generate is not None and (args.sampler is not None or args.scheme is not None):
        raise ValueError("--generate tests a whole loop; give it without --scheme or --sampler")
    if args.tree == "dynamic":  # it builds its own trees: self-drafting, the output law only (host/tree_dynamic.py)
        if args.rule not in (None, "none"):
            raise ValueError(f"--tree dynamic claims no rule: the tree is the sampler's own (got --rule {args.rule})")
        args.tree, args.self_drafting, args.rule = None, True, "none"
    if args.tree is not None:
        return _verify_tree(args, update, close), reporter, None, True
    if args.rule in ("rrs", "rrs-wor", "topk"):
        raise ValueError(f"--rule {args.rule} is a tree rule; give the tree with --tree B1,B2,... (and --sampler)")
    sink = None
    try:
        if args.generate is not None:
            from .loops.verify import verify_generate
            from .schemes import _load_object

            try:
                prompt = [int(x) for x in args.prompt.split(",") if x.strip()]
            except ValueError:
                raise ValueError(f"--prompt takes token ids separated by commas, got {args.prompt!r}") from None
            load = functools.partial(mainthread.call, _load_object)  # a user module imports on the main thread
            by_name = (lambda spec: spec) if args.workers > 1 else load  # workers load the loop by name themselves
            draft = load(args.draft_next_token) if args.draft_next_token else None
            with _recording(args.record, args.rule, args.k[0] if args.record else None) as sink:
                report = verify_generate(load(args.next_token), by_name(args.generate), prompt,
                                         length=args.length, sequences=args.sequences, inputs=args.inputs or "probs",
                                         eos=args.eos, plain=by_name(args.plain) if args.plain else None,
                                         budget=args.budget, tv=args.tv, time_budget=args.time, batch=args.batch or 0,
                                         workers=args.workers, rule=args.rule or "standard", draft_next_token=draft,
                                         mode=args.mode, seed=args.seed, alpha=args.alpha,
                                         checkpoint_dir=args.checkpoint, name=args.generate.rpartition(":")[2],
                                         offset=args.offset, progress=update,
                                         bonus_generate=load(args.bonus_generate) if args.bonus_generate else None)
        elif args.sampler is not None:
            import warnings

            from .host import HostNondeterminismWarning, load_sampler, verify_host

            warnings.simplefilter("ignore", HostNondeterminismWarning)  # printed below the headline instead
            sampler = mainthread.call(load_sampler, args.sampler, inputs=args.inputs, rng=args.rng, arrays=args.arrays,
                                      batched=False if args.unbatched else None,
                                      drafts="self" if args.self_drafting else None,
                                      layout="flat" if args.ragged else None,
                                      bonus="given" if args.bonus_given else None, rule=args.rule,
                                      device=args.device)
            with _recording(args.record, args.rule) as sink:
                report = verify_host(sampler, budget=args.budget or "quick",
                                     seed=args.seed, alpha=args.alpha, cases=args.cases, k=args.k, tv=args.tv,
                                     time_budget=args.time, progress=update, checkpoint_dir=args.checkpoint,
                                     batch_calls=args.batch_calls)
        else:
            report = verify(args.scheme or "standard", budget=args.budget or "default", seed=args.seed,
                            alpha=args.alpha, cases=args.cases,
                            k=args.k, prng=args.prng or engine.DEFAULT_PRNG, progress=update,
                            checkpoint_dir=args.checkpoint)
    finally:
        close()
    return report, reporter, sink, False


def _lossy_note(args) -> None:
    """Below a lossy rule's verdict: that a FAIL is what it declares, and where to see how far it is."""
    if args.scheme is None or args.sampler is not None or args.generate is not None:
        return
    from .schemes import make_scheme

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
    from .measure import exact_laws, has_exact, measure
    from .measure import text

    if args.sweep is not None:
        return _measure_sweep(args)
    if args.budget is None and args.sampler is None and args.generate is None:
        args.budget = "certify"  # sized to certify each law within the min detectable TV verify states
    report, reporter, sink, tree = _run(args)
    exact = None
    name = args.scheme or "standard"
    if not tree and args.sampler is None and args.generate is None and has_exact(name):
        from .battery.suite import resolve_budget

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
        from .figures.distortion import write_html

        write_html(m, args.html, command="specsample " + " ".join(shlex.quote(a) for a in args.argv))
        print(f"HTML report: {args.html}")
    if sink is not None:
        print(f"recorded {sum(sink.rounds.values()):,} rounds to {args.record}: specsample audit {args.record}")
    return m.exit_code


def _measure_sweep(args) -> int:
    """``measure --sweep KEY=V1,V2,...``: a lossy rule at each value on one case, beside the standard rule."""
    from .measure import text
    from .measure.sweep import parse_sweep, sweep

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
        from .figures.distortion import write_sweep_html

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


OUTPUT_OPTIONS = ("--json", "--html", "--record", "--checkpoint")  # paths a run writes


def _confirmation(argv: list, seed: int) -> str:
    """The same command with an independent seed: the second run that settles a narrow FAIL. Its outputs go
    to new paths (``report.json`` -> ``report.confirm.json``), so running it verbatim keeps the failing report."""
    argv = list(argv)
    new = str((seed + 1_000_003) % (SEED_MAX + 1))
    out, i, seeded = [], 0, False
    while i < len(argv):
        a = argv[i]
        name, eq, value = a.partition("=")
        if name == "--seed":
            out += ["--seed", new] if eq else [a, new]
            i += 1 if eq else 2
            seeded = True
            continue
        if name in OUTPUT_OPTIONS and eq:
            out.append(f"{name}={_confirm_path(value)}")
        elif a in OUTPUT_OPTIONS and i + 1 < len(argv):
            out += [a, _confirm_path(argv[i + 1])]
            i += 1
        else:
            out.append(a)
        i += 1
    if not seeded:
        out += ["--seed", new]
    return "specsample " + " ".join(shlex.quote(a) for a in out)


def _confirm_path(path: str) -> str:
    """``report.json`` -> ``report.confirm.json``; a folder ``rounds/`` -> ``rounds.confirm``."""
    head, tail = os.path.split(path.rstrip("/") or path)
    stem, suffix = os.path.splitext(tail)
    return os.path.join(head, f"{stem}.confirm{suffix}")


def _check_record(args) -> None:
    """What ``--record`` can record: a host sampler's rounds under the standard rule, or the rounds a
    whole loop reveals through its provenance (a fixed draft length, no EOS)."""
    if args.tree is not None or (args.sampler is None and args.generate is None):
        raise ValueError("--record writes the rounds of a host sampler (--sampler PATH.py:FN) or of a whole loop "
                         "(--generate); tree rounds have no record format yet")
    if args.sampler is not None and args.rule == "none":
        raise ValueError("--record writes rounds under the rule they follow; --rule none claims no rule, so its "
                         "rounds could not be audited (drop --rule none)")
    if args.generate is not None:
        if args.draft_next_token is None:
            raise ValueError("--record of a whole loop rebuilds its rounds from provenance: give --draft-next-token "
                             "and have generate return (tokens, from_draft)")
        if "--k" not in args.argv or len(args.k) != 1:
            raise ValueError("--record of a whole loop needs the loop's draft length: --k K (one value; a loop of "
                             "adaptive k cannot be recorded)")
        if args.eos is not None:
            raise ValueError("--record of a whole loop with --eos is not built: a round cut at EOS is not a whole "
                             "round; record without --eos")
    check_output_dir(args.record, "--record")


@contextlib.contextmanager
def _recording(folder, rule=None, loop_k=None):
    """``--record DIR``: every random round the battery plays (or a loop reveals), written as records
    (none: a no-op)."""
    if folder is None:
        yield None
        return
    from .audit.recorder import RecordSink
    from .host.observe import observe

    sink = RecordSink(folder, rule=rule or "standard", loop_k=loop_k)
    with observe(sink):
        yield sink
    sink.close()


def _cmd_list(args) -> int:
    from .models.pairs import FAMILIES
    from .schemes import CONTROLS, SCHEMES
    from .battery.suite import BUDGETS, NGRAM_FAMILIES, default_cases
    from .models.pairs import NEURAL_FAMILIES

    width = max(28, max(len(n) for n in {**SCHEMES, **CONTROLS}))
    print("schemes (lossless):")
    for name, f in SCHEMES.items():
        print(f"  {name:{width}s} {f(4).description}")
    print("negative controls (must be rejected):")
    for name, f in CONTROLS.items():
        print(f"  {name:{width}s} {f(4).description}")
    from .schemes.lossy import RULES

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
    from .figures.gallery import check_names, render_all

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
    from .calibrate import calibrate, to_json

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
    from . import decode

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


def _cmd_audit(args) -> int:
    check_output_file(args.json, "--json")
    check_output_file(args.html, "--html")
    if args.follow is not None:
        return _audit_follow(args)
    if not args.paths:
        raise ValueError("give record files or folders to audit (PATH ...), or --follow DIR to watch a live engine's")
    if args.idle_exit is not None:
        raise ValueError("--idle-exit belongs to --follow DIR (a batch audit ends when its files are read)")
    from .audit.run import audit

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
    print(f"audited {info['rounds']:,} rounds at {info['rounds_per_s']:.3g} rounds/s")
    _write_outputs(args, report)
    return 0 if report.passed else 1


_INTERRUPT_HOOKS: list = []  # run by the main thread on Ctrl-C before the command exits with 130


def _audit_follow(args) -> int:
    """``audit --follow DIR``: the anytime-valid monitor (:mod:`specsample.audit.monitor`)."""
    from .audit.monitor import Monitor, follow

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


def _cmd_bench(args) -> int:
    check_output_file(args.json, "--json")
    from .bench import GRID, main as bench_main

    try:
        grid = GRID if args.grid is None else tuple(tuple(int(x) for x in p.split(":")) for p in args.grid.split(","))
        assert all(len(g) == 2 and g[0] >= 2 and g[1] >= 1 for g in grid)
    except (ValueError, AssertionError):
        raise ValueError(f"--grid takes V:k points (V >= 2, k >= 1) separated by commas, got {args.grid!r}") from None
    if args.neural < 0:
        raise ValueError(f"--neural takes a number of sequences >= 0 (0 skips the transformer pair), got {args.neural}")
    bench_main(grid=grid, json_path=args.json, sequences=args.sequences, neural_sequences=args.neural)
    return 0


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
    from . import program_cache

    program_cache.enable()
    code = main()
    stage_worker = sys.modules.get(f"{__package__}.battery.stage_worker")
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
    from . import use_all_cpu_cores
    from .heap import keep_freed_memory

    use_all_cpu_cores()
    keep_freed_memory()  # a battery's large numpy temporaries reuse freed memory (specsample.heap)
    args = _parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command, as the HTML report shows it
    if args.command in ("verify", "measure") and getattr(args, "sweep", None) is None and _default_battery(args):  # its stage worker imports beside this process
        from .battery import stage_worker

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
    found = (getattr(sys.modules.get(f"{__package__}.{m}"), name, None) for m, name in where)
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
        engine = sys.modules.get(f"{__package__}.engine.lanes")  # only a run that started has counts to save
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


if __name__ == "__main__":
    sys.exit(main())
