"""End to end: verify a whole generate loop (caches, logits processors and all) against its target.

The user gives two things:

* ``next_token(tokens int64[N, T]) -> [N, T, V]``: the target's teacher-forced rows (probs, or
  logits with ``inputs="logits"``) for every position of a batch of token arrays; row t is the
  distribution of the token after ``tokens[:, : t + 1]``;
* ``generate(prompt, n, seed) -> tokens``: a black box that generates up to ``n`` tokens after
  ``prompt`` (for example ``model.generate(..., assistant_model=draft, do_sample=True)``) and is
  deterministic given ``seed``; it may stop early at an end-of-sequence token.

specsample runs ``generate`` once per sequence and tests the first L generated tokens:

* **exact** (V**L small): against the law of all V**L continuations, enumerated by teacher forcing
  (:func:`specsample.laws.exact.prefix_rows`): the joint and every position;
* **sequential** (any V): for each position t, every prefix seen often enough is tested on its
  next-token counts against the target's row for that prefix (teacher forcing on the prefixes
  actually seen); a position's p-value is the Holm-adjusted smallest over its prefixes. Valid because
  which prefixes are tested depends only on earlier tokens, and given a prefix its next tokens are
  i.i.d. draws from one row under the null.

With an end-of-sequence token ``eos``, the law is that of the sequence truncated at EOS: a
generated sequence that stops at EOS is padded with EOS, and the exact law puts probability 1 on
EOS after EOS. A *plain* arm (``plain=``: the same model sampled without speculation) runs the same
tests beside it, so a failure of both points at the teacher-forced function or the processors, not
at speculative decoding.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

import numpy as np

import stats

from ..engine import compile_cache
from ..laws import exact
from . import runner as loop_runner
from ..battery import sequential
from .batch import loop_batch_check
from ..laws.rounds import ACCEPTANCE
from .provenance import sequences_for_offset, start_rates
from .boundary import generate_boundary_check
from ..host import observe
from ..host.verify import parse_time
from .runner import LoopError, user_call as _user_call  # noqa: F401 - LoopError re-exported
from ..battery.report import CaseResult, Report, TestResult
from ..schemes import _load_object

MIN_EXPECTED = 100.0  # as the battery (specsample.battery.MIN_EXPECTED)
EXACT_MAX_CELLS = 1 << 16


class _TeacherForced:
    """The user's next-token function as a model with ``probs`` (float64 probabilities) and ``vocab_size``."""

    def __init__(self, fn: Callable, inputs: str, prompt: np.ndarray, eos: Optional[int]):
        if inputs not in ("probs", "logits"):
            raise ValueError(f"inputs must be probs or logits, got {inputs!r}")
        self.fn, self.inputs, self.eos = fn, inputs, None
        self.vocab_size = self.probs(prompt[None]).shape[-1]
        if eos is not None and not 0 <= eos < self.vocab_size:
            raise ValueError(f"eos = {eos} is not a token id of this vocabulary (V = {self.vocab_size})")
        self.eos = eos

    def probs(self, tokens) -> np.ndarray:
        out = _user_call(self.fn, "next_token", np.asarray(tokens, np.int64))
        if hasattr(out, "detach"):
            out = out.detach().cpu().numpy()
        x = np.asarray(out, np.float64)
        if x.shape[:2] != np.shape(tokens)[:2] or x.ndim != 3:
            raise ValueError(f"next_token returned shape {x.shape} for tokens of shape {np.shape(tokens)}; "
                             "expected [N, T, V]")
        if self.inputs == "logits":
            x = np.exp(x - x.max(axis=-1, keepdims=True))
        x = x / x.sum(axis=-1, keepdims=True)
        if self.eos is not None:  # after an EOS in the tokens, the sequence has ended: EOS with certainty
            ended = np.cumsum(np.asarray(tokens) == self.eos, axis=1) > 0
            x = np.where(ended[..., None], np.eye(x.shape[-1])[self.eos], x)
        return x


def sample(generate, prompt, length: int, sequences: int, *, seed: int = 0, label: str = "generate",
           eos: Optional[int] = None, vocab: Optional[int] = None, progress=None,
           checkpoint_path: Optional[str] = None, checkpoint_every: float = 30.0, batch: int = 0, workers: int = 1,
           deadline: Optional[float] = None, provenance: bool = False) -> tuple:
    """Call ``generate`` for ``sequences`` sequences; returns the first ``length`` tokens of each (padded
    with EOS after an EOS) and how many outputs broke the contract (a token outside the vocabulary, too
    short without an EOS, tokens after EOS that are not EOS), which count as invalid.

    Sequence i's seed depends only on ``seed``, ``label`` and i, so the result does not depend on
    ``batch`` (batched calls ``generate(prompts [B, P], n, seeds [B]) -> [B, n]``), ``workers``
    (processes, each loading ``generate`` by its ``path.py:fn`` name) or a checkpoint's resumption
    (``checkpoint_path``: saved every ``checkpoint_every`` seconds and at the end). With a
    ``deadline`` (``time.perf_counter()``) no call starts after it and fewer rows may come back.
    With ``provenance`` the loop returns ``(tokens, from_draft)`` and a third array comes back:
    which tokens were accepted drafts. See :mod:`specsample.loops.runner`."""
    return loop_runner.draw(generate, prompt, length, sequences, seed=seed, label=label, eos=eos, vocab=vocab,
                            progress=progress, checkpoint_path=checkpoint_path, checkpoint_every=checkpoint_every,
                            batch=batch, workers=workers, deadline=deadline, provenance=provenance)


def acceptance_test(model, draft_model, prompt, seqs, from_draft, rule: str, eos: Optional[int] = None,
                    batch: int = 1024, level: float = 0.01, power: float = 0.99) -> TestResult:
    """Accepted drafts at round starts against the rule's law, given each prefix (provenance).

    A round starts at position 0 and after every token that is not an accepted draft; its first
    slot is always a draft (whatever k, adaptive k included), accepted with probability
    ``ACCEPTANCE[rule](p, q)`` of the two models' rows after the prefix. The number accepted over all
    round starts is compared with the sum of those probabilities (a normal test: variance
    sum a (1 - a); valid once that sum is large). Draft-side bugs that leave the output law at p
    (a stale draft cache) move acceptance, and show here. The detail states the min detectable
    offset of the acceptance rate at round starts: the shift d of every start's acceptance
    probability that the two-sided test at ``level`` detects with probability ``power``,
    d = (z(1 - level / 2) + z(power)) sqrt(sum a (1 - a)) / starts.
    """
    a, start = start_rates(model, draft_model, prompt, seqs, from_draft, rule, eos, batch)
    a = a[start]
    r = stats.bernoulli_sum_test(from_draft[start].astype(np.int64), np.ones(a.size, np.int64), a)
    observed, expected, z, pvalue = r.observed, r.expected, r.statistic, r.pvalue
    offset = min_detectable_offset(a, level, power)
    return TestResult("acceptance-at-round-starts", float(z), pvalue, 1,
                      detail=f"{int(observed)} of {int(start.sum())} round starts accepted, {expected:.1f} expected "
                             f"under the {rule} rule (z = {z:+.2f}); min detectable offset of the acceptance rate "
                             f"{offset:.2g} (level {level:.2g}, power {power:g})")


def min_detectable_offset(a: np.ndarray, level: float, power: float) -> float:
    """The smallest shift of every acceptance probability ``a`` that a two-sided z-test of the accepted
    count at ``level`` detects with probability ``power`` (normal approximation).

    >>> round(min_detectable_offset(np.full(10_000, 0.5), 0.01, 0.99), 4)
    0.0245
    """
    from scipy.stats import norm

    a = np.asarray(a, np.float64)
    if a.size == 0:
        return float("nan")
    sd = np.sqrt(np.sum(a * (1 - a)))
    return float((norm.isf(level / 2) + norm.isf(1 - power)) * sd / a.size) if sd > 0 else 0.0


def _exact_tests(model, prompt, seqs, invalid, level, power) -> tuple[list, float]:
    v, (n, L) = model.vocab_size, seqs.shape
    from ..battery.suite import _min_tv, law_tests

    rows = exact.prefix_rows(model, prompt, L)
    marg = exact.marginals_from_rows(rows)
    counts = np.bincount(np.ravel_multi_index(seqs.T, (v,) * L), minlength=v**L)
    positions = np.stack([np.bincount(seqs[:, t], minlength=v) for t in range(L)])
    tests = law_tests(counts, positions, exact.joint_from_rows(rows), marg, invalid,
                      f"{invalid} outputs broke the contract (ids outside [0, {v}), too short, tokens after EOS)",
                      level, power)
    return tests, _min_tv(marg[0], n, level, power)


def _sequential_tests(model, prompt, seqs, invalid, level, power) -> tuple[list, float]:
    n = len(seqs)
    distinct, weight = np.unique(seqs, axis=0, return_counts=True)
    per_prefix, viol, first_row = sequential.tests_from_sequences(distinct, weight, model, prompt,
                                                                  model.vocab_size, MIN_EXPECTED, level=level)
    tests = [TestResult("valid-tokens", float(invalid), float(invalid == 0), hard=True,
                        detail=f"{invalid} outputs broke the contract"),
             TestResult("support", float(viol), float(viol == 0), hard=True,
                        detail=f"{viol} tokens emitted where the target gives probability 0")]
    from ..battery.suite import _min_tv

    return tests + per_prefix, _min_tv(first_row, n, level, power)


def verify_generate(next_token: Callable, generate, prompt, *, length: int, sequences: Optional[int] = None,
                    inputs: str = "probs", eos: Optional[int] = None, plain=None,
                    mode: str = "auto", seed: int = 0, alpha: float = 0.01, power: float = 0.99,
                    name: str = "generate", progress=None, checkpoint_dir: Optional[str] = None,
                    budget=None, tv: Optional[float] = None, time_budget=None, batch: int = 0,
                    workers: int = 1, draft_next_token: Optional[Callable] = None,
                    rule: str = "standard", boundary: bool = True, batch_pass: bool = True,
                    offset: Optional[float] = None, bonus_generate=None) -> Report:
    """Test the first ``length`` tokens of ``sequences`` calls of ``generate`` against the target.

    Parameters
    ----------
    next_token : callable
        ``next_token(tokens int64[N, T]) -> [N, T, V]`` (numpy or torch), probs or logits.
    generate, plain : callable or str
        ``generate(prompt, n, seed) -> tokens``; ``plain`` (optional) is the same model sampled
        without speculation, run through the same tests as a control arm. A ``path.py:fn`` name
        is loaded (and is what ``workers`` need).
    prompt : sequence of int
    length : int
        L tokens kept.
    sequences : int, optional
        Sequences per arm, exactly. Without it the size comes from ``budget`` / ``tv``.
    budget : {"quick", "default", "thorough"} or int, optional
        As for host samplers: the power calculation's sample size at the budget's TV, for the
        law of the first token (its support's cells, at the run's Holm level), capped at
        :data:`specsample.host.HOST_CAPS`; an int is sequences per arm. Default: quick.
    tv : float, optional
        Target min detectable TV: exactly what the power calculation asks for (no cap).
    time_budget : float or str, optional
        A bound on the sampling time (``"10m"``), shared equally by the arms; each stops at its
        deadline or at its sample size. The sequences drawn are a prefix of the full run's.
    batch : int
        0: one call a sequence. B > 0: ``generate(prompts [B, P], n, seeds [B]) -> [B, n]``.
    workers : int
        Processes drawing sequences (each loads ``generate`` by name); the counts do not depend
        on their number.
    draft_next_token : callable, optional
        The draft's teacher-forced rows, as ``next_token``. With it, ``generate`` must return
        provenance, ``(tokens, from_draft)`` (True where a token is an accepted draft), and the
        acceptance of the first draft of every round is tested against ``rule``
        (:func:`acceptance_test`): draft-side bugs that leave the output law exact show there.
        Without it the report says that draft-side effects were not tested.
    bonus_generate : callable or str, optional
        The same loop with the target as its own draft (every draft accepted, so every round emits its
        bonus): the boundary pass forces its draws too (test ``boundary-bonus``), so bonus draws are
        forced in rounds that emit the bonus, however seldom the loop itself gets there.
    offset : float, optional
        With ``draft_next_token``: size the run so that the acceptance test detects an offset this
        large of the acceptance rate at round starts with probability ``power``
        (:func:`specsample.loops.provenance.sequences_for_offset`, from a pilot of 256 sequences);
        the larger of this and the output tests' size is drawn.
    rule : {"standard", "exact-match"}
        The acceptance rule the loop claims (min(1, p / q), or the target's own sample kept when
        it equals the draft).
    inputs : {"probs", "logits"}
    eos : int, optional
        End-of-sequence token: the law is that of the sequence truncated at it.
    mode : {"auto", "exact", "sequential"}
        auto: exact when V**L <= 65536, else sequential.
    boundary : bool
        Run the end-to-end boundary pass (:mod:`specsample.loops.boundary`): one sequence's every
        drawn value, in turn, at its extremes; a forbidden token is a hard failure.
    batch_pass : bool
        With ``batch`` > 0, call the loop with the prompt alone and amid other prompts
        (:mod:`specsample.loops.batch`): 1,200 more calls.
    checkpoint_dir : str, optional
        Each arm's sequences so far are kept here; a killed run started again with the same
        arguments resumes after them and ends with the sequences of an uninterrupted run.

    Returns
    -------
    Report
        One case per arm ("generate", "plain"), Holm across every test of both.
    """
    compile_cache.release_if_crowded()
    prompt = np.asarray(prompt, np.int64).ravel()
    if prompt.size < 1:
        raise ValueError("the prompt needs at least one token (the first row follows it)")
    for label, x in (("length", length), ("sequences", sequences)):
        if x is None and label == "sequences":  # sized by the budget below
            continue
        if int(x) != x or x < 1:
            raise ValueError(f"{label} must be an integer >= 1, got {x}")
    if mode not in ("auto", "exact", "sequential"):
        raise ValueError(f"mode must be auto, exact or sequential, got {mode!r}")
    model = _TeacherForced(next_token, inputs, prompt, eos)
    v = model.vocab_size
    if draft_next_token is not None and rule not in ACCEPTANCE:
        raise ValueError(f"rule must be one of {', '.join(ACCEPTANCE)} (what acceptance is tested against), "
                         f"got {rule!r}")
    draft_model = None if draft_next_token is None else _TeacherForced(draft_next_token, inputs, prompt, eos)
    if draft_model is not None and draft_model.vocab_size != v:
        raise ValueError(f"the draft's rows have V = {draft_model.vocab_size}, the target's V = {v}")
    use_exact = mode == "exact" or (mode == "auto" and v**length <= EXACT_MAX_CELLS)
    if use_exact and v ** (length - 1) > 1 << 22:
        raise ValueError(f"exact mode enumerates V**(L-1) = {v ** (length - 1)} prefixes; use mode='sequential'")
    arms = [("generate", generate)] + ([("plain", plain)] if plain is not None else [])
    n_tests = (length + 3) if use_exact else (length + 2)
    level = alpha / (len(arms) * n_tests + (draft_model is not None))  # planned before any sequence is seen
    first_row = model.probs(prompt[None])[0, -1]
    if offset is not None and draft_model is None:
        raise ValueError("offset sizes the run for the acceptance test at round starts: give draft_next_token "
                         "(and have generate return (tokens, from_draft))")
    if offset is not None and sequences is not None:
        raise ValueError("give sequences (exact) or offset (sized by the power calculation), not both")
    sequences, size_note = _sample_size(sequences, budget, tv, first_row, level, power)
    if offset is not None:
        n_off, note = sequences_for_offset(generate, model, draft_model, prompt, length, offset, rule, level, power,
                                           eos=eos, seed=seed, batch=batch, workers=workers)
        if n_off > sequences:
            sequences, size_note = n_off, f"{note}; the output tests alone: {size_note}"
        else:
            size_note = f"{size_note}; {note}: covered"
    seconds = parse_time(time_budget)
    t_start = time.perf_counter()
    results, drawn_seconds = [], 0.0
    for i, (label, fn) in enumerate(arms):
        t0 = time.perf_counter()
        deadline = None
        if seconds is not None:  # an equal share of the time left
            deadline = t0 + max(0.0, t_start + seconds - t0) / (len(arms) - i)
        ck = None
        if checkpoint_dir is not None:
            os.makedirs(checkpoint_dir, exist_ok=True)
            ck = os.path.join(checkpoint_dir, f"e2e-{name}-{label}-s{seed}.npz")
        with_provenance = draft_model is not None and label == "generate"  # the plain arm drafts nothing
        drawn = sample(fn, prompt, length, sequences, seed=seed, label=label, eos=eos, vocab=v, progress=progress,
                       checkpoint_path=ck, batch=batch, workers=workers, deadline=deadline,
                       provenance=with_provenance)
        seqs, invalid = drawn[:2]
        drawn_seconds += time.perf_counter() - t0
        test_fn = _exact_tests if use_exact else _sequential_tests
        tests, min_tv = test_fn(model, prompt, seqs, invalid, level, power)
        if with_provenance and observe.active():  # verify --generate ... --record: the rounds it reveals
            observe.notify_sequences(name, prompt, seqs, drawn[2], model.probs, draft_model.probs)
        if with_provenance:
            tests.append(acceptance_test(model, draft_model, prompt, seqs, drawn[2], rule, eos, level=level,
                                         power=power))
        if label == "generate" and batch > 0 and batch_pass:  # the prompt alone and amid others (loops/batch.py)
            tests += loop_batch_check(_load_object(fn) if isinstance(fn, str) else fn, prompt, length, v, seed=seed)
        if label == "generate" and boundary:  # every drawn value of one sequence at its extremes (hard check)
            loop = _load_object(fn) if isinstance(fn, str) else fn
            b = generate_boundary_check(model, loop, prompt, length, seed=seed, batched=batch > 0, eos=eos,
                                        draft=draft_model)
            tests.append(TestResult("boundary-intercepted", float(b.violations), 0.0 if b.violations else 1.0,
                                    hard=True, detail=b.detail, reached=b.reached > 0))
            if bonus_generate is not None:  # every round emits its bonus: its draws forced where they show
                bonus_loop = _load_object(bonus_generate) if isinstance(bonus_generate, str) else bonus_generate
                bb = generate_boundary_check(model, bonus_loop, prompt, length, seed=seed, batched=batch > 0,
                                             eos=eos, label="boundary-bonus")
                tests.append(TestResult("boundary-bonus", float(bb.violations), 0.0 if bb.violations else 1.0,
                                        hard=True, reached=bb.reached > 0,
                                        detail=f"the loop with the target as its draft (every round emits its "
                                               f"bonus): {bb.detail}"))
        results.append(CaseResult(name=f"{name}:{label}" if label == "generate" else label, scheme=name,
                                  family="end-to-end", model="exact" if use_exact else "sequential", vocab=v, k=0,
                                  length=length, sequences=len(seqs), rounds=0, tests=tests, min_detectable_tv=min_tv,
                                  seconds=time.perf_counter() - t0, sequences_planned=int(sequences),
                                  min_detectable_tv_planned=_planned_min_tv(first_row, int(sequences), level, power)))
    from ..battery.suite import _holm_all

    _holm_all(results, alpha)
    return Report(scheme=name, alpha=alpha, seed=int(seed), budget=str(sequences), cases=results,
                  seconds=time.perf_counter() - t_start, power=power,
                  engine=dict(end_to_end=dict(mode="exact" if use_exact else "sequential", eos=eos,
                                              prompt=prompt.tolist(), plain_arm=plain is not None,
                                              sequences_planned=sequences, size=size_note, batch=batch,
                                              provenance=(f"acceptance at round starts tested against the {rule} rule"
                                                          if draft_model is not None else
                                                          "none given: draft-side effects (acceptance) not tested"),
                                              workers=workers, time_budget_s=seconds, sampling_s=drawn_seconds,
                                              sequences_per_s=sum(r.sequences for r in results) / drawn_seconds
                                              if drawn_seconds else float("nan"))))


def _planned_min_tv(first_row, n: int, level: float, power: float) -> float:
    """The first position's min detectable TV had the run drawn all ``n`` sequences it planned."""
    from ..battery.suite import _min_tv

    return _min_tv(first_row, n, level, power)


def _sample_size(sequences, budget, tv, first_row, level: float, power: float) -> tuple[int, str]:
    """Sequences per arm, and how they were chosen: exact, a budget's power calculation, or a TV's."""
    from ..battery.suite import resolve_budget
    from ..host import HOST_CAPS

    if sequences is not None:
        if budget is not None or tv is not None:
            raise ValueError("give --sequences (exact) or --budget / --tv (from the power calculation), not both")
        return int(sequences), f"{int(sequences)} sequences per arm, as asked"
    if tv is not None and not 0 < float(tv) < 1:
        raise ValueError(f"tv is a total variation in (0, 1), got {tv!r}")
    bud, explicit, label = resolve_budget(budget or "quick")
    if explicit:
        return explicit, f"{explicit} sequences per arm (--budget)"
    cells = int(np.count_nonzero(first_row))
    if cells < 2:
        return HOST_CAPS[bud.name], "the first token's law is a point mass: no power calculation; the budget's cap"
    target = float(tv) if tv is not None else bud.tv
    n = stats.samples_for_tv(target, cells - 1, level, power).n
    if tv is None and n > HOST_CAPS[bud.name]:
        return HOST_CAPS[bud.name], f"{bud.name} budget: {n} sequences for TV {target:g}, capped at {HOST_CAPS[bud.name]}"
    return n, f"power calculation: {n} sequences per arm for min detectable TV {target:g}"
