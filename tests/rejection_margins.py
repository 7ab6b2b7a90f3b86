"""How far each rejection in a test run is from passing: a pytest plugin, off by default.

A test that proves a broken sampler is rejected can hold by luck: its seed's run rejects, and
other seeds' runs would not (on 2026-12-05 the forgotten repetition penalty of
``tests/test_e2e.py`` was rejected at 600 sequences under two seeds of four). This plugin records,
for every report a test finds failing, whether a hard check failed (an assertion: no margin to
speak of) or else the smallest Holm-adjusted p-value among the rejected tests, and prints the
weakest rejection of each test at the end of the run, those within a factor of 1,000 of the
family-wise level flagged::

    PYTHONPATH=tests pytest -p rejection_margins tests/test_e2e.py    # add -m long for the long runs

It wraps :attr:`specsample.battery.report.Report.passed`, which every such test reads; with
pytest-xdist each worker appends to one JSON-lines file, which the controller reads.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from specsample.battery import report as _report

FLAG = 1000.0  # a rejection whose adjusted p is above alpha / FLAG is near the line
_ENV = "SPECSAMPLE_MARGINS_FILE"
_current: dict = {"id": None}
_passed = _report.Report.passed


def _recorded(self) -> bool:
    ok = _passed.fget(self)
    if not ok and _current["id"] is not None:
        rejected = [(t, c.name) for c in self.cases for t in c.tests if t.rejected]
        soft = [(t.adjusted, t.name, case) for t, case in rejected if not t.hard]
        record = dict(test=_current["id"], alpha=self.alpha, hard=[t.name for t, _ in rejected if t.hard],
                      soft=min(soft) if soft else None)
        with open(os.environ[_ENV], "a") as f:
            f.write(json.dumps(record) + "\n")
    return ok


def pytest_configure(config):
    if _ENV not in os.environ:  # the controller: one file for every worker (they inherit the variable)
        fd, path = tempfile.mkstemp(prefix="rejection-margins-", suffix=".jsonl")
        os.close(fd)
        os.environ[_ENV] = path
    _report.Report.passed = property(_recorded)


def pytest_unconfigure(config):
    _report.Report.passed = _passed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _current["id"] = item.nodeid
    try:
        yield
    finally:
        _current["id"] = None


def weakest(records: list) -> dict:
    """Per test, its weakest rejection: ``("hard", None, alpha, None, None)`` when every failing report
    had a failed hard check, else ``("soft", p, alpha, name, case)``: p the largest of its reports'
    smallest adjusted p-values, from the test ``name`` of case ``case``."""
    out: dict = {}
    for r in records:
        if r["hard"]:
            out.setdefault(r["test"], ("hard", None, r["alpha"], None, None))
            continue
        p, name, case = r["soft"]
        old = out.get(r["test"])
        if old is None or old[0] == "hard" or p > old[1]:
            out[r["test"]] = ("soft", p, r["alpha"], name, case)
    return out


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller prints
        return
    path = os.environ.get(_ENV)
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    os.unlink(path)
    tr = terminalreporter
    tr.section("rejection margins")
    if not records:
        tr.write_line("no test read a failing report")
        return
    rows = sorted(weakest(records).items(), key=lambda kv: (kv[1][0] == "soft", kv[1][1] or 0.0), reverse=True)
    for test, (kind, p, alpha, name, case) in rows:
        if kind == "hard":
            tr.write_line(f"  hard check           {test}")
        else:
            near = "NEAR " if p > alpha / FLAG else "     "
            tr.write_line(f"{near}adj p {p:9.2e}  {test}  ({name}, {case})")
