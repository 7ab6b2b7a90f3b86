"""Dynamic trees (issue 33, item 1): EAGLE-2's shape chosen from the draft each round, two lossless rules
against exact oracles, and three controls that must fail (their oracles say by how much)."""

import numpy as np
import pytest

import stats
from specsample.engine import lanes as engine
from specsample.laws import exact
from specsample.laws.tree_dynamic_exact import dynamic_law
from specsample.models import pairs
from specsample.models import tables as models
from specsample.schemes import CONTROLS, SCHEMES, make_scheme
from specsample.schemes.tree_dynamic import (DYNAMIC_CONTROLS, DYNAMIC_SPEC, _rerank, build_tree, default_keep,
                                             level_sizes, n_uniforms, tree_dynamic)

PAIRS = [pairs.make_pair("dirichlet", 0, 4), pairs.ngram_pair(7, vocab=3, order=1),
         pairs.make_pair("zeros-in-p", 1, 4)]


def _tv(law_fn, pr, length=3):
    joint = exact.stream_joint(law_fn, pr.target.vocab_size, length, max(pr.target.order, pr.draft.order))
    return 0.5 * np.abs(joint - models.exact_joint(pr.target, length).ravel()).sum()


@pytest.mark.parametrize("depth,width,keep", [(2, 2, 4), (3, 2, None), (3, 2, 3), (2, 3, 5)])
def test_top_m_dynamic_trees_are_lossless_exactly(depth, width, keep):
    for pr in PAIRS:
        assert _tv(dynamic_law("topk", pr.target, pr.draft, depth, width, keep), pr) < 1e-12


def test_sampled_dynamic_trees_are_lossless_exactly():
    for pr in PAIRS:
        assert _tv(dynamic_law("rrs-wor", pr.target, pr.draft, 2, 2), pr) < 1e-12


def test_a_top_m_shape_may_read_the_target():
    """The top-b rule never reads q outside the shape: a shape built from p itself is still lossless. What
    the issue feared of target-read shapes holds for sampled children (the target-prune control)."""
    for pr in PAIRS:
        assert _tv(dynamic_law("topk", pr.target, pr.target, 3, 2, 4), pr) < 1e-12


@pytest.mark.parametrize("name,pair,least", [
    ("control:tree-dynamic-wor-rerank", PAIRS[0], 0.05),
    ("control:tree-dynamic-target-prune", PAIRS[2], 0.05),  # only where p forbids a drafted token
    ("control:tree-dynamic-orphan", pairs.ngram_pair(0, vocab=4, order=2), 0.1),  # n-gram rows only
])
def test_dynamic_controls_deviate(name, pair, least):
    assert _tv(exact.round_law(name, pair.target, pair.draft, 3 if "orphan" in name else 2), pair) > least


def test_registered_with_their_oracles():
    assert {"tree-dynamic", "tree-dynamic-wor"} <= set(SCHEMES) and set(DYNAMIC_CONTROLS) <= set(CONTROLS)
    assert set(DYNAMIC_SPEC) <= exact.EXACT
    assert level_sizes(2, 4) == [2, 4, 4, 4] and default_keep(2, 4) == 8 and default_keep(2, 1) == 2
    s = make_scheme("tree-dynamic", 4)
    assert s.k == 4 and s.max_tokens == 5 and s.step.n == n_uniforms(2, 4) == 14 + 8 + 1
    assert "keep 8" in s.description and "keep" not in make_scheme("tree-dynamic-wor", 4).description
    with pytest.raises(ValueError, match="width >= 1"):
        tree_dynamic(3, width=0)
    with pytest.raises(ValueError, match="keep must be >= 1"):
        tree_dynamic(3, keep=0)


@pytest.mark.parametrize("name", list(DYNAMIC_SPEC))
def test_implementation_matches_its_oracle(name):
    pr = PAIRS[1] if "target-prune" not in name else PAIRS[2]
    law = exact.exact_output(name, pr.target, pr.draft, 2, 3)
    c = engine.run(make_scheme(name, 2), pr.target, pr.draft, sequences=40_000, length=3, lanes=512,
                   per_lane=8).pair(0)
    assert c.joint[law == 0].sum() == 0
    assert stats.goodness_of_fit(c.joint, law).pvalue > 1e-4 / 5


def test_the_rerank_keeps_every_ancestor_and_the_orphan_rank_does_not():
    import jax
    import jax.numpy as jnp

    pr = pairs.ngram_pair(2, vocab=6, order=2)
    ctx = jnp.asarray(models.initial_context(2), jnp.int32)

    @jax.jit
    @jax.vmap
    def shapes(u):  # parents and kept flags of 20 drafted trees, both ranks, in one call
        levels = build_tree(u, pr.draft, ctx, width=3, depth=4, rule="rrs-wor")
        return [lv["parent"] for lv in levels], _rerank(levels, 8), _rerank(levels, 8, by_own=True)

    u = jax.random.uniform(jax.random.key(0), (20, sum(level_sizes(3, 4))))
    parents, kept, own = jax.device_get(shapes(u))

    def orphans(k):
        return sum(int(np.sum(k[d] & ~np.take_along_axis(k[d - 1], parents[d], axis=1))) for d in range(1, 4))

    assert orphans(kept) == 0
    assert orphans(own) > 0  # the control's rank does orphan nodes: it is the bug it claims to be
