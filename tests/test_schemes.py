"""The scheme interface, the registry and loader, and the standard round's edge cases."""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsample.models import tables as models, pairs
from specsample import schemes
from specsample.schemes import base


def _dev(m):
    return models.TableModel(jnp.asarray(m.table, jnp.float32), m.order)


def test_sample_weights_never_picks_zero_weight():
    w = jnp.array([0.0, 0.3, 0.0, 0.0, 0.7, 0.0])
    us = jnp.concatenate([jnp.array([0.0, 1.0 - 2.0**-24, 0.3, 0.29999998]), jnp.linspace(0, 1, 1001)[:-1]])
    picks = np.asarray(jax.vmap(lambda u: base.sample_weights(w, u))(us))
    assert set(picks.tolist()) <= {1, 4}
    assert picks[0] == 1 and picks[1] == 4


def test_residual_is_nan_free_when_p_equals_q():
    p = jnp.array([0.25, 0.75])
    r = base.residual(p, p)
    assert not np.any(np.isnan(np.asarray(r))) and float(r.sum()) > 0


def test_q_equals_p_accepts_everything():
    pr = pairs.make_pair("identical", 0)
    s = schemes.standard(4)
    keys = jax.random.split(jax.random.key(0), 5000)
    out = jax.jit(jax.vmap(s.step, (0, None, None, None)))(keys, _dev(pr.target), _dev(pr.draft),
                                                           jnp.zeros(0, jnp.int32))
    assert np.all(np.asarray(out.n_accepted) == 4) and np.all(np.asarray(out.n_emitted) == 5)
    assert np.all(np.asarray(out.draft_accepted))


def test_eager_and_jitted_rounds_agree():
    pr = pairs.ngram_pair(0, vocab=4, order=2)
    s = schemes.standard(3)
    ctx = jnp.array([1, 2], jnp.int32)
    for i in range(20):
        key = jax.random.key(i)
        eager = s.step(key, _dev(pr.target), _dev(pr.draft), ctx)
        jitted = jax.jit(s.step)(key, _dev(pr.target), _dev(pr.draft), ctx)
        for a, b in zip(eager, jitted):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_registry_and_unknown_name():
    assert "standard" in schemes.SCHEMES
    assert all(n.startswith("control:") for n in schemes.CONTROLS)
    assert not set(schemes.SCHEMES) & set(schemes.CONTROLS)
    with pytest.raises(schemes.SchemeLoadError, match="valid schemes: standard"):
        schemes.get_factory("no-such-scheme")


def test_load_from_module_and_file(tmp_path):
    f = schemes.get_factory("specsample.schemes.standard:standard")
    assert f(2).k == 2
    path = tmp_path / "mine.py"
    path.write_text(textwrap.dedent("""
        from specsample.schemes import standard
        def my_scheme(k=4):
            return standard(k)._replace(name="mine")
    """))
    s = schemes.make_scheme(f"{path}:my_scheme", 3)
    assert s.name == "mine" and s.k == 3
    with pytest.raises(schemes.SchemeLoadError, match="has no attribute"):
        schemes.get_factory(f"{path}:missing")
    with pytest.raises(schemes.SchemeLoadError, match="does not exist"):
        schemes.get_factory("/nowhere/x.py:f")
    bad = tmp_path / "broken.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(schemes.SchemeLoadError, match="boom"):
        schemes.get_factory(f"{bad}:f")


def test_k_must_be_positive():
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        schemes.make_scheme("standard", 0)


TABLE_SCHEMES = [n for n, f in schemes.registered().items() if not isinstance(f(3).step, base.StatefulStep)]


@pytest.mark.parametrize("name", TABLE_SCHEMES)
def test_every_builtin_step_is_a_round_of_its_uniforms(name):
    # the engine's fast path draws the uniforms itself; it must be the same rule as step(key)
    s = schemes.registered()[name](3)
    assert isinstance(s.step, base.UniformStep)
    pr = pairs.ngram_pair(1, vocab=4, order=2)
    t, d = models.pair_for_device(pr.target, pr.draft)
    ctx = jnp.array([3, 1], jnp.int32)
    # jitted, as the engine runs them, and both in one program over 5 keys: not every primitive compiled
    # eagerly (a tree's round is hundreds of them: 8-11 s a scheme), nor two programs a scheme

    @jax.jit
    def both(keys):
        def one(key):
            return s.step(key, t, d, ctx), s.step.round(jax.random.uniform(key, (s.step.n,)), t, d, ctx)
        return jax.vmap(one)(keys)

    by_key, by_u = both(jax.random.split(jax.random.key(0), 5))
    for a, b in zip(by_key, by_u):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_plain_step_replacing_a_uniform_step_is_what_runs():
    # _replace(step=...) must not leave the old round behind: the engine runs the new step
    from specsample.engine import lanes as engine

    pr = pairs.make_pair("dirichlet", 0, 8)
    s = schemes.standard(2)

    def constant(key, target, draft, context):
        out = s.step(key, target, draft, context)
        return out._replace(tokens=jnp.full_like(out.tokens, 3))

    c = engine.run(s._replace(name="constant", step=constant), pr.target, pr.draft, sequences=2048, length=2,
                   lanes=256, per_lane=8)
    assert c.position[0, :, 3].sum() == c.position[0].sum()


def test_kseq_rho_is_exact_against_the_float64_bisection():
    """The K-SEQ parameter from the sorted-ratio pieces equals the oracle's 100-step bisection."""
    from specsample.laws.exact import _kseq_rho
    from specsample.schemes.multidraft import _kseq_excess, kseq_rho

    rng = np.random.default_rng(11)
    fns = {n: jax.jit(lambda p, q, m, n=n: kseq_rho(p, q, m, max_m=n)) for n in (2, 3)}
    for i in range(300):
        v, m = (2, 5, 11)[i % 3], int(rng.integers(1, 4))  # three shapes: few compiles
        p, q = (rng.dirichlet(np.full(v, rng.choice([0.2, 1.0, 5.0]))) for _ in range(2))
        if i % 3 == 0:  # zeros in p, in q, one-hot q
            p[rng.random(v) < 0.3] = 0.0
            q[rng.random(v) < 0.3] = 0.0
            p, q = (x / x.sum() if x.sum() > 0 else np.eye(v)[0] for x in (p, q))
        p32, q32 = jnp.float32(p), jnp.float32(q)
        got = float(fns[max(2, m)](p32, q32, jnp.int32(m)))
        assert 1.0 <= got <= max(m, 1)
        assert float(jnp.min(_kseq_excess(p32, q32, got, jnp.float32(m), 3))) >= -1e-6  # feasible
        ref = _kseq_rho(np.float64(p32), np.float64(q32), m)
        # the float32 tolerance of -1e-6 can make rho = 1 feasible where float64 needs more
        if np.min(np.asarray(_kseq_excess(p32, q32, 1.0, jnp.float32(m), 3))) < -1e-5 or ref == 1.0:
            assert got == pytest.approx(ref, abs=2e-5)


def test_fenced_is_its_function_to_the_bit_and_stays_a_loop():
    """``base.fenced`` computes ``fn()`` exactly, jitted and vmapped (anchor shared or per lane), and XLA
    keeps its loop: were the fence simplified away, the tree walk would be fused into every output again."""
    table = jnp.asarray(np.random.default_rng(0).dirichlet(np.ones(8), 4), jnp.float32)

    def walk(x, anchor):
        return base.fenced(lambda: (jnp.cumsum(x) * 3.0, (x > 0.1).sum()), anchor)

    x = jnp.asarray(np.random.default_rng(1).random((6, 8)), jnp.float32)
    want = [(jnp.cumsum(r) * 3.0, (r > 0.1).sum()) for r in x]
    shared = jax.jit(jax.vmap(walk, in_axes=(0, None)))(x, table)
    per_lane = jax.jit(jax.vmap(walk))(x, jnp.broadcast_to(table, (6,) + table.shape))
    for got in (shared, per_lane):
        for i, (a, b) in enumerate(want):
            np.testing.assert_array_equal(np.asarray(got[0][i]), np.asarray(a))
            assert int(got[1][i]) == int(b)
    hlo = jax.jit(jax.vmap(walk, in_axes=(0, None))).lower(x, table).compile().as_text()
    assert " while(" in hlo, "XLA removed the fence's loop"


@pytest.mark.parametrize("order", [1, 2])
def test_a_draft_with_context_drafts_the_chain_it_would_written_out(order):
    # draft_tokens draws a context draft's chain in a lax.scan; each token must be the one the
    # written-out chain draws (window = the last `order` tokens, drafts included), lane by lane
    draft = pairs.ngram_pair(3, vocab=4, order=order).draft.with_sampler()
    k, lanes = 5, 64
    u = jax.random.uniform(jax.random.key(1), (lanes, k))
    ctx = jax.random.randint(jax.random.key(2), (lanes, 3), 0, 4)

    def written_out(u, context):
        tokens = list(context)
        for i in range(k):
            tokens.append(draft.sample(jnp.stack(tokens[-order:]), u[i]))
        return jnp.stack(tokens[-k:])

    got = jax.jit(jax.vmap(lambda u, c: base.draft_tokens(u, draft, c, k)))(u, ctx)
    np.testing.assert_array_equal(got, jax.vmap(written_out)(u, ctx))


@pytest.mark.parametrize("size", [1, 2, 8, 16, 32])
def test_take_reads_a_table_as_a_gather_would(size):
    # tables of at most SELECT_MAX entries are read by selects: the same values as jnp's gather, for
    # every index (negative ones count from the end, the rest are clamped), jitted and vmapped
    rows = 2 if size % 2 == 0 else 1
    table = jnp.asarray(np.random.default_rng(size).random((rows, size // rows)), jnp.float32)
    flat = np.arange(-size - 3, size + 4)
    row, col = flat // table.shape[1], flat % table.shape[1]
    want = np.asarray(table.reshape(-1)[jnp.asarray(row * table.shape[1] + col)])
    got = jax.jit(jax.vmap(models.take, in_axes=(None, 0, 0)))(table, jnp.asarray(row), jnp.asarray(col))
    np.testing.assert_array_equal(np.asarray(got), want)
    hlo = jax.jit(jax.vmap(models.take, in_axes=(None, 0, 0))).lower(table, row, col).as_text()
    assert ("gather" in hlo) == (size > models.SELECT_MAX)


def test_leading_true_counts_the_accepted_prefix():
    # every mask of up to 8 entries, one per lane, and a mask past the running AND's 64 entries
    for n in range(0, 9):
        masks = (np.arange(2**n)[:, None] >> np.arange(n)[::-1] & 1).astype(bool)
        want = [next((i for i, m in enumerate(row) if not m), n) for row in masks]
        got = jax.jit(jax.vmap(base.leading_true))(jnp.asarray(masks))
        np.testing.assert_array_equal(np.asarray(got), want)
    long = np.ones((3, 70), bool)
    long[0, 5] = long[1, 69] = False
    np.testing.assert_array_equal(np.asarray(jax.vmap(base.leading_true)(jnp.asarray(long))), [5, 69, 70])


def _batched_loops(jaxpr) -> int:
    """While loops in ``jaxpr`` (nested ones too) whose condition ``vmap`` batched: a predicate per lane
    (reduced, and every carry selected, when lowered) where an unbatched loop tests one scalar."""
    from jax.extend.core import jaxprs_in_params

    n = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            n += eqn.params["cond_jaxpr"].jaxpr.outvars[0].aval.ndim > 0
        for sub in jaxprs_in_params(eqn.params):
            n += _batched_loops(sub)
    return n


def test_leading_true_with_an_anchor_runs_its_fence_once_for_every_lane():
    # the same counts with a shared anchor, and the fence's loop no longer batched per lane; without the
    # anchor it is (so this check can fire), and the standard and greedy rounds pass one (their speed)
    masks = jnp.asarray(np.random.default_rng(3).random((64, 4)) < 0.7)
    table = jnp.ones((2, 8), jnp.float32)
    want = jax.vmap(base.leading_true)(masks)
    np.testing.assert_array_equal(np.asarray(jax.vmap(lambda m: base.leading_true(m, table))(masks)), np.asarray(want))
    assert _batched_loops(jax.make_jaxpr(jax.vmap(base.leading_true))(masks).jaxpr) == 1
    assert _batched_loops(jax.make_jaxpr(jax.vmap(lambda m: base.leading_true(m, table)))(masks).jaxpr) == 0
    pair = pairs.make_pair("dirichlet", 0, 8)
    tgt, drf = models.pair_for_device(pair.target, pair.draft)
    u = jax.random.uniform(jax.random.key(0), (64, 9))
    for name in ("standard", "greedy"):
        step = schemes.make_scheme(name, 4).step.round
        jaxpr = jax.make_jaxpr(jax.vmap(lambda x: step(x, tgt, drf, jnp.zeros(0, jnp.int32))))(u).jaxpr
        assert _batched_loops(jaxpr) == 0, name


@pytest.mark.parametrize("order", [0, 1, 2, 3])
def test_draft_probabilities_window_by_window_are_those_of_the_whole_token_array(order):
    # Verification reads p_i(x_i) and q_i(x_i) of a draft with context window by window (static picks
    # of the context and the drafts): the same numbers as prob_of over the concatenated tokens
    from specsample.schemes.standard import Verification

    pair = pairs.ngram_pair(2, vocab=4, order=order) if order else pairs.make_pair("dirichlet", 2, 4)
    t, d = models.pair_for_device(pair.target, pair.draft)
    k, lanes = 5, 32
    ctx = jax.random.randint(jax.random.key(3), (lanes, 3), 0, 4)
    drafts = jax.random.randint(jax.random.key(4), (lanes, k), 0, 4)

    def both(c, x):
        v = Verification(t, d, c, x, jnp.zeros(k), jnp.zeros(()))
        whole = [m.prob_of(v.windows(m, k), x) for m in (t, d)]
        return (v.p_draft(), v.q_draft()), tuple(whole)

    got, want = jax.jit(jax.vmap(both))(ctx, drafts)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
