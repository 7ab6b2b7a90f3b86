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
  (:func:`specsample.exact.prefix_rows`): the joint and every position;
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

import hashlib
import os
import time
from typing import Callable, Optional

import numpy as np

import stats

from . import checkpoint, exact, mainthread
from .report import CaseResult, Report, TestResult

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
        out = mainthread.call(self.fn, np.asarray(tokens, np.int64))
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


def _seed(seed: int, label: str, i: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{label}/{i}".encode()).digest()[:4], "little") >> 1


def sample(generate: Callable, prompt, length: int, sequences: int, *, seed: int = 0, label: str = "generate",
           eos: Optional[int] = None, vocab: Optional[int] = None, progress=None,
           checkpoint_path: Optional[str] = None, checkpoint_every: float = 30.0) -> tuple[np.ndarray, int]:
    """Call ``generate`` ``sequences`` times; returns the first ``length`` tokens of each (padded with
    EOS after an EOS) and how many outputs broke the contract (a token outside the vocabulary, too
    short without an EOS, tokens after EOS that are not EOS), which count as invalid.

    With ``checkpoint_path``, the sequences so far are saved every ``checkpoint_every`` seconds and at
    the end; a call with the same arguments resumes after them (sequence i's seed depends only on
    ``seed``, ``label`` and i, so a resumed run returns what an uninterrupted one would)."""
    out = np.zeros((sequences, length), np.int64)
    invalid, first = 0, 0
    signature = repr(("e2e", label, int(seed), int(length), int(sequences), np.asarray(prompt).tolist(), eos, vocab))
    saved = checkpoint.load(checkpoint_path, signature) if checkpoint_path else None
    if saved is not None:
        first, invalid = int(saved["done"]), int(saved["invalid"])
        out[:first] = saved["tokens"]
    last_save = time.monotonic()

    def save(done: int) -> None:
        checkpoint.save(checkpoint_path, signature, {"done": done, "invalid": invalid, "tokens": out[:done]})

    for i in range(first, sequences):
        toks = mainthread.call(generate, np.asarray(prompt, np.int64), length, _seed(seed, label, i))
        if hasattr(toks, "detach"):
            toks = toks.detach().cpu().numpy()
        toks = np.asarray(toks, np.int64).ravel()[:length]
        bad = vocab is not None and np.any((toks < 0) | (toks >= vocab))
        if eos is not None and toks.size and np.any(toks == eos):
            first = int(np.argmax(toks == eos))
            bad |= bool(np.any(toks[first:] != eos))
            toks = np.concatenate([toks[: first + 1], np.full(length - first - 1, eos)])
        elif toks.size < length:
            bad = True
            toks = np.concatenate([toks, np.zeros(length - toks.size, np.int64)])
        invalid += int(bad)
        out[i] = np.clip(toks, 0, (vocab or 1 << 62) - 1)
        if progress is not None and (i + 1) % 64 == 0:
            progress(label, i + 1, sequences)
        if checkpoint_path and time.monotonic() - last_save >= checkpoint_every:
            save(i + 1)
            last_save = time.monotonic()
    if checkpoint_path:
        save(sequences)
    return out, invalid


def _exact_tests(model, prompt, seqs, invalid, level, power) -> tuple[list, float]:
    v, (n, L) = model.vocab_size, seqs.shape
    from .battery import _min_tv, law_tests

    rows = exact.prefix_rows(model, prompt, L)
    marg = exact.marginals_from_rows(rows)
    counts = np.bincount(np.ravel_multi_index(seqs.T, (v,) * L), minlength=v**L)
    positions = np.stack([np.bincount(seqs[:, t], minlength=v) for t in range(L)])
    tests = law_tests(counts, positions, exact.joint_from_rows(rows), marg, invalid,
                      f"{invalid} outputs broke the contract (ids outside [0, {v}), too short, tokens after EOS)",
                      level, power)
    return tests, _min_tv(marg[0], n, level, power)


def _sequential_tests(model, prompt, seqs, invalid, level, power, batch: int = 1024) -> tuple[list, float]:
    v, (n, L) = model.vocab_size, seqs.shape
    tests = [TestResult("valid-tokens", float(invalid), float(invalid == 0), hard=True,
                        detail=f"{invalid} outputs broke the contract")]
    viol, first_row = 0, None
    for t in range(L):
        prefixes, inverse, seen = np.unique(seqs[:, :t], axis=0, return_inverse=True, return_counts=True)
        inverse = inverse.ravel()
        rows = np.empty((len(prefixes), v))
        for s in range(0, len(prefixes), batch):  # teacher forcing on the prefixes actually seen
            part = prefixes[s : s + batch]
            toks = np.concatenate([np.broadcast_to(prompt, (len(part), prompt.size)), part], axis=1)
            rows[s : s + batch] = model.probs(toks)[:, -1]
        if t == 0:
            first_row = rows[0]
        nxt = np.zeros((len(prefixes), v), np.int64)
        np.add.at(nxt, (inverse, seqs[:, t]), 1)
        viol += int(nxt[rows == 0].sum())
        pvals = []
        for h in np.flatnonzero(seen * rows.max(axis=1) >= MIN_EXPECTED):  # enough data for two pooled cells
            r = stats.goodness_of_fit(nxt[h], rows[h], min_expected=MIN_EXPECTED)
            if r.cells >= 2:
                pvals.append(r.pvalue)
        if pvals:
            adj = float(np.min(stats.holm(pvals, 0.5).adjusted))
            tests.append(TestResult(f"prefixes[{t}]", float(np.min(pvals)), adj, len(pvals),
                                    detail=f"{len(pvals)} of {len(prefixes)} prefixes tested on their next token; "
                                           f"Holm-adjusted smallest p"))
    tests.insert(1, TestResult("support", float(viol), float(viol == 0), hard=True,
                               detail=f"{viol} tokens emitted where the target gives probability 0"))
    from .battery import _min_tv

    return tests, _min_tv(first_row, n, level, power)


def verify_generate(next_token: Callable, generate: Callable, prompt, *, length: int, sequences: int,
                    inputs: str = "probs", eos: Optional[int] = None, plain: Optional[Callable] = None,
                    mode: str = "auto", seed: int = 0, alpha: float = 0.01, power: float = 0.99,
                    name: str = "generate", progress=None, checkpoint_dir: Optional[str] = None) -> Report:
    """Test the first ``length`` tokens of ``sequences`` calls of ``generate`` against the target.

    Parameters
    ----------
    next_token : callable
        ``next_token(tokens int64[N, T]) -> [N, T, V]`` (numpy or torch), probs or logits.
    generate, plain : callable
        ``generate(prompt, n, seed) -> tokens``; ``plain`` (optional) is the same model sampled
        without speculation, run through the same tests as a control arm.
    prompt : sequence of int
    length, sequences : int
        L tokens kept; sequences per arm (exactly).
    inputs : {"probs", "logits"}
    eos : int, optional
        End-of-sequence token: the law is that of the sequence truncated at it.
    mode : {"auto", "exact", "sequential"}
        auto: exact when V**L <= 65536, else sequential.
    checkpoint_dir : str, optional
        Each arm's sequences so far are kept here; a killed run started again with the same
        arguments resumes after them and ends with the sequences of an uninterrupted run.

    Returns
    -------
    Report
        One case per arm ("generate", "plain"), Holm across every test of both.
    """
    prompt = np.asarray(prompt, np.int64).ravel()
    if prompt.size < 1:
        raise ValueError("the prompt needs at least one token (the first row follows it)")
    for label, x in (("length", length), ("sequences", sequences)):
        if int(x) != x or x < 1:
            raise ValueError(f"{label} must be an integer >= 1, got {x}")
    if mode not in ("auto", "exact", "sequential"):
        raise ValueError(f"mode must be auto, exact or sequential, got {mode!r}")
    model = _TeacherForced(next_token, inputs, prompt, eos)
    v = model.vocab_size
    use_exact = mode == "exact" or (mode == "auto" and v**length <= EXACT_MAX_CELLS)
    if use_exact and v ** (length - 1) > 1 << 22:
        raise ValueError(f"exact mode enumerates V**(L-1) = {v ** (length - 1)} prefixes; use mode='sequential'")
    arms = [("generate", generate)] + ([("plain", plain)] if plain is not None else [])
    n_tests = (length + 3) if use_exact else (length + 2)
    level = alpha / (len(arms) * n_tests)
    t_start = time.perf_counter()
    results = []
    for label, fn in arms:
        t0 = time.perf_counter()
        ck = None
        if checkpoint_dir is not None:
            os.makedirs(checkpoint_dir, exist_ok=True)
            ck = os.path.join(checkpoint_dir, f"e2e-{name}-{label}-s{seed}.npz")
        seqs, invalid = sample(fn, prompt, length, sequences, seed=seed, label=label, eos=eos, vocab=v,
                               progress=progress, checkpoint_path=ck)
        test_fn = _exact_tests if use_exact else _sequential_tests
        tests, min_tv = test_fn(model, prompt, seqs, invalid, level, power)
        results.append(CaseResult(name=f"{name}:{label}" if label == "generate" else label, scheme=name,
                                  family="end-to-end", model="exact" if use_exact else "sequential", vocab=v, k=0,
                                  length=length, sequences=sequences, rounds=0, tests=tests, min_detectable_tv=min_tv,
                                  seconds=time.perf_counter() - t0))
    from .battery import _holm_all

    _holm_all(results, alpha)
    return Report(scheme=name, alpha=alpha, seed=int(seed), budget=str(sequences), cases=results,
                  seconds=time.perf_counter() - t_start, power=power,
                  engine=dict(end_to_end=dict(mode="exact" if use_exact else "sequential", eos=eos,
                                              prompt=prompt.tolist(), plain_arm=plain is not None)))
