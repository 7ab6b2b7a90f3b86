"""The command line's options: argument types, the checks of output paths, the option groups the
commands share, and the parser."""

from __future__ import annotations

import argparse
import os

from .. import SEED_MAX


def _converted(s: str, cast, unparsed: str, ok, out_of_range: str):
    """``cast(s)`` if ``ok`` of it, else argparse's one-line error: ``unparsed`` or ``out_of_range``, each
    formatted with ``s`` (the text given) and ``v`` (its value, for the range)."""
    try:
        v = cast(s)
    except ValueError:
        raise argparse.ArgumentTypeError(unparsed.format(s=s)) from None
    if not ok(v):
        raise argparse.ArgumentTypeError(out_of_range.format(s=s, v=v))
    return v


def _positive_float(s: str) -> float:
    return _converted(s, float, "{s!r} is not a number", lambda v: 0 < v < 1,
                      "must lie strictly between 0 and 1, got {s}")


def _seconds(s: str) -> float:
    return _converted(s, float, "{s!r} is not a number of seconds", lambda v: 0 < v < float("inf"),
                      "must be a positive number of seconds, got {s}")


def _ks(s: str) -> tuple:
    return _converted(s, lambda t: tuple(int(x) for x in t.split(",") if x.strip()),
                      "--k takes comma-separated integers, got {s!r}", lambda ks: ks and min(ks) >= 1,
                      "draft lengths must be integers >= 1")


def _seed(s: str) -> int:
    return _converted(s, int, "--seed takes an integer, got {s!r}", lambda v: 0 <= v <= SEED_MAX,
                      f"--seed must lie in [0, {SEED_MAX}], got {{v}} (seeds are folded into 31 bits, so a "
                      "negative or larger one would repeat another)")


def _budget(s: str) -> str:
    """quick | default | thorough | certify | a positive number (checked here, before any work)."""
    if s in ("quick", "default", "thorough", "certify"):
        return s
    _converted(s, float, "--budget takes quick, default, thorough, certify or a number, got {s!r}",
               lambda v: v > 0, "--budget must be positive, got {s}")
    return s


def _positive_int(s: str) -> int:
    return _converted(s, int, "expected an integer, got {s!r}", lambda v: v >= 1, "must be >= 1, got {v}")


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
                   help="processes reading and counting files and Parquet row groups (same report; default 1); "
                        "at most one per two cores is started, as each reads ahead in a thread of its own")
    a.add_argument("--dask", default=None, metavar="ADDRESS",
                   help="count on a Dask cluster: a scheduler address, or 'local' (--workers processes)")
    return ap
