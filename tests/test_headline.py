"""The headline says what failed: the output, a hard check (with its first violation), the acceptance
or a stage; a narrow FAIL says so and the command line prints the confirming run."""

import pytest

import specsample
from specsample.battery import report as rep
from specsample.cli.run import _confirmation


def _report(*tests, alpha=0.01):
    case = rep.CaseResult(name="c/V8/k4", scheme="s", family="f", model="m", vocab=8, k=4, length=6, sequences=100,
                      rounds=100, tests=list(tests), min_detectable_tv=0.01)
    return rep.Report(scheme="s", alpha=alpha, seed=0, budget="quick", cases=[case], seconds=1.0, power=0.99, engine={})


def _soft(name, adjusted):
    return rep.TestResult(name, 10.0, adjusted / 5, 3, adjusted=adjusted, rejected=adjusted < 0.01)


@pytest.mark.parametrize("tests, words", [
    ([_soft("position[0]", 1e-9), _soft("accepted-law", 1e-9)], "the output deviates from the target"),
    ([rep.TestResult("support", 3.0, 0.0, hard=True, detail="3 tokens emitted where the target gives probability 0",
                 rejected=True)], "a hard check failed"),
    ([_soft("stage:acceptance", 1e-9)], "the acceptance of drafts deviates from its law"),
    ([_soft("stage:drafting", 1e-9)], "a stage of the round deviates from its own law"),
])
def test_the_headline_says_what_failed(tests, words):
    line = " ".join(_report(*tests).headline().split())
    assert line.startswith(f"FAIL s: {words} in 1 of 1 cases")


def test_a_hard_failure_prints_its_first_violation():
    t = rep.TestResult("boundary-intercepted", 1.0, 0.0, hard=True, rejected=True,
                   detail="torch.rand float64 draw 3 element 0 = 0: token 5 of probability 0 emitted")
    line = " ".join(_report(t).headline().split())
    assert "First violation: c/V8/k4: boundary-intercepted: torch.rand float64 draw 3 element 0 = 0" in line


def test_a_narrow_fail_says_so():
    narrow, clear = _report(_soft("position[0]", 0.004)), _report(_soft("position[0]", 1e-4))
    assert narrow.narrow and not clear.narrow
    assert "NARROW: the smallest adjusted p is 0.004" in " ".join(narrow.headline().split())
    assert "NARROW" not in clear.headline()
    hard = _report(rep.TestResult("support", 1.0, 0.0, hard=True, rejected=True), _soft("position[0]", 0.004))
    assert not hard.narrow  # a hard check is never narrow


def test_the_confirming_run_has_a_new_seed():
    assert _confirmation(["verify", "--scheme", "x", "--seed", "5"], 5) == "specsample verify --scheme x --seed 1000008"
    assert _confirmation(["verify"], 0).endswith("--seed 1000003")


def test_the_confirming_run_writes_new_paths():
    # run verbatim, the confirmation must not overwrite the failing report, its records or its checkpoints
    line = _confirmation(["verify", "--json", "out/r.json", "--html=r.html", "--record", "rounds/",
                          "--checkpoint", "ck", "--seed=3"], 3)
    assert line == ("specsample verify --json out/r.confirm.json --html=r.confirm.html --record rounds.confirm "
                    "--checkpoint ck.confirm --seed 1000006")


def test_a_real_hard_only_failure():
    report = specsample.verify("control:le-acceptance", budget="quick", k=4, cases="boundary/V8/k4")
    line = " ".join(report.headline().split())
    assert "a hard check failed" in line and "First violation: boundary/V8/k4: boundary-uniforms" in line


def test_a_check_that_reached_nothing_says_why_in_the_headline():
    # an instruction in a check's detail (mask the target, turn compilation off) reaches the terminal and the
    # HTML's headline, not only the JSON
    t = rep.TestResult("boundary-intercepted", 0.0, 1.0, hard=True, reached=False,
                       detail="not reached: the target forbids no token on these prefixes; mask the target to its "
                              "top-k (specsample.loops.mask) and run again")
    line = " ".join(_report(t, _soft("position[0]", 0.5)).headline(width=1000).split())
    assert line.startswith("PASS") and "NOT REACHED: 1 case" in line
    assert "Why, and what to do: c/V8/k4: boundary-intercepted: not reached: the target forbids no token" in line
    assert "mask the target to its top-k (specsample.loops.mask) and run again." in line
    assert "Why, and what to do" not in _report(_soft("position[0]", 0.5)).headline()
