"""Host tree samplers (the torch tree convention): the reference passes, its broken twins do not."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specsample import cli  # noqa: E402
from specsample.host import HostSamplerError  # noqa: E402
from specsample.host.tree import (  # noqa: E402
    TREE_RULES, TreeSampler, _walk, children_table, draft_trees, static_parents, tree_reference)
from specsample.host.tree_verify import plan_rounds, verify_tree_host  # noqa: E402
from specsample.models.tables import TableModel  # noqa: E402


@pytest.mark.parametrize("rule", TREE_RULES)
def test_the_reference_passes_every_rule(rule):
    report = verify_tree_host(tree_reference(rule), budget="quick", seed=1)
    assert report.passed, report.table()
    assert {t.name for t in report.cases[0].tests} == {"valid-paths", "support", "first-token", "round-law"}
    for c in report.cases:  # observed tokens per round near the exact law's
        assert abs(c.tokens_per_round - c.acceptance_theory) < 0.05, c.name


@pytest.mark.parametrize("rule,bug,seed", [("rrs", "bonus-parent", 0), ("rrs", "bonus-parent", 1),
                                           ("topk", "bonus-parent", 2), ("topk", "no-renorm", 0),
                                           ("topk", "no-renorm", 3)])
def test_broken_twins_are_rejected(rule, bug, seed):
    report = verify_tree_host(tree_reference(rule, bug), budget="quick", seed=seed)
    assert not report.passed
    failed = {t.name for c in report.cases for t in c.tests if t.rejected}
    # a bonus from the parent's row leaves the first token alone: only the round law sees it
    assert "round-law" in failed and (bug != "bonus-parent" or "first-token" not in failed)


def test_a_sampler_that_claims_the_wrong_rule_is_rejected():
    report = verify_tree_host(tree_reference("rrs"), budget="quick", seed=0, rule="topk")
    assert not report.passed


def test_trees_are_drafted_by_the_rule():
    q = TableModel(np.array([[0.1, 0.2, 0.3, 0.4]] * 4), 1)
    rng = np.random.default_rng(0)
    roots = np.array([0, 1, 2])
    top = draft_trees("topk", (2, 2), q, roots, rng)
    assert top.shape == (3, 1 + 2 + 4) and top[:, 0].tolist() == [0, 1, 2]
    assert top[:, 1:3].tolist() == [[3, 2]] * 3
    wor = draft_trees("rrs-wor", (4,), q, np.zeros(500, np.int64), rng)
    assert all(len(set(row[1:])) == 4 for row in wor)  # distinct children
    iid = draft_trees("rrs", (1,), q, np.zeros(20000, np.int64), rng)
    assert np.allclose(np.bincount(iid[:, 1], minlength=4) / 20000, q.table[0], atol=0.015)


def test_paths_are_checked_against_the_tree():
    parents = static_parents((2, 2))  # [-1, 0, 0, 1, 1, 2, 2]
    assert children_table(parents)[0].tolist() == [1, 2] and children_table(parents)[3].tolist() == [-1, -1]
    paths = np.array([[1, 3], [2, -1], [-1, -1], [2, 3], [-1, 4], [7, -1]])
    assert _walk(paths, parents).tolist() == [2, 1, 0, -1, -1, -1]


def test_a_malformed_path_fails_the_hard_check():
    good = tree_reference("rrs").fn

    def skips_a_level(tokens, parents, q, p, g):
        path, final = good(tokens, parents, q, p, g)
        path[:, 0] = torch.where(path[:, 1] >= 0, -1, path[:, 0])  # drops the first accepted node
        return path, final

    report = verify_tree_host(TreeSampler(skips_a_level), budget=256, seed=0)
    assert not report.passed and report.cases[0].worst.name == "valid-paths"


def test_bad_samplers_get_one_line():
    with pytest.raises(HostSamplerError, match=r"returned path \(256, 2\).*expected \(256, 3\)"):
        verify_tree_host(TreeSampler(lambda t, par, q, p, g: (np.zeros((t.shape[0], 2), int),
                                                               np.zeros(t.shape[0], int))), budget=256)
    with pytest.raises(HostSamplerError, match="returned the path as floats"):
        verify_tree_host(TreeSampler(lambda t, par, q, p, g: (np.zeros((t.shape[0], 3)), np.zeros(t.shape[0], int))),
                         budget=256)
    with pytest.raises(HostSamplerError, match=r"raised ZeroDivisionError.*test_host_tree.py"):
        verify_tree_host(TreeSampler(lambda *a: 1 / 0), budget=256)
    with pytest.raises(ValueError, match="tree sampler rule must be one of"):
        TreeSampler(lambda *a: None, rule="standard")
    with pytest.raises(ValueError, match="at least 64"):
        verify_tree_host(tree_reference(), budget=10)
    with pytest.raises(ValueError, match="branching must be positive"):
        verify_tree_host(tree_reference(), branching=(2, 0))


def test_rounds_come_from_a_power_calculation():
    assert plan_rounds("quick", 4, 4, 0.01 / 12, 0.99) < plan_rounds("default", 4, 4, 0.01 / 12, 0.99)
    assert plan_rounds("default", 8, 1, 1e-3, 0.99) <= 1 << 17


def test_the_command_line(tmp_path, capsys):
    rc = cli.main(["verify", "--sampler", "specsample.host.tree:tree_reference", "--tree", "2,2", "--budget", "512",
                   "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert rc == 0 and "tree-host/ngram-1/V4" in out and (tmp_path / "r.json").exists()
    assert cli.main(["verify", "--sampler", "specsample.host.tree:tree_reference", "--tree", "2,2", "--ragged"]) == 2
    assert "takes one tree shape a batch: drop --ragged" in capsys.readouterr().err
    assert cli.main(["verify", "--sampler", "specsample.host.tree:tree_reference", "--tree", "2,2", "--unbatched"]) == 2
    assert "do not apply to a tree sampler" in capsys.readouterr().err
