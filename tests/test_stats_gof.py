"""stats.gof: pooling, Pearson/G against scipy, Monte Carlo p-values, support, KL, TV."""

import numpy as np
import pytest
from scipy import stats as sps

import stats


def test_pooling_depends_on_probs_only_and_reaches_min_expected(rng):
    p = rng.dirichlet(np.full(50, 0.3))
    plan = stats.pool_cells(p, n=400)
    assert np.all(plan.probs * 400 >= 5 - 1e-9)
    assert plan.probs.sum() == pytest.approx(1.0)
    # every positive cell is in exactly one group; zero cells are left out
    p0 = p.copy()
    p0[:5] = 0
    p0 /= p0.sum()
    plan0 = stats.pool_cells(p0, n=400)
    assert np.all(plan0.groups[:5] == -1) and np.all(plan0.groups[5:] >= 0)


def test_pooling_is_the_greedy_loop_s_to_the_bit(rng):
    """The small cells' groups come from windows of running sums (stats.gof._greedy_groups): the same
    groups as one step per cell, on laws of few and of very many tiny cells, zeros included."""
    from stats.gof import _greedy_groups

    def laws():
        for _ in range(300):
            v = int(rng.integers(2, 20_000))
            p = rng.dirichlet(np.full(v, rng.choice([0.01, 0.1, 1.0, 10.0])))
            p[rng.random(v) < 0.1] = 0.0
            yield p, 5.0 / int(rng.integers(10, 10**6))
        yield np.full(4096, 2.0**-12), 2.0**-7  # sums that reach the threshold exactly: 32 cells a group
        yield np.full(4096, 2.0**-12), 3 * 2.0**-12 + 2.0**-40  # three cells fall short, four pass it

    for p, threshold in laws():
        v = p.size
        small = np.argsort(p, kind="stable")
        small = small[p[small] > 0]
        small = small[p[small] < threshold]
        want, g, acc = np.full(v, -1), 0, 0.0
        for c in small:
            want[c] = g
            acc += p[c]
            if acc >= threshold:
                g, acc = g + 1, 0.0
        got = np.full(v, -1)
        assert _greedy_groups(p, small, threshold, got) == (g, acc)
        assert np.array_equal(got, want)


def test_pooling_keeps_large_cells_alone():
    plan = stats.pool_cells([0.25] * 4, n=1000)
    assert plan.n_groups == 4


@pytest.mark.parametrize("statistic,lam", [("pearson", "pearson"), ("g", "log-likelihood")])
def test_unpooled_statistic_matches_scipy(rng, statistic, lam):
    p = rng.dirichlet(np.ones(10))
    counts = rng.multinomial(5000, p)
    r = stats.goodness_of_fit(counts, p, statistic=statistic)
    ref = sps.power_divergence(counts, 5000 * p, lambda_=lam)
    assert r.cells == 10
    assert r.statistic == pytest.approx(ref.statistic)
    assert r.pvalue == pytest.approx(ref.pvalue)


def test_support_violation_is_a_hard_zero_pvalue():
    r = stats.goodness_of_fit([10, 10, 1], [0.5, 0.5, 0.0])
    assert r.pvalue == 0.0 and r.method == "support"
    s = stats.support_check([10, 10, 1], [0.5, 0.5, 0.0])
    assert not s.passed and s.violations.tolist() == [2] and s.count == 1


def test_monte_carlo_used_when_too_few_samples_and_agrees_with_exact():
    p = np.array([0.7, 0.2, 0.1])
    counts = np.array([1, 2, 1])  # n = 4: no chi-square approximation possible
    r = stats.goodness_of_fit(counts, p, seed=0, mc_samples=20000)
    assert r.method == "monte-carlo"
    # exact: sum of multinomial probabilities of tables at least as extreme
    from itertools import product

    stat = lambda c: np.sum((np.array(c) - 4 * p) ** 2 / (4 * p))  # noqa: E731
    obs = stat(counts)
    exact = sum(sps.multinomial.pmf(c, 4, p) for c in product(range(5), repeat=3)
                if sum(c) == 4 and stat(c) >= obs - 1e-12)
    assert r.pvalue == pytest.approx(exact, abs=0.01)


def test_null_rejection_rate_is_about_alpha(rng):
    p = rng.dirichlet(np.full(20, 0.5))  # many small cells: pooling matters
    n, alpha, trials = 300, 0.05, 2000
    rejections = sum(stats.goodness_of_fit(rng.multinomial(n, p), p).pvalue < alpha for _ in range(trials))
    r = stats.rejection_rate(rejections, trials, alpha, alternative="greater")
    assert r.pvalue > 1e-3, f"false-alarm rate {r.rate:.3f} exceeds {alpha}"
    assert r.rate > 0.02  # not absurdly conservative either


def test_kl_ties_to_g_and_bias_is_corrected(rng):
    p = rng.dirichlet(np.ones(12))
    counts = rng.multinomial(2000, p)
    r = stats.kl_divergence(counts, p)
    assert r.g_statistic == pytest.approx(2 * 2000 * r.statistic)
    assert r.bias == pytest.approx(11 / 4000)
    corrected = [stats.kl_divergence(rng.multinomial(2000, p), p).corrected for _ in range(400)]
    assert abs(np.mean(corrected)) < 3 * np.std(corrected) / np.sqrt(400) + 1e-4


def test_tv_upper_bound_covers_truth(rng):
    p = rng.dirichlet(np.ones(6))
    covered = [stats.total_variation(rng.multinomial(1000, p), p).upper >= 0 for _ in range(200)]
    assert all(covered)
    r = stats.total_variation(rng.multinomial(100000, p), p)
    assert r.statistic < r.upper < 0.05


@pytest.mark.parametrize("bad,msg", [
    ([0.5, 0.6], "not normalised"),
    ([1.5, -0.5], "negative"),
    ([np.nan, 1.0], "NaN"),
])
def test_bad_probabilities_raise_one_clear_error(bad, msg):
    with pytest.raises(ValueError, match=msg):
        stats.goodness_of_fit([1, 1], bad)


def test_shape_mismatch_and_bad_counts():
    with pytest.raises(ValueError, match="shape"):
        stats.goodness_of_fit([1, 2, 3], [0.5, 0.5])
    with pytest.raises(ValueError, match="negative"):
        stats.goodness_of_fit([-1, 2], [0.5, 0.5])
    with pytest.raises(ValueError, match="whole numbers"):
        stats.goodness_of_fit([1.5, 2], [0.5, 0.5])
    with pytest.raises(ValueError, match="unknown statistic"):
        stats.goodness_of_fit([1, 2], [0.5, 0.5], statistic="kl")


@pytest.mark.parametrize("statistic, scipy_name", [("pearson", "pearson"), ("g", "log-likelihood")])
def test_the_chi_square_limit_is_scipy_s_power_divergence_to_the_bit(statistic, scipy_name):
    # the pooled test computes what scipy.stats.power_divergence does, without its per-call wrapper
    from stats.gof import _LAMBDAS, _chi2_limit

    rng = np.random.default_rng(7)
    for _ in range(500):
        m = int(rng.integers(2, 300))
        p = rng.dirichlet(np.full(m, rng.uniform(0.05, 3.0))) + 1e-12  # pooled groups have mass
        p /= p.sum()
        obs = rng.multinomial(int(rng.integers(5, 10**7)), p).astype(np.float64)
        exp = p * obs.sum()
        exp *= obs.sum() / exp.sum()
        ours = _chi2_limit(obs, exp, _LAMBDAS[statistic])
        theirs = sps.power_divergence(obs, exp, lambda_=scipy_name)
        assert (float(ours[0]), float(ours[1])) == (float(theirs.statistic), float(theirs.pvalue))
