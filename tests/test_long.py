"""Long statistical runs (`pytest -m long`). CI runs them bounded: SPECSAMPLE_LONG=bounded."""

import pytest

import specsample
import stats
from conftest import LONG_BOUNDED

pytestmark = pytest.mark.long


def test_default_budget_passes_the_standard_scheme():
    """The whole battery (bounded: the quick one), its report and its JSON."""
    import json

    budget = "quick" if LONG_BOUNDED else "default"
    report = specsample.verify("standard", budget=budget, seed=2026)
    assert report.passed, report.table()
    assert len(report.cases) > 60
    assert {c.k for c in report.cases} >= {1, 4, 8}
    models = {c.model for c in report.cases}
    assert {"context-free", "1-gram", "2-gram"} <= models and any(m.startswith("sweep") for m in models)
    assert "PASS" in report.headline() and "with probability >= 0.99" in report.headline()
    from specsample.battery.report import TOO_FEW

    for c in report.cases:
        # a claim about the token law, or none said so (the 32k case at the quick budget pools nearly every
        # token, and its TV test needs more sequences: the headline warns)
        assert c.min_detectable_tv > 0 or c.family == "one-hot-p" or c.model == "boundary" or \
            (c.family.startswith("large-vocab") and c.min_tv_note == TOO_FEW), (c.name, c.min_tv_note)
    if LONG_BOUNDED:
        assert "too few sequences for any power figure" in " ".join(report.headline().split())
    # acceptance against theory on the context-free cases
    for c in report.cases:
        if c.model == "context-free" and c.family not in ("disjoint", "warp-top-k"):
            assert abs(c.acceptance_observed - c.acceptance_theory) < 0.02, c.name
    d = json.loads(report.to_json())
    assert d["verdict"] == "pass" and d["alpha"] == 0.01 and d["seed"] == 2026 and "jax" in d["versions"]
    case = d["cases"][0]
    for key in ("name", "scheme", "passed", "rounds", "min_detectable_tv", "tests"):
        assert key in case
    for key in ("name", "statistic", "pvalue", "adjusted", "rejected"):
        assert key in case["tests"][0]


@pytest.mark.parametrize("control", sorted(specsample.CONTROLS))
def test_every_control_is_rejected(control):
    # off-by-one is only visible on n-gram models; every other control on any pair
    kw = dict(budget="quick", k=4)
    if control == "control:bonus-not-in-target-cache":
        # only rounds after a full acceptance go wrong: the windows that span rounds see it, through
        # the output law or the first acceptance given the round's prefix (quick: seeds 0-8 all reject)
        kw = dict(budget="quick", k=(1, 4, 8), cases="transformer-close/V2/*")
    if LONG_BOUNDED and "cases" not in kw:
        # bounded: the same quick battery case by case, stopping at the first rejection; each case is its
        # own Holm family at alpha, with the counts of the whole run (case seeds come from case names)
        passed = []
        for case in _quick_cases(control):
            report = specsample.verify(control, seed=7, cases=case, **kw)
            if not report.passed:
                return
            passed.append(report.table())
        pytest.fail(f"{control} passed every case:\n" + "\n".join(passed))
    report = specsample.verify(control, seed=7, **kw)
    assert not report.passed, report.table()


def _quick_cases(name: str) -> list:
    """The k = 4 cases of the quick battery that ``name`` runs, where most controls show first."""
    from specsample.battery.cases import default_cases
    from specsample.battery.suite import resolve_budget
    from specsample.schemes import StatefulStep, make_scheme

    stateful = isinstance(make_scheme(name, 4).step, StatefulStep)
    names = [c.name for c in default_cases(resolve_budget("quick")[0], (4,)) if c.k == 4 and c.neural == stateful]
    first = ("dirichlet/", "ngram-2/", "boundary/", "transformer-far/")
    return sorted(names, key=lambda c: next((i for i, f in enumerate(first) if c.startswith(f)), len(first)))


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.heavy) if n in ("cached", "tree-cached") else n
                                  for n in specsample.SCHEMES])  # one test a scheme: workers share them out
def test_false_alarm_rate_across_seeds(name):
    """Holm at alpha = 0.01: over independent seeds the run-level false-alarm rate of every
    lossless scheme must not exceed alpha (one-sided binomial test)."""
    runs = 2 if LONG_BOUNDED else 20
    # the KV-cache scheme runs its whole quick battery (8 transformer cases, k = 1, 4, 8)
    kw = dict(k=(1, 4, 8)) if name == "cached" else dict(k=4, cases="V8/k4")
    fails = sum(not specsample.verify(name, budget="quick", seed=100 + s, **kw).passed for s in range(runs))
    assert stats.rejection_rate(fails, runs, 0.01).pvalue > 1e-3, name


def test_calibrate_command_false_alarms():
    """`specsample calibrate` end to end: a handful of runs in CI, 100 in full."""
    import subprocess
    import sys

    runs = "3" if LONG_BOUNDED else "100"
    out = subprocess.run([sys.executable, "-m", "specsample", "calibrate", "--runs", runs],
                         capture_output=True, text=True, timeout=3000)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "false alarms" in out.stdout
