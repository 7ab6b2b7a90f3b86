"""Long statistical runs (`pytest -m long`). CI runs them bounded: SPECSAMPLE_LONG=bounded."""

import pytest

import specsample
import stats
from conftest import LONG_BOUNDED

pytestmark = pytest.mark.long


def test_default_budget_passes_the_standard_scheme():
    budget = "quick" if LONG_BOUNDED else "default"
    report = specsample.verify("standard", budget=budget, seed=2026)
    assert report.passed, report.table()


@pytest.mark.parametrize("control", sorted(specsample.CONTROLS))
def test_every_control_is_rejected(control):
    # off-by-one is only visible on n-gram models; every other control on any pair
    kw = dict(budget="quick", k=4)
    if control == "control:bonus-not-in-target-cache":
        # only rounds after a full acceptance go wrong: the windows that span rounds see it, through
        # the output law or the first acceptance given the round's prefix (quick: seeds 0-8 all reject)
        kw = dict(budget="quick", k=(1, 4, 8), cases="transformer-close/V2/*")
    report = specsample.verify(control, seed=7, **kw)
    assert not report.passed, report.table()


@pytest.mark.parametrize("name", list(specsample.SCHEMES))  # one test a scheme: workers share them out
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
