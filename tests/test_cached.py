"""Speculative sampling over transformers with KV caches: lanes that carry state across rounds.

Right answers first (the cached round equals the cache-free round from the same uniforms; the
exact laws by enumeration agree with the table oracles), then the engine's stateful lanes
(reproducible, reset to the prompt), then the battery's verdicts and its one-line errors.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import stats
from specsample.battery import suite as battery
from specsample.engine import lanes as engine
from specsample.engine.cells import record_fields
from specsample.laws import exact
from specsample.models.tables import TableModel, context_free, exact_joint, exact_marginals
from specsample.models.pairs import neural_pair
from specsample.schemes import StatefulStep, make_scheme, standard
from specsample.schemes.cached import differential_check, restart_cached


@pytest.fixture(scope="module")
def pair():
    return neural_pair("transformer-close", 5, 8, prompt_len=2)


@pytest.fixture(scope="module")
def far():
    return neural_pair("transformer-far", 6, 8, prompt_len=1)


def _run(name, p, k=2, sequences=2048, seed=0, **kw):
    return engine.run(make_scheme(name, k), p.target, p.draft, sequences=sequences, length=4, seed=seed,
                      lanes=128, per_lane=4, prompt=p.prompt, **kw)


def test_cached_and_cache_free_rounds_emit_the_same_tokens(pair, far):
    for p in (pair, far):
        r = differential_check(p.target, p.draft, p.prompt, k=3, length=6, rounds=24, lanes=64, seed=1)
        assert r.rounds == 24 * 64
        assert r.differing <= 1, r  # only a uniform within ~1e-7 of a decision boundary may differ


@pytest.mark.parametrize("prompt_len,length,k,rolled_back", [(2, 4, 2, True), (3, 5, 4, True), (3, 19, 8, True),
                                                         (1, 5, 4, False)])
def test_caches_hold_what_a_round_writes_in_whole_groups_of_slots(prompt_len, length, k, rolled_back):
    from specsample.schemes.cached import SLOT_MULTIPLE, cache_size

    need = prompt_len + length + k + 2 if rolled_back else prompt_len + (length + 1) * (k + 1)
    size = cache_size(prompt_len, length, k, rolled_back)
    assert size % SLOT_MULTIPLE == 0 and need <= size < need + SLOT_MULTIPLE


def test_engine_counts_of_cached_and_recompute_are_equal(far):
    # the same uniforms through both implementations: every count agrees, over many rounds
    a, b = _run("cached", far), _run("recompute", far)
    for name, x, y in zip(a._fields, a, b):
        if x is not None:
            np.testing.assert_array_equal(x, y, err_msg=name)


def test_stateful_counts_do_not_depend_on_the_chunk(far):
    a = _run("cached", far, sequences=4096, blocks_per_call=1)
    b = _run("cached", far, sequences=4096, blocks_per_call=8)
    np.testing.assert_array_equal(a.joint, b.joint)
    np.testing.assert_array_equal(a.rounds_per_sequence, b.rounds_per_sequence)


def _active_rows(counts):
    """The counts, with the recorded rounds of lanes that were done zeroed (they are never read)."""
    out = dict(counts._asdict())
    rec = out.get("record")
    if rec is not None:
        active = record_fields(0, 0).index("active")  # the leading fields do not depend on k
        out["record"] = np.asarray(rec) * np.asarray(rec)[:, :, active : active + 1, :]
    return out


@pytest.mark.parametrize("name, models", [("cached", "pair"), ("recompute", "far"), ("tree-cached", "pair"),
                                          ("control:target-cache-not-rolled-back", "far")])
def test_a_restart_that_resets_lengths_counts_what_a_fresh_state_does(request, name, models):
    # the schemes' restart keeps a completed lane's caches and buffer and resets their lengths and counts;
    # the engine's default copies the fresh state in, leaf by leaf: every count must agree (prompts of two
    # tokens, whose prefilled entries must survive, and of one, whose caches start empty)
    p = request.getfixturevalue(models)
    s = make_scheme(name, 2)
    assert s.step.restart is not None
    plain = s._replace(step=dataclasses.replace(s.step, restart=None))
    kw = dict(sequences=2048, length=4, seed=3, lanes=128, per_lane=4, prompt=p.prompt)
    a, b = _active_rows(engine.run(s, p.target, p.draft, **kw)), _active_rows(engine.run(plain, p.target, p.draft,
                                                                                         **kw))
    for field in a:
        if a[field] is not None:
            np.testing.assert_array_equal(a[field], b[field], err_msg=field)


def test_a_restart_that_keeps_a_stale_length_changes_the_counts(far):
    # the other side: a restart that forgets the target cache's length would carry the last sequence's keys
    def stale(complete, state, fresh):
        return restart_cached(complete, state, fresh)._replace(target_cache=state.target_cache)

    s = make_scheme("cached", 2)
    broken = s._replace(step=dataclasses.replace(s.step, restart=stale))
    kw = dict(sequences=2048, length=4, seed=3, lanes=128, per_lane=4, prompt=far.prompt)
    a, b = engine.run(s, far.target, far.draft, **kw), engine.run(broken, far.target, far.draft, **kw)
    assert not np.array_equal(a.joint, b.joint)


class _Table:
    """A context-free table behind the teacher-forced ``probs`` interface of a neural model."""

    def __init__(self, p):
        self.p, self.vocab_size = np.asarray(p, np.float64), len(p)

    def probs(self, tokens):
        return np.broadcast_to(self.p, np.shape(tokens) + (self.vocab_size,))


def test_exact_laws_by_enumeration_agree_with_the_table_oracles():
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
    rows_p, rows_q = exact.prefix_rows(_Table(p), [0], 3), exact.prefix_rows(_Table(q), [0], 3)
    np.testing.assert_allclose(exact.joint_from_rows(rows_p), exact_joint(context_free(p), 3).ravel())
    np.testing.assert_allclose(exact.marginals_from_rows(rows_p), exact_marginals(context_free(p), 3))
    # the rounds the standard rule takes, against the engine on the table pair (a million sequences)
    for k in (1, 2):
        law = exact.standard_rounds_law(rows_p, rows_q, k)
        assert law[0] == 0 and law.sum() == pytest.approx(1.0)
        c = engine.run(standard(k), context_free(p), context_free(q), sequences=1 << 20, length=3)
        assert stats.goodness_of_fit(c.rounds_per_sequence[0], law).pvalue > 1e-4


def test_rounds_law_of_identical_models_is_one_round_per_k_plus_one_tokens():
    rows = exact.prefix_rows(_Table([0.5, 0.25, 0.25]), [0], 5)
    law = exact.standard_rounds_law(rows, rows, 2)  # every draft accepted: rounds of 3 tokens
    np.testing.assert_allclose(law, [0, 0, 1, 0, 0, 0])


def test_transformer_exact_law_matches_the_cached_engine(pair):
    rows = exact.prefix_rows(pair.target, pair.prompt, 3)
    c = engine.run(make_scheme("cached", 2), pair.target, pair.draft, sequences=1 << 14, length=3, lanes=256,
                   per_lane=4, prompt=pair.prompt)
    assert stats.goodness_of_fit(c.joint[0], exact.joint_from_rows(rows), min_expected=100).pvalue > 1e-4
    law = exact.standard_rounds_law(rows, exact.prefix_rows(pair.draft, pair.prompt, 3), 2)
    assert stats.goodness_of_fit(c.rounds_per_sequence[0], law, min_expected=100).pvalue > 1e-4


def test_every_sequence_starts_after_the_prompt(pair):
    # the first token follows p(. | prompt), in every sequence of every lane (the state is reset)
    row = np.asarray(pair.target.probs(jnp.asarray(pair.prompt)), np.float64)[-1]
    c = _run("cached", pair, k=2, sequences=8192)
    assert stats.goodness_of_fit(c.position[0, 0], row).pvalue > 1e-4


def test_the_battery_passes_cached_and_rejects_a_cache_control():
    ok = battery.verify("cached", budget="quick", seed=3, k=1, cases="transformer-far/V8/k1")
    assert ok.passed, ok.table()
    case = ok.cases[0]
    assert {t.name for t in case.tests} >= {"joint", "position[0]", "rounds-per-sequence", "support"}
    assert 0 < case.alpha < 1 and case.min_detectable_tv < 0.1
    bad = battery.verify("control:last-token-not-in-draft-cache", budget="quick", seed=3, k=1,
                         cases="transformer-far/V8/k1")
    assert not bad.passed and bad.cases[0].worst.name == "rounds-per-sequence"


def test_only_stateful_schemes_run_the_transformer_cases():
    table = [c for c in battery.default_cases(battery.BUDGETS["quick"]) if c.neural]
    assert {c.vocab for c in table} == {2, 8, 32} and {c.k for c in table} == {1, 4, 8}
    assert {c.prompt_len for c in table} >= {1, 3}
    with pytest.raises(ValueError, match="names transformer cases only; standard is a table scheme"):
        battery.verify("standard", budget="quick", cases="transformer-far/V8/k1", k=1)


def test_errors_name_the_model_kind(pair):
    t = TableModel(np.full((1, 4), 0.25), 0)
    with pytest.raises(TypeError, match="runs on neural models"):
        engine.run(make_scheme("cached", 2), t, t, sequences=16, length=2)
    with pytest.raises(TypeError, match="scheme 'cached'"):
        engine.run(standard(2), pair.target, pair.draft, sequences=16, length=2)
    with pytest.raises(ValueError, match="a prompt is for schemes"):
        engine.run(standard(2), t, t, sequences=16, length=2, prompt=[1])
    with pytest.raises(ValueError, match=r"prompt token ids must lie in \[0, 8\)"):
        engine.run(make_scheme("cached", 2), pair.target, pair.draft, sequences=16, length=2, prompt=[9])


def test_cached_schemes_are_stateful_standard_rounds():
    for name in ("cached", "recompute", "control:target-cache-not-rolled-back"):
        s = make_scheme(name, 3)
        assert isinstance(s.step, StatefulStep) and s.step.rule == "standard" and s.step.n == 7
