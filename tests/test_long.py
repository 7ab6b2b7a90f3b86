"""Long statistical runs (`pytest -m long`). CI runs them bounded: SPECSAMPLE_LONG=bounded."""

import numpy as np
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
    report = specsample.verify(control, budget="quick", seed=7, ks=(4,))
    assert not report.passed, report.table()


def test_false_alarm_rate_across_seeds():
    """Per-case Holm at alpha = 0.01: over independent seeds the run-level false-alarm
    rate must not exceed alpha (one-sided binomial test)."""
    runs = 3 if LONG_BOUNDED else 30
    fails = sum(not specsample.verify("standard", budget="quick", seed=100 + s, ks=(4,), cases="V8/k4").passed
                for s in range(runs))
    assert stats.rejection_rate(fails, runs, 0.01).pvalue > 1e-3
