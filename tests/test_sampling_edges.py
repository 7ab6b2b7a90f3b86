"""Sampling at the float edges: a zero-probability token is never drawn, and the alias
tables and paired residuals realise exactly the law they stand for.

XLA's cumsum is a parallel prefix sum: the cumulative row can step down, or step up across
a zero weight, by an ulp. These tests hit those rows with many uniforms, including the
extremes 0 and 1 - 2**-24.
"""

import jax
import jax.numpy as jnp
import numpy as np

from specsample.models import tables as models
from specsample.schemes import base


def _rows(rng, v, n_rows):
    w = rng.dirichlet(np.full(v, 0.3), size=n_rows)
    w[rng.random(w.shape) < 0.4] = 0.0
    w[:, 0] = 0.0
    w[:, -1] = 0.0  # trailing zeros: the rounding fallback must not land there
    return (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


def test_sample_weights_never_draws_a_zero_weight(rng):
    for v in (64, 32768):
        w = jnp.asarray(_rows(rng, v, 4))
        u = jnp.concatenate([jnp.array([0.0, 1.0 - 2.0**-24], jnp.float32),
                             jax.random.uniform(jax.random.key(v), (4000,))])
        picks = jax.jit(jax.vmap(jax.vmap(base.sample_weights, (None, 0)), (0, None)))(w, u)
        chosen = np.take_along_axis(np.asarray(w), np.asarray(picks), axis=1)
        assert np.all(chosen > 0)


def test_alias_sampling_never_draws_a_zero(rng):
    for v in (64, 32768):
        m = models.TableModel(_rows(rng, v, 1).astype(np.float64), 0)
        m = models.TableModel(m.table / m.table.sum(), 0).with_sampler()
        u = jnp.concatenate([jnp.array([0.0, 1.0 - 2.0**-24], jnp.float32),
                             jax.random.uniform(jax.random.key(1), (20000,))])
        picks = np.asarray(jax.jit(jax.vmap(lambda ui: m.sample(jnp.zeros(0, jnp.int32), ui)))(u))
        assert np.all(np.asarray(m.table)[0, picks] > 0)


def _implied_law(thr, alias, v):
    """The law an alias row stands for: column c gives c with thr[c], alias[c] otherwise."""
    n = thr.shape[-1]
    law = np.zeros(n)
    np.add.at(law, np.arange(n), thr / n)
    np.add.at(law, alias, (1.0 - thr) / n)
    assert np.all(law[v:] == 0)  # padding columns are never drawn
    return law[:v]


def test_alias_tables_stand_for_their_rows(rng):
    for v in (2, 3, 8, 13, 64, 1000):
        w = rng.dirichlet(np.full(v, 0.3), size=3)
        w[:, 0] = 0.0  # a zero at the start, and some inside
        w[(rng.random(w.shape) < 0.4) & (w < w.max(axis=1, keepdims=True))] = 0.0
        w = w / w.sum(axis=1, keepdims=True)
        tab = models.AliasTable.build(w)
        assert tab.threshold.shape == (3, 1 << (v - 1).bit_length())
        for r in range(3):
            thr, alias = np.asarray(tab.threshold[r], np.float64), np.asarray(tab.alias[r])
            np.testing.assert_allclose(_implied_law(thr, alias, v), w[r], atol=1e-7)
            padded = np.concatenate([w[r], np.zeros(thr.size - v)])
            assert np.all(thr[padded == 0] == 0) and np.all(padded[alias[thr < 1]] > 0)


def test_alias_draws_on_the_whole_uniform_grid_realise_the_law():
    # every float32 uniform JAX can produce (multiples of 2^-23): the realised law is within
    # 2^-23 per column of the true one, the resolution of an inverse-CDF draw
    w = np.array([0.0, 0.5 - 1e-6, 1e-6, 0.25, 0.0, 0.125, 0.125])
    tab = models.AliasTable.build(w[None])
    u = jnp.arange(1 << 23, dtype=jnp.float32) * 2.0**-23
    picks = np.asarray(jax.jit(jax.vmap(lambda ui: tab.sample(0, ui)))(u))
    realised = np.bincount(picks, minlength=w.size) / u.size
    n = tab.threshold.shape[-1]
    assert np.all(realised[w == 0] == 0)
    assert np.max(np.abs(realised - w)) <= n * 2.0**-23


def test_paired_residuals_are_the_residuals_of_the_device_tables():
    target, draft = models.random_ngram(3, 3, 2), models.random_ngram(4, 3, 1)
    t, d = models.pair_for_device(target, draft)
    assert t.paired and d.paired and t.residuals.order == 2
    p32, q32 = (np.asarray(m.table, np.float64) for m in (t, d))
    for window in range(9):
        res = np.maximum(p32[window] - q32[window % 3], 0.0)
        thr = np.asarray(t.residuals.tables.threshold[window], np.float64)
        np.testing.assert_allclose(_implied_law(thr, np.asarray(t.residuals.tables.alias[window]), 3),
                                   res / res.sum(), atol=1e-7)
    # p == q: no residual mass; the row falls back to p (never drawn, but NaN-free)
    same, _ = models.pair_for_device(target, target)
    np.testing.assert_allclose(_implied_law(np.asarray(same.residuals.tables.threshold[5], np.float64),
                                            np.asarray(same.residuals.tables.alias[5]), 3),
                               np.asarray(same.table[5], np.float64), atol=1e-7)


def test_acceptance_thresholds_are_the_float32_test_to_the_bit(rng):
    """``u < t`` where the device computes ``u * q < p``: rounding is monotone in u, so the test is
    the same for every float32 u once it is at t's two sides (the largest u below t passes, t fails).
    Checked on the device's own arithmetic, with zeros, ties, p >> q, p << q and subnormal q and p
    (which count as zero: XLA on CPU flushes them, and the table follows it)."""
    p = rng.dirichlet(np.full(64, 0.3), size=40).astype(np.float32).ravel()
    q = rng.dirichlet(np.full(64, 0.3), size=40).astype(np.float32).ravel()
    p[:50], q[50:100] = 0.0, 0.0  # zeros of p (never accepted) and of q (always, where p > 0)
    q[100:200] = p[100:200]  # ties: accepted below u = 1 only
    q[200:300] = p[200:300] * np.float32(1e-30)  # subnormal q, a ratio beyond float32
    q[300:400] = np.nextafter(p[300:400], np.float32(1))  # p an ulp below q
    p[400:450] = p[400:450] * np.float32(1e-32)  # subnormal or tiny p
    t = models.acceptance_thresholds(p, q)
    assert t.dtype == np.float32
    assert np.all(t[:50] == 0) and np.all(np.isinf(t[50:100][p[50:100] > 0]))
    assert not np.any((t > 0) & (t < np.finfo(np.float32).tiny)), "no subnormal threshold"
    below = np.nextafter(t, np.float32(0))
    test = jax.jit(lambda u, q, p: u * q < p)
    if jax.default_backend() == "cpu":  # flushes subnormals, as the table does; elsewhere normal p and q only
        normal = np.ones(p.shape, bool)
    else:
        tiny = np.finfo(np.float32).tiny
        normal = ((p == 0) | (p >= tiny)) & ((q == 0) | (q >= tiny))
    finite = np.isfinite(t) & (t > 0) & normal
    assert np.all(np.asarray(test(below, q, p))[finite]), "the largest u below the threshold must pass"
    assert not np.any(np.asarray(test(t, q, p))[np.isfinite(t) & normal]), "the threshold itself must fail"
    for _ in range(20):  # and on the engine's uniform grid, k / 2^23
        u = (rng.integers(0, 2**23, p.shape) / 2.0**23).astype(np.float32)
        np.testing.assert_array_equal((u < t)[normal], np.asarray(test(u, q, p))[normal])


def test_a_paired_round_accepts_what_the_two_tables_accept():
    """The standard rule reads a paired pair's thresholds, one pair or a batch of pairs, with and without
    context: the same acceptances as ``u * q(x) < p(x)`` from the two models' rows, for every draft."""
    from specsample.models import pairs
    from specsample.schemes.standard import Verification, accept_ratio

    rng = np.random.default_rng(3)
    for pr in (pairs.ngram_pair(3, vocab=5, order=2), pairs.make_pair("dirichlet", 2, 64),
               pairs.make_pair("dirichlet", 2, 4)):
        t, d = models.pair_for_device(pr.target, pr.draft)
        assert t.residuals.thresholds is not None
        ctx = jnp.asarray(rng.integers(0, t.vocab_size, (4096, 2)), jnp.int32)
        drafts = jnp.asarray(rng.integers(0, t.vocab_size, (4096, 3)), jnp.int32)
        u = jnp.asarray((rng.integers(0, 2**23, (4096, 3)) / 2.0**23).astype(np.float32))

        def both(c, x, uu, tm=t, dm=d):
            v = Verification(tm, dm, c, x, uu, jnp.float32(0))
            return accept_ratio(v), v.u_accept * v.q_draft() < v.p_draft()

        fast, slow = jax.jit(jax.vmap(both))(ctx, drafts, u)
        assert np.array_equal(fast, slow) and 0 < np.mean(fast) < 1
        if pr.target.order == 0:  # a batch of pairs: each lane reads its own pair's rows
            tb, db = (models.TableModel(np.stack([np.asarray(m.table)] * 2 + [np.asarray(o.table)]), 0)
                      for m, o in ((pr.target, pr.draft), (pr.draft, pr.target)))
            ft, fd = (m.flat_pairs() for m in models.pair_for_device(tb, db))
            which = jnp.asarray(rng.integers(0, 3, 4096), jnp.int32)
            fast, slow = jax.jit(jax.vmap(lambda c, x, uu, w: both(c, x, uu, ft.at_pair(w), fd.at_pair(w))))(
                ctx, drafts, u, which)
            assert np.array_equal(fast, slow)


def test_last_token_takes_the_fast_path_only_for_the_engines_pair():
    from specsample.schemes.standard import Verification, residual_at

    target, draft = models.random_ngram(5, 4, 1), models.random_ngram(6, 4, 1)
    t, d = models.pair_for_device(target, draft)
    other = models.random_ngram(7, 4, 1).with_sampler()  # e.g. a draft a scheme built for itself
    ctx, drafts = jnp.array([2], jnp.int32), jnp.array([1, 3], jnp.int32)
    u = jax.random.uniform(jax.random.key(0), (50000,))

    def law(tm, dm, j):
        def one(ui):
            return Verification(tm, dm, ctx, drafts, jnp.zeros(2), ui).last_token(j, ui)
        return np.bincount(np.asarray(jax.jit(jax.vmap(one))(u)), minlength=4) / u.size

    for j in (0, 1, 2):  # two rejection positions and the bonus
        v = Verification(t, other, ctx, drafts, jnp.zeros(2), jnp.float32(0))
        want = np.asarray(residual_at(v, j), np.float64)
        np.testing.assert_allclose(law(t, other, j), want / want.sum(), atol=0.01)  # generic path: other draft
        v = Verification(t, d, ctx, drafts, jnp.zeros(2), jnp.float32(0))
        want = np.asarray(residual_at(v, j), np.float64)
        np.testing.assert_allclose(law(t, d, j), want / want.sum(), atol=0.01)  # fast path: its own draft


def test_alias_tables_built_row_by_row_and_all_rows_at_once_are_identical():
    """Vose's construction steps every row together from 8 rows on; the tables (hence the counts) are
    those of the row-by-row loop, bit for bit, with zeros, ties, float32-rounded and uniform rows."""
    from specsample.models.tables import _vose, _vose_lockstep

    rng = np.random.default_rng(0)
    for trial in range(60):
        rows, v = int(rng.integers(1, 30)), int(rng.integers(2, 70))
        n = 1 << (v - 1).bit_length()
        w = rng.dirichlet(np.full(v, [0.1, 1.0, 10.0][trial % 3]), size=rows)
        if trial % 4 == 0:
            w[rng.random(w.shape) < 0.4] = 0.0
            w[:, 0] += 1e-3
        if trial % 5 == 0:
            w = w.astype(np.float32).astype(np.float64)
        if trial % 7 == 0:
            w[:] = 1.0
        thr, ali = _vose_lockstep(w, n)
        for r in range(rows):
            t1, a1 = _vose(w[r], n)
            assert np.array_equal(t1, thr[r]) and np.array_equal(a1, ali[r]), (trial, r)


def test_the_last_token_s_table_holds_the_target_s_own_rows_after_the_residuals():
    """``pair_for_device`` puts the target's rows after the residuals, so a round's last token is one alias
    draw: those rows must be the target's own sampler tables, bit for bit (then the bonus token is the
    draw it was; the pinned stream in test_engine holds the counts), for one pair and a batch of pairs."""
    from specsample.models import pairs

    for pr in (pairs.ngram_pair(3, vocab=5, order=2), pairs.make_pair("dirichlet", 2, 6)):
        t, _ = models.pair_for_device(pr.target, pr.draft)
        res = t.residuals
        rows = t.vocab_size**res.order  # the residual rows; the target's follow
        assert res.tables.threshold.shape[-2] == rows + t.vocab_size**t.order
        assert np.array_equal(res.tables.threshold[..., rows:, :], t.sampler.threshold)
        assert np.array_equal(res.tables.alias[..., rows:, :], t.sampler.alias)


def test_the_device_s_packed_tables_draw_what_the_float_tables_draw_on_the_uniform_grid(rng):
    """The device samples from :class:`PackedAlias` words (one gather); on the engine's 2^-23 grid each draw is
    the float :class:`AliasTable`'s. Checked where it could differ, at every column's keep boundary (the
    grid points just below and at it), and at random grid points, for n = 2 to 4096 columns."""
    for v in (2, 5, 64, 1000, 4096):
        w = _rows(rng, v, 6) if v > 4 else rng.dirichlet(np.ones(v), 6).astype(np.float32)
        fl, pk = models.AliasTable.build(w), models.PackedAlias.build(w)
        n = fl.threshold.shape[-1]
        s = models.UNIFORM_BITS - (n.bit_length() - 1)
        keep = np.ceil(np.asarray(fl.threshold, np.float64) * 2.0**s).astype(np.int64)  # [rows, n]
        col = np.arange(n)
        j = np.concatenate([col * 2**s + np.clip(keep + d, 0, 2**s - 1) for d in (-1, 0)], axis=1)
        j = np.concatenate([j, rng.integers(0, 2**23, (6, 512))], axis=1)
        rows = jnp.asarray(np.repeat(np.arange(6), j.shape[1]))
        u = jnp.asarray(j.reshape(-1) * 2.0**-23, jnp.float32)
        both = jax.jit(lambda rows, u: (fl.sample(rows, u), pk.sample(rows, u)))  # one program, not op by op
        a, b = both(rows, u)
        assert np.array_equal(np.asarray(a), np.asarray(b)), v
        np.testing.assert_array_equal(pk.alias, fl.alias)


def test_pair_for_device_samples_with_packed_tables():
    """Both models' samplers and the residuals: every alias draw of the engine is a one-gather draw."""
    from specsample.models import pairs

    pr = pairs.ngram_pair(3, vocab=5, order=2)
    t, d = models.pair_for_device(pr.target, pr.draft)
    assert all(isinstance(x, models.PackedAlias) for x in (t.sampler, d.sampler, t.residuals.tables))


def _sequential_draw(w, u):
    """The inverse-CDF draw in float64 with a sequential sum; also how far t is from the nearest step."""
    cdf = np.cumsum(np.asarray(w, np.float64))
    t = float(u) * cdf[-1]
    return int(np.argmax((cdf > t) & (w > 0))), float(np.min(np.abs(cdf - t)) / cdf[-1])


def test_blocked_draws_are_the_inverse_cdf_draws(rng):
    """Rows longer than CUMSUM_MAX_VOCAB are drawn by blocks: the token of the sequential float64
    inverse CDF wherever u * total is not within rounding of a step, at every block boundary and with
    a row that does not fill its last block."""
    for v in (models.CUMSUM_MAX_VOCAB + 1, 5000, 32768):
        assert v > models.CUMSUM_MAX_VOCAB
        w = _rows(rng, v, 3)
        w[1, : v - 300] = 0.0  # mass only in the last blocks, the last one padded
        w[2, 1 : v - 1] = 0.0  # two tokens, the first and the last
        w[2, 0] = w[2, -1] = 0.5
        u = jnp.concatenate([jnp.array([0.0, 0.5, 1.0 - 2.0**-24], jnp.float32),
                             jax.random.uniform(jax.random.key(v), (2000,))])
        picks = np.asarray(jax.jit(jax.vmap(jax.vmap(models.draw_weights, (None, 0)), (0, None)))(w, u))
        compared = 0
        for r in range(3):
            for j in range(u.shape[0]):
                want, gap = _sequential_draw(w[r], u[j])
                assert w[r, picks[r, j]] > 0
                if gap > 1e-5:  # clear of a step: float32 rounding cannot move the draw
                    assert picks[r, j] == want, (v, r, float(u[j]))
                    compared += 1
        assert compared > 5000
        assert picks[2, 1] == v - 1  # u = 1/2 is the first token's cumulative: the next positive one


def test_blocked_draws_of_an_all_zero_row_give_the_last_token():
    for v in (64, 5000):  # as the one-sum draw does
        assert int(models.draw_weights(jnp.zeros(v), jnp.float32(0.3))) == v - 1
