"""Diagnosis for trees (issue 33, item 3): a tree slip's FAIL names its stage and depth.

Slips are built the way a user writes a tree round (``verify_tree`` with callables for the children
and rows), each changed in one place, and claim their rule with ``Scheme.rule = "tree:rrs:2,2,2"``;
the registered trees and their controls claim theirs through their step. Each correct tree passes
every stage; each slip fails and its diagnosis names the stage it broke.
"""

import functools

import jax
import jax.numpy as jnp
import pytest

import specsample
from specsample.battery.tree_stages import tree_rule
from specsample.schemes import Scheme, UniformStep, make_scheme
from specsample.schemes.tree import (_children, _row, _shift, level_sizes, n_uniforms, split_tree_uniforms,
                                     verify_tree)

BRANCHING = (2, 2, 2)
CASES = "ngram-2/V4/k3"  # n-gram rows: every slip here shows on it


def _round(u, target, draft, context, *, slip=None):
    """The rrs tree round of ``tree_round``, open for one-place slips."""
    u_draft, u_acc, u_final = split_tree_uniforms(u, BRANCHING)
    if slip == "uniforms-reused-across-depths":  # every depth reads the root's sibling uniforms
        u_acc = jnp.concatenate([u_acc[:2]] * 3)
    starts = [sum(level_sizes(BRANCHING)[:d]) for d in range(3)]

    def window(path):
        w = context
        for t in path:
            w = _shift(w, t)
        return w

    def children(d, node, path):
        uu = jax.lax.dynamic_slice_in_dim(u_draft, starts[d] + node * 2, 2)
        q = _row(draft, window(path))
        if slip == "children-from-p":  # drafted from the target, judged as drafts from q
            toks, ok, _ = _children(_row(target, window(path)), uu, 2, "rrs")
            return toks, ok, jnp.broadcast_to(q, (2,) + q.shape)
        toks, ok, laws = _children(q, uu, 2, "rrs")
        if slip == "uniform-law":  # ratio and residual against the uniform law, not q
            laws = jnp.full_like(laws, 1.0 / q.shape[-1])
        return toks, ok, laws

    def rows(d, node, path):
        if slip == "leaf-from-q" and d == 3:
            return _row(draft, window(path))
        return _row(target, window(path))

    out, _ = verify_tree(children, rows, u_acc, u_final, branching=BRANCHING, rule="rrs")
    return out


def _slip(slip):
    return Scheme(name=f"slip:{slip}", k=3, max_tokens=4, rule="tree:rrs:2,2,2", lossless=slip is None,
                  step=UniformStep(functools.partial(_round, slip=slip), n_uniforms(BRANCHING)))


def test_the_rule_is_claimed_or_read_from_the_step():
    assert tree_rule(make_scheme("tree-wor", 4)) == ("rrs-wor", (3, 2, 1, 1))
    assert tree_rule(_slip(None)) == ("rrs", BRANCHING)
    assert tree_rule(make_scheme("standard", 4)) is None and tree_rule(make_scheme("tree-dynamic", 4)) is None
    with pytest.raises(ValueError, match="tree:RULE"):
        tree_rule(_slip(None)._replace(rule="tree:nope"))


def test_a_correct_tree_passes_every_stage():
    report = specsample.verify(_slip(None), budget=20_000, k=3, cases="dirichlet/V8/k3," + CASES)
    assert report.passed, report.table()
    for c in report.cases:
        assert {t.name for t in c.tests if t.name.startswith("stage:")} == {
            "stage:children", "stage:sibling-acceptance", "stage:residual", "stage:leaf"}
        assert c.diagnosis.startswith("every stage consistent")


@pytest.mark.parametrize("slip,stage", [
    ("children-from-p", "children"),
    ("uniforms-reused-across-depths", "sibling-acceptance"),
    pytest.param("uniform-law", "sibling-acceptance", marks=pytest.mark.long),
    pytest.param("leaf-from-q", "leaf", marks=pytest.mark.long),
    ("control:tree-topk-no-renorm", "sibling-acceptance"),
    pytest.param("control:tree-bonus-parent-row", "leaf", marks=pytest.mark.long),
])
def test_a_slip_names_its_stage_and_depth(slip, stage):
    scheme = make_scheme(slip, 3) if slip.startswith("control:") else _slip(slip)
    report = specsample.verify(scheme, budget=20_000, k=3, cases=CASES)
    assert not report.passed
    assert stage in report.broken_stages(), report.diagnosis()
    failing = [c for c in report.failed_cases if stage in c.rejected_stages]
    assert f"{stage}:" in failing[0].diagnosis and " at depth " in failing[0].diagnosis, failing[0].diagnosis


@pytest.mark.parametrize("vocab", [3, 8, 100])  # lexsort below 65 tokens, raw bytes above
@pytest.mark.parametrize("collide", [False, True])  # every row one hash: the exact ranking takes over
def test_row_ranks_group_rows_as_one_id_per_column_would(vocab, collide, monkeypatch):
    """``_row_ranks`` numbers distinct rows in lexicographic order: the groups (and first rows) of the
    per-column ``np.unique`` ids it replaced, equal rows (and -0.0 against 0.0) together, also when
    the rows' hashes collide."""
    import numpy as np

    from specsample.battery import tree_stages
    from specsample.battery.diagnosis import _groups
    from specsample.battery.tree_stages import _row_ranks

    if collide:
        monkeypatch.setattr(tree_stages, "_hash_weights", lambda v: np.zeros(v, np.uint64))
    monkeypatch.setattr(tree_stages, "_HASH_CHUNK", 1000)  # several chunks

    rng = np.random.default_rng(vocab)
    base = rng.dirichlet(np.full(vocab, 0.3), 40)
    base[base < 0.05] = 0.0
    rows = base[rng.integers(0, 40, 3000)]
    rows[:500] = np.round(rows[:500], 2)
    rows[:7, 0] = -0.0 * rows[:7, 0]  # a signed zero where the row has a zero
    slot = rng.integers(0, 3, rows.shape[0])
    ids = [np.unique(c, return_inverse=True)[1] for c in (rows + 0.0).T]
    want_group, want_first = _groups(slot, *ids)
    got_group, got_first = _groups(slot, _row_ranks(rows))
    np.testing.assert_array_equal(got_group, want_group)
    np.testing.assert_array_equal(got_first, want_first)
