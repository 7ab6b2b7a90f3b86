"""Samplers that build their own trees (issue 33, item 2): ``--tree dynamic`` verifies them as self-drafting
samplers on the output law; the EAGLE-2 reference passes in both rules, its sampled-rerank twin fails."""

import pytest

from specsample import cli, host
from specsample.host.tree_dynamic import eagle2

CASES = "dirichlet/V8/k3,ngram-2/V4/k3"


@pytest.mark.parametrize("rule", ["topk", "rrs-wor"])
def test_an_eagle2_sampler_passes(rule):
    report = host.verify_host(eagle2(rule=rule), budget=6000, k=3, cases=CASES)
    assert report.passed, report.table()


def test_sampled_children_pruned_by_the_rerank_fail():
    report = host.verify_host(eagle2(rule="rrs-wor", keep=4), budget=6000, k=3, cases=CASES)
    assert not report.passed and len(report.failed_cases) == 2, report.table()


def test_cli_tree_dynamic(capsys):
    code = cli.main(["verify", "--sampler", "specsample.host.tree_dynamic:eagle2", "--tree", "dynamic", "--k", "3",
                     "--budget", "4000", "--cases", CASES])
    out = capsys.readouterr().out
    assert code == 0 and "dirichlet/V8/k3" in out, out
    assert cli.main(["verify", "--sampler", "specsample.host.tree_dynamic:eagle2", "--tree", "dynamic",
                     "--rule", "standard"]) == 2
    assert "claims no rule" in capsys.readouterr().err
    with pytest.raises(ValueError, match="topk or rrs-wor"):
        eagle2(rule="rrs")
