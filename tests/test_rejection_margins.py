"""The rejection-margins plugin (tests/rejection_margins.py) records what a failing report rejected."""

import json

import rejection_margins as rm

from specsample.battery import report as rep


def _report(*tests) -> rep.Report:
    case = rep.CaseResult(name="c", scheme="s", family="f", model="m", vocab=2, k=1, length=1, sequences=1, rounds=1,
                      tests=list(tests), min_detectable_tv=0.1)
    return rep.Report(scheme="s", alpha=0.01, seed=0, budget="quick", cases=[case], seconds=0.0, power=0.99, engine={})


def test_a_failing_report_is_recorded_with_its_smallest_adjusted_p(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv(rm._ENV, str(path))
    monkeypatch.setitem(rm._current, "id", "t::a")
    near = rep.TestResult("joint", 9.0, 1e-5, adjusted=5e-5, rejected=True)
    far = rep.TestResult("position[0]", 50.0, 1e-30, adjusted=1e-29, rejected=True)
    assert rm._recorded(_report(near, far, rep.TestResult("bonus", 1.0, 0.5, adjusted=1.0))) is False
    assert rm._recorded(_report(rep.TestResult("bonus", 1.0, 0.5, adjusted=1.0))) is True  # a pass is not recorded
    monkeypatch.setitem(rm._current, "id", "t::b")
    rm._recorded(_report(rep.TestResult("support", 3.0, 0.0, hard=True, rejected=True), far))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["test"] for r in records] == ["t::a", "t::b"]
    assert records[0]["soft"] == [1e-29, "position[0]", "c"] and records[1]["hard"] == ["support"]
    weakest = rm.weakest(records + [dict(test="t::a", alpha=0.01, hard=[], soft=[5e-5, "joint", "c"])])
    assert weakest["t::a"][:2] == ("soft", 5e-5) and 5e-5 > 0.01 / rm.FLAG  # the weaker report of t::a is kept
    assert weakest["t::b"][0] == "hard"
