"""stats.anytime: e-processes whose false-alarm bound holds at any look, both ways (a correct stream
raises an alarm at most alpha of the time, however long; a deviating one is caught)."""

import numpy as np
import pytest
from scipy import stats as sps

from stats import anytime

from conftest import LONG_BOUNDED

UNIFORM = np.full(20, 1 / 20)


def test_the_mixture_is_the_dirichlet_multinomial_ratio():
    # closed form against a direct sum: two cells, a = 1 -> the mixture is 1 / ((n + 1) C(n, n1)) per sequence
    counts, pi = np.array([7, 3]), np.array([0.5, 0.5])
    direct = np.log(1 / (11 * 120)) - 10 * np.log(0.5)
    assert anytime.dirichlet_mixture_log_e(counts, pi) == pytest.approx(direct, rel=1e-12)
    # the path after each draw ends where the counts say, whatever the order
    cells = np.array([0, 1, 0, 0, 1, 0, 0, 1, 0, 0])
    path = anytime.dirichlet_mixture_path(cells, np.zeros(2), pi)
    assert path[-1] == pytest.approx(direct, rel=1e-12)
    assert anytime.dirichlet_mixture_path(cells[::-1], np.zeros(2), pi)[-1] == pytest.approx(direct, rel=1e-12)
    # resumed mid-way from the counts so far
    half = anytime.dirichlet_mixture_path(cells[5:], np.bincount(cells[:5], minlength=2), pi)
    np.testing.assert_allclose(half, path[5:], rtol=1e-12)


def test_bad_input_is_refused_in_one_line():
    with pytest.raises(ValueError, match="positive probabilities summing to 1"):
        anytime.dirichlet_mixture_log_e([1, 2], [1.0, 0.0])
    with pytest.raises(ValueError, match="non-negative"):
        anytime.dirichlet_mixture_log_e([1, -2], [0.5, 0.5])
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        anytime.betting_log_wealth([1.0], [0.5], bets=[2.0])
    with pytest.raises(ValueError, match="from 1"):
        anytime.alpha_share(0.01, 0)


def _false_alarms(streams, n, alpha, rng):
    """How many of ``streams`` correct streams of ``n`` draws each ever reach 1 / alpha, read after every
    draw (the most looks there can be), for both e-processes."""
    pit = bet = 0
    line = np.log(1 / alpha)
    for _ in range(streams):
        cells = rng.integers(0, 20, n)
        pit += bool(np.any(anytime.dirichlet_mixture_path(cells, np.zeros(20), UNIFORM) >= line))
        mu = rng.uniform(0.05, 0.95, n)
        x = (rng.random(n) < mu).astype(float)
        bet += bool(np.any(anytime.betting_path(x, mu, np.zeros(anytime.BETS.size)) >= line))
    return pit, bet


@pytest.mark.parametrize("streams, n", [(150, 10_000),
                                        pytest.param(2_000, 50_000, marks=pytest.mark.long)])
def test_a_correct_stream_alarms_at_most_alpha_of_the_time_however_long(streams, n):
    # correct streams, each read after every draw, at alpha = 0.05: at most 5 % may ever alarm; a one-sided
    # binomial test at 0.001 guards the bound without flaking (Ville's bound is usually loose). The long
    # form: 2,000 streams of 50,000 draws (1,000 streams bounded)
    if n > 10_000 and LONG_BOUNDED:
        streams = 1_000
    rng = np.random.default_rng(0)
    pit, bet = _false_alarms(streams, n, 0.05, rng)
    for alarms in (pit, bet):
        assert sps.binomtest(alarms, streams, 0.05, alternative="greater").pvalue > 1e-3, alarms


def test_repeated_fixed_size_tests_are_not_anytime_valid():
    # the contrast the monitor exists for: 20 looks of a chi-square at 0.05 alarm on far more than 5 %
    rng = np.random.default_rng(4)
    looks = 0
    for _ in range(200):
        cells = rng.integers(0, 20, 20_000)
        counts = np.cumsum(np.eye(20)[cells], axis=0)[999::1000]
        looks += bool(np.any(sps.chisquare(counts, axis=1).pvalue < 0.05))
    assert looks / 200 > 0.15


@pytest.mark.parametrize("shape, tv, bound", [("halves", 0.05, 8_000), ("halves", 0.02, 50_000),
                                               ("spike", 0.02, 12_000)])
def test_a_deviation_is_caught_within_its_stated_delay(shape, tv, bound):
    # the monitor's e-process (views of 2, 4, 10, 20 bins and each bin alone) at alpha = 0.01 catches a
    # deviation within about twice the 90th percentile that docs/records.md states for it
    # (benchmarks/bench_monitor.py: halves 0.05 -> 4,000, halves 0.02 -> 26,000, spike 0.02 -> 5,100)
    rng = np.random.default_rng(1)
    f = UNIFORM.copy()
    if shape == "halves":  # mass moved from the lower ten bins to the upper ten
        f[:10] -= tv / 10
        f[10:] += tv / 10
    else:  # from every bin into the first
        f[1:] -= tv / 19
        f[0] += tv
    views = anytime.coarsenings(20)
    caught = 0
    for _ in range(20):
        cells = rng.choice(20, size=bound, p=f)
        caught += bool(np.any(anytime.multiscale_path(cells, np.zeros(20), UNIFORM, views) >= np.log(100)))
    assert caught >= 19


def test_the_views_keep_the_bound():
    # the average of the views' e-processes is an e-process: a correct stream rarely reaches 1 / alpha
    rng = np.random.default_rng(3)
    views = anytime.coarsenings(20)
    assert len(views) == 4 + 20
    alarms = sum(bool(np.any(anytime.multiscale_path(rng.integers(0, 20, 5_000), np.zeros(20), UNIFORM, views)
                             >= np.log(20))) for _ in range(200))
    assert sps.binomtest(alarms, 200, 0.05, alternative="greater").pvalue > 1e-3, alarms
    counts = np.bincount(rng.integers(0, 20, 777), minlength=20)
    path = anytime.multiscale_path(rng.integers(0, 20, 10), counts, UNIFORM, views)
    assert np.isfinite(path).all() and path.shape == (10,)


def test_the_betting_process_catches_a_drifted_acceptance_and_sums_across_batches():
    rng = np.random.default_rng(2)
    mu = rng.uniform(0.2, 0.8, 30_000)
    x = (rng.random(mu.size) < mu + 0.03).astype(float)  # accepted 3 points more often than the rule says
    w = anytime.betting_log_wealth(x[:10_000], mu[:10_000]) + anytime.betting_log_wealth(x[10_000:], mu[10_000:])
    np.testing.assert_allclose(w, anytime.betting_log_wealth(x, mu), rtol=1e-9)
    assert anytime.betting_log_e(w) > np.log(1e4)
    path = anytime.betting_path(x, mu, np.zeros(anytime.BETS.size))
    assert path[-1] == pytest.approx(anytime.betting_log_e(w), rel=1e-9)
