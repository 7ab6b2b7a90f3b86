"""Models (teacher forcing, exact laws, warping) and pair families."""

import itertools

import numpy as np
import pytest

from specsample.models import tables as models, pairs


def test_probs_teacher_forcing_rows():
    m = models.random_ngram(0, vocab=3, order=2)
    toks = np.array([0, 0, 2, 1, 1])
    rows = m.probs_np(toks)
    assert rows.shape == (4, 3)  # order + T tokens -> T + 1 rows
    for t in range(4):
        np.testing.assert_allclose(rows[t], m.table[toks[t] * 3 + toks[t + 1]])
    np.testing.assert_allclose(np.asarray(m.probs(toks)), rows, rtol=1e-6)


def test_context_free_rows_repeat():
    m = models.context_free([0.2, 0.3, 0.5])
    assert m.probs_np(np.array([1, 2])).shape == (3, 3)


def test_exact_joint_by_brute_force():
    m = models.random_ngram(1, vocab=3, order=2)
    joint = models.exact_joint(m, 3)
    assert joint.sum() == pytest.approx(1.0)
    for seq in itertools.product(range(3), repeat=3):
        toks = np.concatenate([models.initial_context(2), seq])
        pr = np.prod([m.probs_np(toks[i : i + 2])[0][seq[i]] for i in range(3)])
        assert joint[seq] == pytest.approx(pr)
    marg = models.exact_marginals(m, 3)
    np.testing.assert_allclose(marg[2], joint.sum(axis=(0, 1)))


def test_lift_keeps_the_law():
    m = models.random_ngram(2, vocab=3, order=1)
    np.testing.assert_allclose(models.exact_joint(models.lift(m, 2), 4), models.exact_joint(m, 4))


def test_warping():
    p = np.array([0.4, 0.3, 0.2, 0.1, 0.0])
    assert np.count_nonzero(models.warp_probs(p, top_k=2)) == 2
    np.testing.assert_allclose(models.warp_probs(p, top_p=0.65), [0.4 / 0.7, 0.3 / 0.7, 0, 0, 0])
    hot = models.warp_probs(p, temperature=0.5)
    np.testing.assert_allclose(hot[:4], p[:4] ** 2 / np.sum(p[:4] ** 2))
    assert hot[4] == 0.0
    warped = models.warp(models.random_ngram(0, 4, 1), top_k=1)
    assert np.all(np.count_nonzero(warped.table, axis=1) == 1)
    with pytest.raises(ValueError, match="temperature"):
        models.warp_probs(p, temperature=0)


@pytest.mark.parametrize("table,msg", [
    ([0.5, 0.6], "not normalised"),
    ([1.2, -0.2], "negative"),
    ([np.nan, 1.0], "NaN"),
    ([1.0], "at least 2 tokens"),
])
def test_model_validation(table, msg):
    with pytest.raises(ValueError, match=msg):
        models.context_free(table)


def test_ngram_shape_check():
    with pytest.raises(ValueError, match="must have shape"):
        models.ngram(np.full((3, 4), 0.25), order=1)


@pytest.mark.parametrize("family", list(pairs.FAMILIES))
def test_families_valid_and_reproducible(family):
    a = pairs.make_pair(family, 7, vocab=None if family != "large-vocab" else 32768)
    b = pairs.make_pair(family, 7, vocab=None if family != "large-vocab" else 32768)
    np.testing.assert_array_equal(a.target.table, b.target.table)
    for m in (a.target, a.draft):
        assert np.all(m.table >= 0) and np.allclose(m.table.sum(-1), 1)


def test_families_cover_their_regimes():
    fam = {n: pairs.make_pair(n, 3) for n in pairs.FAMILIES if n != "large-vocab"}
    p, q = (lambda pr: (pr.target.table[0], pr.draft.table[0]))(fam["identical"])
    np.testing.assert_array_equal(p, q)
    p, q = fam["rare-accept"].target.table[0], fam["rare-accept"].draft.table[0]
    assert np.any((p < 1e-3) & (q > 0.1))
    p, q = fam["mostly-below"].target.table[0], fam["mostly-below"].draft.table[0]
    assert np.mean(p >= q) >= 0.7
    p, q = fam["disjoint"].target.table[0], fam["disjoint"].draft.table[0]
    assert np.all(np.minimum(p, q) == 0)
    assert np.any(fam["zeros-in-p"].target.table == 0) and np.any(fam["zeros-in-q"].draft.table == 0)
    assert np.max(fam["one-hot-p"].target.table) == 1.0
    assert np.any(np.isclose(fam["tiny"].target.table, 1e-30, rtol=0.5))
    assert pairs.make_pair("large-vocab", 0).target.vocab_size >= 32768


def test_unknown_family_lists_valid_ones():
    with pytest.raises(ValueError, match="valid families: dirichlet-peaked"):
        pairs.make_pair("nope", 0)


def test_the_draws_realise_their_table_to_within_the_float32_floor():
    # the alias draws' exact law over every float32 uniform: within n 2^-24 of the row (the floor any
    # sampler fed float32 uniforms has); at V = 32,768, with the keep counts compensated along the alias
    # forest, about V 2^-26 (each token within half a uniform), as docs/protocol.md says
    from specsample.models.tables import PackedAlias, draw_resolution_tv

    rng = np.random.default_rng(0)
    for vocab in (8, 1024, 32768):
        p = rng.dirichlet(np.ones(vocab)).astype(np.float32).astype(np.float64)
        law = PackedAlias.build(p[None]).law(vocab)[0]
        tv = 0.5 * np.abs(law - p / p.sum()).sum()
        assert law.sum() == pytest.approx(1.0, abs=1e-12)
        assert tv <= draw_resolution_tv(vocab) + 1e-7, (vocab, tv)
    assert 3e-4 < tv < 6e-4
