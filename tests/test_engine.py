"""The counting engine: reproducibility, exactness against enumeration and the numpy
reference (both sides: a correct sampler passes, a broken one is rejected), support,
and input validation."""

import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import stats
from specsample.engine import lanes as engine
from specsample.models import tables as models, pairs
from specsample import schemes
from specsample.laws.reference import reference_sequences

SMALL = dict(lanes=256, per_lane=8)


def _run(scheme, pair, **kw):
    opts = {**SMALL, "sequences": 20000, "length": 3, "seed": 0, **kw}
    return engine.run(scheme, pair.target, pair.draft, **opts)


def test_same_seed_same_counts_whatever_the_chunk():
    pr = pairs.ngram_pair(1, vocab=4, order=2)
    s = schemes.standard(3)
    a = _run(s, pr, sequences=40000, blocks_per_call=1)
    b = _run(s, pr, sequences=40000, blocks_per_call=7)
    c = _run(s, pr, sequences=40000, seed=1)
    for x, y in zip(a, b):
        if x is not None:
            np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.joint, c.joint)


def test_host_totals_are_int64():
    c = _run(schemes.standard(2), pairs.make_pair("dirichlet", 0))
    assert c.position.dtype == np.int64 and c.rounds.dtype == np.int64


def test_counts_are_consistent():
    pr = pairs.make_pair("dirichlet", 3)
    k, L = 4, 6
    c = _run(schemes.standard(k), pr, length=L).pair(0)
    assert c.accepted.sum() == c.rounds == c.emitted.sum()
    assert c.rounds_per_sequence.sum() == c.sequences
    assert np.all(c.position.sum(axis=1) == c.sequences)
    assert c.draft_accepted.sum() == (c.accepted * np.arange(k + 1)).sum()


@pytest.mark.parametrize("family", ["zeros-in-p", "zeros-in-q", "one-hot-p", "tiny", "disjoint", "warp-top-k"])
def test_zero_probability_tokens_never_emitted(family):
    pr = pairs.make_pair(family, 11)
    c = _run(schemes.standard(4), pr, sequences=1 << 19, length=6, lanes=1024, per_lane=64).pair(0)
    p = pr.target.table[0]
    assert c.position[:, p == 0].sum() == 0
    assert c.invalid == 0


def test_a_malformed_round_is_counted_invalid_and_its_histograms_stay_exact():
    # every round emits one token id out of range and claims k + 3 accepted drafts: each round counts
    # once in emitted and once as invalid, never in accepted; a sequence of L = 2 takes two rounds
    import jax.numpy as jnp

    k, v = 2, 4

    def broken(u, target, draft, context):
        return schemes.RoundOutput(tokens=jnp.full(k + 1, v, jnp.int32), n_emitted=jnp.int32(1),
                                   n_accepted=jnp.int32(k + 3), drafts=jnp.zeros(k, jnp.int32),
                                   draft_tested=jnp.zeros(k, bool), draft_accepted=jnp.zeros(k, bool))

    scheme = schemes.Scheme("malformed", k, k + 1, schemes.UniformStep(broken, 2 * k + 1))
    c = _run(scheme, pairs.make_pair("dirichlet", 0, v), sequences=2048, length=2).pair(0)
    assert c.sequences == 2048 and c.rounds == c.invalid == 2 * 2048
    assert c.accepted.sum() == 0 and c.emitted[1] == c.rounds == c.emitted.sum()
    assert c.rounds_per_sequence[2] == 2048 == c.rounds_per_sequence.sum()
    assert c.drafted.sum() == 0


def test_q_equals_p_in_the_engine():
    c = _run(schemes.standard(4), pairs.make_pair("identical", 0), length=6).pair(0)
    assert c.accepted[:-1].sum() == 0 and c.emitted[5] == c.rounds
    assert np.all(c.drafted == c.draft_accepted)


def _joint_test(scheme, pr, n, length):
    c = engine.run(scheme, pr.target, pr.draft, sequences=n, length=length, seed=5, lanes=1024, per_lane=16)
    return stats.goodness_of_fit(c.pair(0).joint, models.exact_joint(pr.target, length).ravel())


def test_joint_matches_exact_ngram_joint_and_a_bug_is_rejected():
    """First-L joint of the standard scheme vs p's exact joint on a 2-gram model.

    Sample size from the power calculation: 81 cells (dof 80), alpha = 0.01, power 0.99
    and a minimum detectable TV of 0.01 need N = samples_for_tv(0.01, 80).n (~1.8e5).
    The off-by-one control (only visible on n-gram models) must be rejected at that N.
    """
    pr = pairs.ngram_pair(4, vocab=3, order=2)
    n = stats.samples_for_tv(0.01, dof=80, alpha=0.01, power=0.99).n
    good = _joint_test(schemes.standard(2), pr, n, 4)
    assert good.pvalue > 0.01 and good.cells == 81
    bad = _joint_test(schemes.CONTROLS["control:off-by-one"](2), pr, n, 4)
    assert bad.pvalue < 1e-6


def test_engine_agrees_with_numpy_reference_in_distribution():
    """Two-sample test of first-3-token joints: JAX engine vs the float64 numpy loop."""
    pr = pairs.ngram_pair(2, vocab=3, order=1)
    ref = reference_sequences(pr.target, pr.draft, k=2, length=3, n=15000, seed=1)
    ref_counts = np.bincount(ref @ np.array([9, 3, 1]), minlength=27)
    eng = engine.run(schemes.standard(2), pr.target, pr.draft, sequences=100000, length=3, **SMALL).pair(0).joint
    assert stats.homogeneity_test(ref_counts, eng).pvalue > 0.001
    bug = engine.run(schemes.CONTROLS["control:resample-from-p"](2), pr.target, pr.draft, sequences=100000,
                     length=3, **SMALL).pair(0).joint
    assert stats.homogeneity_test(ref_counts, bug).pvalue < 1e-6


def test_batch_of_pairs_in_one_call():
    pr = pairs.make_pairs("dirichlet", 0, n_pairs=5)
    c = engine.run(schemes.standard(2), pr.target, pr.draft, sequences=5000, length=2, **SMALL)
    assert c.joint.shape == (5, 64)
    for i in range(5):
        r = stats.goodness_of_fit(c.pair(i).joint, models.exact_joint(models.TableModel(pr.target.table[i], 0),
                                                                       2).ravel())
        assert r.pvalue > 1e-4


def test_each_pair_of_a_batch_reads_only_its_own_tables():
    # lanes of all pairs run as one batch over the pairs' tables laid end to end: swapping
    # the middle pair for another must leave the counts of the other two untouched
    a = pairs.ngram_pair(1, vocab=4, order=2)
    b = pairs.ngram_pair(2, vocab=4, order=2)
    c = pairs.ngram_pair(3, vocab=4, order=2)

    def batch(*prs):
        t = models.TableModel(np.stack([p.target.table for p in prs]), a.target.order)
        d = models.TableModel(np.stack([p.draft.table for p in prs]), a.draft.order)
        return engine.run(schemes.standard(3), t, d, sequences=4096, length=4, seed=2, joint=False, **SMALL)

    x, y = batch(a, b, a), batch(a, c, a)
    for f, g in zip(x, y):
        if f is not None:
            np.testing.assert_array_equal(f[[0, 2]], g[[0, 2]])
    assert not np.array_equal(x.transitions[1], y.transitions[1])


@pytest.mark.parametrize("name", ["standard", "tree", "multidraft"])
def test_a_pair_alone_counts_as_it_does_first_in_a_batch(name):
    # a run of one pair reads its tables without a per-lane pair offset (the engine's fast path);
    # a batch reads every pair's rows through that offset: pair 0 must count the same either way
    a, b = pairs.ngram_pair(1, vocab=4, order=2), pairs.ngram_pair(2, vocab=4, order=2)
    scheme = schemes.make_scheme(name, 2)
    t = models.TableModel(np.stack([a.target.table, b.target.table]), a.target.order)
    d = models.TableModel(np.stack([a.draft.table, b.draft.table]), a.draft.order)
    kw = dict(sequences=2048, length=4, seed=3, joint=False, **SMALL)
    alone, first = engine.run(scheme, a.target, a.draft, **kw), engine.run(scheme, t, d, **kw).pair(0)
    for f, g in zip(alone, first):
        if f is not None:
            np.testing.assert_array_equal(np.asarray(f).reshape(np.shape(g)), g)


@pytest.mark.parametrize("pair, name, k", [("order-1", "standard", 3), ("order-3", "standard", 2),
                                          ("dirichlet", "standard", 4), ("dirichlet", "standard", 3),
                                          ("dirichlet", "tree", 2), ("dirichlet", "multidraft", 3)])
def test_cells_that_count_more_in_one_update_give_the_counts_of_one_update_each(pair, name, k, monkeypatch):
    # where the cells are few, one scatter update counts a token with its n-gram window
    # (cells.by_position_and_context), two tokens or two drafts of a round (cells.token_shape,
    # cells.paired_drafts), a round's outcome with its sequence's end (cells.merged_ending): every
    # total must be that of one update each (odd and even slots)
    from specsample.engine import cells

    pr = (pairs.make_pair("dirichlet", 1, 8) if pair == "dirichlet"
          else pairs.ngram_pair(1, vocab=4, order=int(pair[-1])))
    kw = dict(sequences=2048, length=5, seed=3, joint=False, **SMALL)
    scheme = schemes.make_scheme(name, k)
    spec = engine._prepare(scheme, pr.target, pr.draft, prng="threefry2x32", blocks_per_call=None, devices=None,
                           **{a: kw[a] for a in ("sequences", "length", "seed", "lanes", "per_lane", "joint")}).spec
    assert cells.by_position_and_context(spec) or cells.token_shape(spec)[-1] > 1
    assert cells.paired_drafts(spec) and cells.merged_ending(spec)
    merged = engine.run(scheme, pr.target, pr.draft, **kw)
    monkeypatch.setattr(cells, "MERGED_MAX_CELLS", 0)
    monkeypatch.setattr(cells, "PAIRED_MAX_CELLS", 0)
    monkeypatch.setattr(cells, "ENDING_MAX_CELLS", 0)
    monkeypatch.setattr(engine, "_CACHE", {})  # trace the chunk anew, one update each
    separate = engine.run(scheme, pr.target, pr.draft, **kw)
    assert merged.drafted.sum() > 0 and (merged.transitions is None or merged.transitions.sum() > 0)
    assert np.count_nonzero(merged.rounds_per_sequence) >= 2  # sequences that took different numbers of rounds
    for f, g in zip(merged, separate):
        if f is not None:
            np.testing.assert_array_equal(f, g)


def _digest(counts):
    h = hashlib.sha256()
    for field in counts:
        if field is not None:
            h.update(np.ascontiguousarray(field, np.int64).tobytes())
    return h.hexdigest()[:16]


def test_the_random_stream_is_pinned():
    # The counts of a seed are part of the engine's contract (checkpoints resume on them).
    # If this fails, the same seed now gives other counts: bump engine.STREAM_VERSION (so
    # old checkpoints are refused) and update the digests, in the same commit.
    pr = pairs.make_pairs("dirichlet", 0, n_pairs=3)
    a = engine.run(schemes.standard(3), pr.target, pr.draft, sequences=4096, length=4, seed=5, **SMALL)
    ng = pairs.ngram_pair(1, vocab=4, order=2)
    b = engine.run(schemes.standard(2), ng.target, ng.draft, sequences=4096, length=5, seed=5, joint=False, **SMALL)
    assert engine.STREAM_VERSION == 2
    assert (_digest(a), _digest(b)) == ("7461a77e81f71b81", "c3d0c036ca0cd615")


@pytest.mark.parametrize("target,msg", [
    (models.TableModel(np.array([[0.5, 0.6]]), 0), "not normalised"),
    (models.TableModel(np.array([[1.5, -0.5]]), 0), "negative"),
    (models.TableModel(np.array([[np.nan, 1.0]]), 0), "NaN"),
    (models.TableModel(np.full((1, 3), 1 / 3), 0), "share a vocabulary"),
    (models.TableModel(np.full((2, 2), 0.5), 0), "expected"),
])
def test_bad_inputs_raise_one_clear_error(target, msg):
    draft = models.context_free([0.5, 0.5])
    with pytest.raises(ValueError, match=msg):
        engine.run(schemes.standard(2), target, draft, sequences=10, length=2)


def test_bad_run_arguments():
    pr = pairs.make_pair("dirichlet", 0)
    with pytest.raises(ValueError, match="length must be"):
        engine.run(schemes.standard(2), pr.target, pr.draft, sequences=10, length=0)
    with pytest.raises(ValueError, match="unknown prng"):
        engine.run(schemes.standard(2), pr.target, pr.draft, sequences=10, length=2, prng="mt19937")
    with pytest.raises(ValueError, match="k must be"):
        engine.run(schemes.standard(2)._replace(k=0), pr.target, pr.draft, sequences=10, length=2)
    wide = models.TableModel(np.full((22, 1, 32768), 1 / 32768), 0)  # 22 pairs x 3000 positions x V cells
    with pytest.raises(ValueError, match="run fewer pairs at a time"):
        engine.run(schemes.standard(2), wide, wide, sequences=10, length=3000, joint=False)


def test_prng_is_selectable_without_global_config():
    import jax

    pr = pairs.make_pair("dirichlet", 0)
    a = _run(schemes.standard(2), pr, prng="rbg")
    b = _run(schemes.standard(2), pr, prng="threefry2x32")
    assert not np.array_equal(a.joint, b.joint)
    assert jax.config.jax_default_prng_impl == "threefry2x32"


def test_identical_counts_on_1_2_and_4_devices():
    code = textwrap.dedent("""
        import jax, numpy as np
        from specsample import engine, pairs, schemes
        pr = pairs.ngram_pair(0, vocab=3, order=1)
        outs = [engine.run(schemes.standard(2), pr.target, pr.draft, sequences=20000, length=3,
                           lanes=256, per_lane=8, devices=jax.devices()[:n]).joint for n in (1, 2, 4)]
        assert jax.device_count() == 4
        print(all(np.array_equal(outs[0], o) for o in outs))
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"


def test_a_chunk_deals_its_blocks_to_the_devices_in_turn():
    ids = engine.chunk_ids(32, 8, 2)  # device 0 takes the first half of the ids, device 1 the second
    assert ids.tolist() == [32, 34, 36, 38, 33, 35, 37, 39]
    assert sorted(engine.chunk_ids(0, 12, 4).tolist()) == list(range(12))
    assert engine.chunk_ids(5, 3, 1).tolist() == [5, 6, 7]


def test_a_run_shorter_than_a_chunk_keeps_every_device_busy():
    # a quick battery's case has fewer blocks than a chunk; dealt in consecutive slices, the last devices
    # got only blocks past the run's end (one core sampled while the others idled)
    code = textwrap.dedent("""
        import jax, numpy as np
        from specsample import engine, pairs, schemes
        from specsample.engine import lanes
        pr = pairs.make_pair("dirichlet", 0, 8)
        prep = lanes._prepare(schemes.standard(2), pr.target, pr.draft, sequences=6 * 512, length=3, seed=0,
                              lanes=64, per_lane=8, joint=None, prng="threefry2x32", blocks_per_call=None,
                              devices=None, prompt=None)
        assert prep.n_blocks == 6 and prep.blocks_per_step > 8 and prep.n_devices == 4
        rows = prep.call(jax.numpy.asarray(lanes.chunk_ids(0, prep.blocks_per_step, 4)), np.uint32(6))
        per_device = np.asarray(rows["emitted"]).reshape(4, -1).sum(axis=1)  # rounds, by outcome
        print(per_device.tolist())
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    per_device = eval(out.stdout.strip())  # noqa: S307 - a list of ints printed just above
    assert len(per_device) == 4 and all(r > 0 for r in per_device), per_device
