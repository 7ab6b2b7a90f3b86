"""A tree per request (issue 33, item 2): the ragged tree convention, exact laws of any tree shape, and
proof both ways (a correct ragged sampler passes; one that walks every request with the first request's
shape, or draws the bonus from the leaf's parent, is rejected)."""

import numpy as np
import pytest

from specsample import cli
from specsample.host.tree import static_parents
from specsample.host.tree_verify import verify_tree_host
from specsample.laws import exact
from specsample.laws.tree_exact import shape_law, tree_law
from specsample.models import pairs
from specsample.models import tables as models

pytest.importorskip("torch")
from specsample.host.tree_ragged import ragged_reference, shape_family  # noqa: E402  (needs torch at call time)

PAIRS = [pairs.make_pair("dirichlet", 0, 4), pairs.ngram_pair(7, vocab=3, order=1)]


@pytest.mark.parametrize("rule", ["rrs", "rrs-wor", "topk"])
def test_shape_law_is_the_static_law_and_every_shape_is_lossless(rule):
    for pr in PAIRS:
        ctx = (0,) if pr.target.order else ()
        for br in ((3, 2), (2, 1, 1)):
            a = tree_law(rule, pr.target, pr.draft, br)(ctx)
            b = shape_law(rule, pr.target, pr.draft, static_parents(br))(ctx)
            assert max(abs(a.get(x, 0) - b.get(x, 0)) for x in set(a) | set(b)) < 1e-12
        for _, par in shape_family((3, 2, 1), 6, np.random.default_rng(1)):
            joint = exact.stream_joint(shape_law(rule, pr.target, pr.draft, par), pr.target.vocab_size, 3,
                                       max(pr.target.order, pr.draft.order))
            assert 0.5 * np.abs(joint - models.exact_joint(pr.target, 3).ravel()).sum() < 1e-12


def test_shapes_keep_a_prefix_of_children_under_kept_nodes():
    full = static_parents((3, 2, 1))
    shapes = shape_family((3, 2, 1), 8, np.random.default_rng(0))
    assert shapes[0][0].tolist() == list(range(full.size)) and shapes[1][1].tolist() == [-1, 0, 1, 2]
    for keep, par in shapes:
        kept = set(keep.tolist())
        assert all(full[i] in kept for i in keep[1:])  # ancestors kept
        assert all(par[j] == keep.tolist().index(full[i]) for j, i in enumerate(keep) if j)
        for node in kept:  # the kept children of a node are its first ones
            kids = [i for i in range(full.size) if full[i] == node]
            mine = [i for i in kids if i in kept]
            assert mine == kids[: len(mine)]
    assert len({tuple(k.tolist()) for k, _ in shapes}) >= 5


@pytest.mark.parametrize("rule", ["rrs", "rrs-wor", "topk"])
def test_a_correct_ragged_sampler_passes(rule):
    report = verify_tree_host(ragged_reference(rule), branching=(3, 2, 1), budget=3000)
    assert report.passed, report.table()
    assert all(c.name.startswith("tree-ragged/") for c in report.cases)
    assert "6 shapes" in report.cases[0].tests[-1].detail


@pytest.mark.parametrize("bug,test", [("first-shape", "valid-paths"), ("bonus-parent", "round-law")])
def test_a_ragged_sampler_that_mixes_up_requests_or_rows_is_rejected(bug, test):
    report = verify_tree_host(ragged_reference("rrs", bug=bug), branching=(3, 2, 1), budget=3000)
    assert not report.passed
    assert any(t.name == test and t.rejected for c in report.cases for t in c.tests), report.table()


def test_cli_ragged_tree(capsys):
    code = cli.main(["verify", "--sampler", "specsample.host.tree_ragged:ragged_reference", "--tree", "2,2",
                     "--ragged", "--budget", "2000"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "tree-ragged/ngram-1/V4" in out
    with pytest.raises(ValueError, match="unknown bug"):
        ragged_reference("rrs", bug="nope")
