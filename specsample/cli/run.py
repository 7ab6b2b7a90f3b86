"""A run of the battery from the command line, shared by ``verify`` and ``measure``: progress, the scheme,
sampler or loop it names, its outputs, the confirmation of a failing run and the recording of its rounds."""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import sys

from .. import SEED_MAX
from ..host import mainthread
from .options import _init_distributed, check_output_dir, check_output_file

_INTERRUPT_HOOKS: list = []  # run by the main thread on Ctrl-C before the command exits with 130

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
    from ..host.sampler import _is_factory
    from ..host.tree import TreeSampler
    from ..host.tree_verify import verify_tree_host
    from ..schemes import _load_object

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
        from ..figures.html import write_html

        write_html(report, args.html, command="specsample " + " ".join(shlex.quote(a) for a in args.argv))
        print(f"HTML report: {args.html}")


def _default_battery(args) -> bool:
    """Whether ``verify`` runs a registered scheme's default cases in one process (a battery that plays its
    stage passes in :mod:`specsample.battery.stage_worker`), judged from the arguments alone."""
    from ..battery.stage_worker import KV_CACHE_SCHEMES  # imports nothing heavy

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
    from ..engine import lanes as engine
    from ..battery.suite import verify

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
            from ..loops.verify import verify_generate
            from ..schemes import _load_object

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

            from ..host import HostNondeterminismWarning, load_sampler, verify_host

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
    from ..audit.recorder import RecordSink
    from ..host.observe import observe

    sink = RecordSink(folder, rule=rule or "standard", loop_k=loop_k)
    with observe(sink):
        yield sink
    sink.close()
