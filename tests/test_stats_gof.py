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


def _brute_two_cell(counts, p, statistic):
    """The exact two-cell p-value by enumeration: every table (x, n - x) and its binomial probability."""
    from stats.gof import _LAMBDAS, _at_least, _divergence_stat

    n = int(sum(counts))
    exp = np.asarray(p, np.float64) * n
    x = np.arange(n + 1)
    tables = np.stack([x, n - x], axis=1)
    stat = _divergence_stat(tables, exp, _LAMBDAS[statistic])
    obs = float(_divergence_stat(np.asarray(counts), exp, _LAMBDAS[statistic]))
    pmf = sps.binom.pmf(x, n, p[0])
    return float(min(1.0, pmf[stat >= _at_least(obs)].sum())), float(pmf[stat >= _at_least(stat.max())].sum())


@pytest.mark.parametrize("statistic", ["pearson", "g"])
def test_two_cells_get_the_exact_p_value_of_every_table_at_least_as_extreme(statistic):
    # the bisection over the convex statistic against enumerating all n + 1 tables, ties included (p = 0.5)
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(400):
        n = int(rng.integers(1, 400))
        share = 0.5 if rng.uniform() < 0.2 else float(rng.choice([rng.uniform(1e-4, 0.05), rng.uniform(0.05, 0.95)]))
        p = np.array([share, 1.0 - share])
        x = int(rng.binomial(n, share)) if rng.uniform() < 0.7 else int(rng.integers(0, n + 1))
        r = stats.goodness_of_fit([x, n - x], p, statistic=statistic, method="exact")
        checked += r.method == stats.goodness_of_fit([x, n - x], p, statistic=statistic).method  # "auto" too
        pvalue, floor = _brute_two_cell([x, n - x], p, statistic)
        assert r.pvalue == pytest.approx(pvalue, rel=1e-9, abs=1e-300), (n, share, x)
        assert r.floor == pytest.approx(floor, rel=1e-9, abs=1e-300)
    assert checked > 100


def test_two_cells_exact_agrees_with_simulation_and_a_zero_probability_cell_is_ignored():
    r = stats.goodness_of_fit([97, 3, 0], [0.99, 0.01, 0.0])
    mc = stats.goodness_of_fit([97, 3, 0], [0.99, 0.01, 0.0], method="monte-carlo", seed=0, mc_samples=400_000)
    assert r.method == "exact" and r.dof == 1 and mc.method == "monte-carlo"
    assert abs(r.pvalue - mc.pvalue) < 4 * np.sqrt(r.pvalue / 400_000)
    assert stats.goodness_of_fit([5, 0], [1.0, 0.0]).pvalue == 1.0  # one possible table
    with pytest.raises(ValueError, match="two cells of positive probability, got 3"):
        stats.goodness_of_fit([1, 1, 1], [0.5, 0.25, 0.25], method="exact")


def test_floor_is_the_p_value_of_the_most_extreme_table():
    # asymptotic: every observation in the least likely pooled group
    p = np.array([0.5, 0.3, 0.15, 0.05])
    r = stats.goodness_of_fit([50, 30, 15, 5], p)
    assert r.method == "asymptotic"
    assert r.floor == pytest.approx(stats.goodness_of_fit([0, 0, 0, 100], p).pvalue, rel=1e-6)
    # simulated: 1 / (simulations + 1), however many min_pvalue asks for
    q = np.array([0.98, 0.01, 0.01])
    assert stats.goodness_of_fit([99, 1, 0], q, seed=0).floor == 1e-4
    assert stats.goodness_of_fit([99, 1, 0], q, seed=0, min_pvalue=1e-6).floor == 1e-6
    assert stats.goodness_of_fit([99, 1, 0], q, seed=0, min_pvalue=1e-12).floor == 1 / (stats.gof.MAX_MC_SAMPLES + 1)


def test_min_pvalue_refines_only_a_p_value_at_its_floor_and_continues_the_same_stream():
    q = np.array([0.98, 0.01, 0.01])
    null = [99, 1, 0]  # an ordinary table: its first-stage p-value stands
    first_stage = stats.goodness_of_fit(null, q, seed=3).pvalue
    assert stats.goodness_of_fit(null, q, seed=3, min_pvalue=1e-6).pvalue == first_stage
    # a table rarer than 1 in 10^4: at the floor after 9,999 simulations, refined past it (one of 999,999 reaches it)
    rare = [88, 7, 5]
    first = stats.goodness_of_fit(rare, q, seed=5)
    assert first.pvalue == 1e-4
    refined = stats.goodness_of_fit(rare, q, seed=5, min_pvalue=1e-6)
    # the refinement draws in chunks; one draw of all 999,999 tables from the seed gives the same p-value
    from stats.gof import _at_least, _divergence_stat

    sims = np.random.default_rng(5).multinomial(100, q, size=999_999)
    hits = np.sum(_divergence_stat(sims, q * 100, 1.0) >= _at_least(refined.statistic))
    assert refined.pvalue == (1 + hits) / 1e6 and 0 < hits < 100
    far = stats.goodness_of_fit([70, 15, 15], q, seed=5, min_pvalue=1e-6)  # beyond every simulation
    assert far.pvalue == 1e-6 and far.pvalue <= far.floor
    with pytest.raises(ValueError, match="min_pvalue"):
        stats.goodness_of_fit(rare, q, min_pvalue=0.0)


def test_refined_monte_carlo_p_values_stay_valid():
    # few first simulations and a refinement: under the null, P(p <= a) <= a at every a (the two-stage rule is
    # valid), and a wrong law is still rejected. A p-value over the refined count without the refinement's draws
    # ((1 + hits) / 400 where only 19 were drawn) fails it
    q = np.array([0.6, 0.3, 0.1])
    rng = np.random.default_rng(2)
    trials = 3000
    pv = np.array([stats.goodness_of_fit(rng.multinomial(12, q), q, seed=int(s), mc_samples=19,
                                         min_pvalue=1 / 400).pvalue for s in range(trials)])
    for a in (1 / 400, 0.01, 0.05, 0.2):
        r = stats.rejection_rate(int(np.sum(pv <= a)), trials, a, alternative="greater")
        assert r.pvalue > 1e-3, (a, r.rate)
    wrong = [stats.goodness_of_fit(rng.multinomial(12, [0.2, 0.3, 0.5]), q, seed=int(s), mc_samples=19,
                                   min_pvalue=1 / 400).pvalue for s in range(200)]
    assert np.mean(np.array(wrong) <= 0.01) > 0.5


def test_min_pvalue_of_one_over_b_plus_one_draws_b_simulations():
    # 1 / (1 / (B + 1)) is a hair above B + 1 for some B (11,646 and 11,712 among them): still B simulations
    q = np.array([0.98, 0.01, 0.01])
    for b in (11_646, 11_712, 99_999):
        assert stats.goodness_of_fit([70, 15, 15], q, seed=0, min_pvalue=1 / (b + 1)).pvalue == 1 / (b + 1)


def test_simulation_in_chunks_gives_one_call_s_p_value():
    # 1,200 cells x 9,999 tables is 12 million counts, drawn 3,495 tables at a time: the same draws
    from stats.gof import _at_least, _divergence_stat

    rng = np.random.default_rng(4)
    p = rng.dirichlet(np.full(1200, 0.5))
    counts = rng.multinomial(8, p)  # 8 observations over 1,200 cells: fewer than two pooled cells
    r = stats.goodness_of_fit(counts, p, seed=9)
    assert r.method == "monte-carlo" and r.cells == 1200
    sims = np.random.default_rng(9).multinomial(8, p, size=9999)
    hits = np.sum(_divergence_stat(sims, p * 8, 1.0) >= _at_least(r.statistic))
    assert r.pvalue == (1 + hits) / 10_000
