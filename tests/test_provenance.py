"""Provenance end to end: which tokens were accepted drafts, tested against the rule (issue 22, part).

A stale draft cache leaves the output law exactly at p (speculative sampling is lossless for any
q) and only moves acceptance, so an end-to-end run that sees tokens alone cannot find it. With
the loop's per-token provenance and the draft's teacher-forced rows, acceptance of the first
draft of every round is tested against the rule. The loop here is the engine's own cached round,
jitted over a batch of lanes, wrapped as a batched ``generate`` that reports provenance; the
control is the same loop without the draft cache's rollback.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsample.loops import verify as e2e
from specsample.models.pairs import neural_pair
from specsample.schemes.cached import cached_round, init_cached

K = 4


def cached_generate(pair, roll_draft=True):
    """A batched generate(prompts [B, P], n, seeds [B]) -> (tokens [B, n], from_draft [B, n]) over KV caches."""
    round_fn = jax.jit(jax.vmap(functools.partial(cached_round, target=pair.target, draft=pair.draft, k=K,
                                                  roll_draft=roll_draft)))

    def generate(prompts, n, seeds):
        b = len(seeds)
        # each row from its own prompt (reading prompts[0] for every row is what the batch pass caught here)
        state = jax.vmap(lambda p: init_cached(pair.target, pair.draft, p, n, k=K))(jnp.asarray(prompts, jnp.int32))
        keys = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
        tokens = np.zeros((b, n + K + 1), np.int64)
        flags = np.zeros((b, n + K + 1), bool)
        filled = np.zeros(b, np.int64)
        r = 0
        while filled.min() < n:
            u = jax.vmap(lambda key: jax.random.uniform(jax.random.fold_in(key, r), (2 * K + 1,)))(keys)
            out, state = round_fn(u, state=state)
            toks, emitted = np.asarray(out.tokens), np.asarray(out.n_emitted)
            for i in range(K + 1):
                m = (i < emitted) & (filled + i < n + K + 1)
                tokens[m, filled[m] + i] = toks[m, i]
                flags[m, filled[m] + i] = i < emitted[m] - 1  # all but a round's last token are accepted drafts
            filled += np.where(filled < n, emitted, 0)
            r += 1
        return tokens[:, :n], flags[:, :n]

    return generate


def rows(model):
    return lambda tokens: np.asarray(model.probs(jnp.asarray(tokens, jnp.int32)), np.float64)


@pytest.fixture(scope="module")
def pair():
    return neural_pair("transformer-far", 3, 8, 1)


@pytest.mark.parametrize("roll_draft, passes", [(True, True), (False, False)], ids=["cached", "draft-not-rolled-back"])
def test_a_stale_draft_cache_fails_only_through_provenance(pair, roll_draft, passes):
    generate = cached_generate(pair, roll_draft)
    kw = dict(length=4, sequences=8192, batch=512, seed=1, batch_pass=False)  # batch invariance: test_loop_batch.py
    report = e2e.verify_generate(rows(pair.target), generate, pair.prompt, draft_next_token=rows(pair.draft), **kw)
    acceptance = report.cases[0].test("acceptance-at-round-starts")
    assert report.passed == passes, report.table()
    if not passes:  # the output law itself is exact: only acceptance moved
        assert acceptance.rejected and all(not t.rejected for t in report.cases[0].tests if t is not acceptance)
    # without provenance the same loop is not tested on acceptance (its law tests passed above: fewer sequences)
    blind = e2e.verify_generate(rows(pair.target), lambda p, n, s: generate(p, n, s)[0], pair.prompt,
                                **dict(kw, sequences=2048))
    assert blind.passed and "not tested" in blind.engine["end_to_end"]["provenance"]


def test_provenance_is_required_once_promised(pair):
    with pytest.raises(e2e.LoopError, match="no provenance"):
        e2e.verify_generate(rows(pair.target), lambda p, n, s: np.zeros((len(s), n), int), pair.prompt, length=2,
                            sequences=16, batch=16, draft_next_token=rows(pair.draft))


def test_the_min_detectable_offset_is_detected_at_its_power():
    """Both sides: at the stated offset the test rejects about 99% of the time; with none, about 1%."""
    from scipy.stats import norm

    from specsample.loops.verify import min_detectable_offset

    rng = np.random.default_rng(11)
    a = rng.uniform(0.2, 0.8, 4000)
    d = min_detectable_offset(a, 0.01, 0.99)
    crit, sd = norm.isf(0.005), np.sqrt(np.sum(a * (1 - a)))
    shifted = np.mean([abs(rng.binomial(1, a + d).sum() - a.sum()) / sd > crit for _ in range(600)])
    null = np.mean([abs(rng.binomial(1, a).sum() - a.sum()) / sd > crit for _ in range(600)])
    assert 0.97 <= shifted and null <= 0.03, (shifted, null)
