"""Batch invariance: a request's law must not depend on the requests batched beside it.

The battery's cases count every request of a batch against its own law, which a sampler can pass
while the requests of one call share randomness (one uniform per position, broadcast over the
batch) or while a request's result moves with its neighbours (a ragged offset, padding that leaks).
This pass holds one *probe* round fixed (its context, drafts and rows) and calls the sampler

- alone: a batch of the probe only;
- amid neighbours: the probe twice, at random places, among other rounds (other contexts, other
  drafts and, in the flat layout, other draft counts, so the probe's offsets move from call to call),

and tests, on the probe's outcome (accepted drafts and the token that ends the round):

- ``batch-invariance``: alone and amid neighbours give one law (two-sample chi-square,
  :func:`stats.homogeneity_test`);
- ``batch-independence``: the two copies in one call are independent
  (:func:`stats.independence_test` on their accepted drafts and on their ending tokens, Bonferroni
  over the two): two requests that share uniforms agree far too often.

Samplers called one round at a time (``batched=False``) are batched by specsample itself, and pass by
construction; self-drafting samplers are not covered yet.
"""

from __future__ import annotations

import time

import numpy as np

from ..laws.rounds import model_rows
from ..models.tables import TableModel, initial_context
from .run import OutOfTime, _Caller, _draw
from .sampler import HostSampler, _derive

ALONE_CALLS = 3000  # probe rounds alone (batches of one)
AMID_CALLS = 1500  # calls amid neighbours, two probe copies each
BATCH = 8  # requests per call amid neighbours


def _round(target, draft, window, k, rng):
    """A round from ``window``: drafts drawn from q, their q rows [k, V] and p rows [k + 1, V]."""
    drafts = []
    for _ in range(k):
        q = model_rows(draft, tuple(window), tuple(drafts))[-1]
        drafts.append(int(_draw(np.cumsum(q)[None], (q > 0)[None], rng.random(1))[0]))
    d = np.array(drafts, np.int64)
    return d, model_rows(draft, tuple(window), tuple(d))[:k], model_rows(target, tuple(window), tuple(d))


def _outcome(tokens, n, vocab: int, k: int) -> np.ndarray:
    """A probe round's outcome as one label: (accepted drafts, ending token), or k + 1 out-of-range."""
    n = np.asarray(n, np.int64)
    ok = (n >= 1) & (n <= k + 1)
    last = np.asarray(tokens, np.int64)[np.arange(len(n)), np.clip(n - 1, 0, k)]
    return np.where(ok & (last >= 0) & (last < vocab), (np.clip(n, 1, k + 1) - 1) * vocab + last,
                    (k + 1) * vocab)


def batch_check(sampler: HostSampler, target: TableModel, draft: TableModel, *, k: int, seed: int = 0,
                alone: int = ALONE_CALLS, amid: int = AMID_CALLS, batch: int = BATCH) -> tuple:
    """The probe alone and amid neighbours: ``(tests, rounds, detail)``, tests as two TestResults."""
    import stats

    from ..battery.report import TestResult

    rng = np.random.default_rng(_derive(seed, "batch", "rounds"))
    vocab = target.vocab_size
    width = max(target.order, draft.order)
    probe_window = np.asarray(initial_context(width), np.int64)
    # the probe: of 32 rounds drafted from the initial context, the one whose first draft is accepted
    # with probability nearest 1/2 (an outcome that varies is one a shared uniform visibly pins down)
    tries = [_round(target, draft, probe_window, k, rng) for _ in range(32)]
    probe = min(tries, key=lambda r: abs(min(1.0, r[2][0, r[0][0]] / r[1][0, r[0][0]]) - 0.5))
    flat = sampler.layout == "flat"

    def call(caller, rounds, n_draft):
        d = np.stack([r[0] for r in rounds])
        q = np.stack([r[1] for r in rounds]).astype(np.float32)
        p = np.stack([r[2] for r in rounds]).astype(np.float32)
        return caller(d, q, p, n_draft if flat else None)

    t0 = time.perf_counter()
    solo = _Caller(sampler, seed, "batch/alone")
    alone_out = np.empty(alone, np.int64)
    for i in range(alone):
        tokens, n = call(solo, [probe], np.array([k]))
        alone_out[i] = _outcome(tokens, n, vocab, k)[0]
    crowd = _Caller(sampler, seed, "batch/amid")
    pairs = np.empty((amid, 2), np.int64)
    pool = [_round(target, draft, rng.integers(vocab, size=width), k, rng) for _ in range(64)]
    for i in range(amid):
        where = rng.choice(batch, 2, replace=False)
        rounds = [pool[j] for j in rng.integers(len(pool), size=batch)]
        n_draft = rng.integers(0, k + 1, size=batch)
        for w in where:
            rounds[w] = probe
            n_draft[w] = k
        tokens, n = call(crowd, rounds, n_draft)
        pairs[i] = _outcome(tokens, n, vocab, k)[where]
    cells = (k + 1) * vocab + 1
    a = np.bincount(alone_out, minlength=cells)
    b = np.bincount(pairs.ravel(), minlength=cells)
    h = stats.homogeneity_test(a, b)
    # the copies' accepted drafts, and the tokens that end their rounds, each tested apart (Bonferroni over
    # the two): a pooled table of whole outcomes mixes acceptance counts and can wash a shared uniform out
    bad = pairs == (k + 1) * vocab  # a malformed round: its own category in both
    parts = {"accepted drafts": pairs // vocab, "ending token": np.where(bad, vocab, pairs % vocab)}
    found = {what: stats.independence_test(x[:, 0], x[:, 1]) for what, x in parts.items()}
    what = min(found, key=lambda w: found[w].pvalue)
    ind = found[what]
    ind_p = min(1.0, 2 * ind.pvalue)
    same = float(np.mean(pairs[:, 0] == pairs[:, 1]))
    expect = float(np.sum((b / b.sum()) ** 2))  # agreement two independent copies would show
    where_txt = "flat batches of other draft counts" if flat else "batches of other rounds"
    tests = [
        TestResult("batch-invariance", h.statistic, h.pvalue, h.dof,
                   detail=f"the probe round alone ({alone} calls) and amid neighbours ({amid} {where_txt} of "
                          f"{batch}, two copies each): {h.cells} pooled outcomes"),
        TestResult("batch-independence", ind.statistic, ind_p, ind.dof,
                   detail=f"two copies of the probe in one call agree on the whole outcome {same:.3f} of the time "
                          f"(independent copies: {expect:.3f}); worst: their {what}, a {ind.shape[0]}x{ind.shape[1]} "
                          "pooled table (Bonferroni over accepted drafts and ending token)"),
    ]
    return tests, alone + amid * batch, time.perf_counter() - t0


def min_detectable_shift(alone: int, amid: int, cells: int, level: float, power: float) -> float:
    """The smallest TV between the probe's law alone and amid neighbours that the batch-invariance test
    detects with ``power`` at ``level``: the two-sample chi-square's noncentrality is at least ``4 n TV^2``
    with ``n = n1 n2 / (n1 + n2)`` (Cauchy-Schwarz, as for one sample), ``n1 = alone``, ``n2 = 2 amid``."""
    import stats

    n_eff = alone * 2 * amid / (alone + 2 * amid)
    lam = stats.required_noncentrality(max(1, cells - 1), level, power)
    return float(np.sqrt(lam / (4.0 * n_eff)))


def calls_for_shift(tv: float, cells: int, level: float, power: float) -> int:
    """Calls alone (half as many amid) at which :func:`min_detectable_shift` reaches ``tv``."""
    import stats

    lam = stats.required_noncentrality(max(1, cells - 1), level, power)
    return int(np.ceil(lam / (4.0 * tv * tv) * 2))  # n_eff = alone / 2 when amid = alone / 2


def batch_case(s: HostSampler, c, seed: int, *, level: float = 0.01, power: float = 0.99,
               calls: int | None = None):
    """The batch pass as a case of the report (``batch/V{V}/k{k}``) on the case ``c``'s pair.

    ``calls``: probe calls alone (default :data:`ALONE_CALLS`; half as many amid neighbours). The
    invariance test's detail states the smallest shift of the probe's law it detects at ``level`` with
    ``power``, and the calls that would detect a shift of 0.05."""
    from ..battery.report import CaseResult, TestResult
    from .sampler import HostSamplerError

    pair = c.pair(seed)
    name = f"batch/V{c.vocab}/k{c.k}"
    alone = int(calls) if calls else ALONE_CALLS
    if alone < 2:
        raise ValueError(f"the batch pass needs at least 2 calls, got {calls}")
    amid = max(1, alone // 2)
    t0 = time.perf_counter()
    try:
        tests, rounds, _ = batch_check(s, pair.target, pair.draft, k=c.k, seed=seed, alone=alone, amid=amid)
    except HostSamplerError as err:
        tests, rounds = [TestResult("batch-raised", 1.0, 0.0, hard=True, detail=str(err))], 0
    except OutOfTime:  # --time: its share ran out (a slower call than the first one timed)
        tests, rounds = [TestResult("batch-cut-short", 0.0, 1.0, hard=True, reached=False,
                                    detail=f"not reached: the batch pass's share of --time ran out after "
                                           f"{time.perf_counter() - t0:.1f} s, before its {alone} calls were made; "
                                           f"give more time (--time) or fewer calls (--batch-calls)")], 0
    for t in tests:
        if t.name == "batch-invariance":
            cells = max(2, t.dof + 1)
            shift = min_detectable_shift(alone, amid, cells, level, power)
            t.min_detectable_tv = shift
            t.detail += (f"; min detectable shift of the probe's law TV {shift:.2g} (at {alone} calls alone; about "
                         f"{calls_for_shift(0.05, cells, level, power):,} would detect 0.05: batch_calls / "
                         f"--batch-calls)")
    return CaseResult(name=name, scheme=s.name, family=c.family, model=c.model, vocab=c.vocab, k=c.k,
                      length=c.length, sequences=0, rounds=rounds, tests=tests, min_detectable_tv=float("nan"),
                      seconds=time.perf_counter() - t0)
