"""stats: context transitions, two-sample, acceptance theory, multiplicity, power, layering."""

import itertools
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats as sps

import stats


# --- context ---------------------------------------------------------------------------

def _markov_counts(rng, table, n_steps):
    v = table.shape[1]
    counts = np.zeros_like(table, dtype=np.int64)
    s = 0
    for _ in range(n_steps):
        x = rng.choice(v, p=table[s])
        counts[s, x] += 1
        s = x
    return counts


def test_transition_test_calibrated_and_powerful(rng):
    table = rng.dirichlet(np.ones(4), size=4)
    pvals = [stats.transition_test(_markov_counts(rng, table, 800), table).pvalue for _ in range(200)]
    assert stats.uniformity_test(pvals).pvalue > 1e-3
    other = 0.8 * table + 0.2 * rng.dirichlet(np.ones(4), size=4)
    r = stats.transition_test(_markov_counts(rng, other, 20000), table)
    assert r.pvalue < 1e-6 and r.dof > 0


def test_transition_support_violation():
    table = np.array([[1.0, 0.0], [0.5, 0.5]])
    r = stats.transition_test(np.array([[5, 1], [3, 3]]), table)
    assert r.pvalue == 0.0 and r.violations.tolist() == [[0, 1]]


# --- two-sample ------------------------------------------------------------------------

def test_homogeneity_matches_scipy_without_pooling(rng):
    a, b = rng.multinomial(5000, [0.2, 0.3, 0.5]), rng.multinomial(4000, [0.2, 0.3, 0.5])
    r = stats.homogeneity_test(a, b)
    ref = sps.chi2_contingency(np.array([a, b]), correction=False)
    assert r.pvalue == pytest.approx(ref.pvalue)


def test_homogeneity_calibrated_and_detects(rng):
    p = rng.dirichlet(np.full(30, 0.5))
    pv = [stats.homogeneity_test(rng.multinomial(500, p), rng.multinomial(700, p)).pvalue for _ in range(300)]
    assert np.mean(np.array(pv) < 0.05) < 0.09
    q = 0.9 * p + 0.1 * rng.dirichlet(np.ones(30))
    assert stats.homogeneity_test(rng.multinomial(50000, p), rng.multinomial(50000, q)).pvalue < 1e-6


# --- acceptance theory --------------------------------------------------------------------

@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_accepted_law_by_enumeration(alpha, k):
    # enumerate the k Bernoulli(alpha) acceptance outcomes; J = leading successes
    law = np.zeros(k + 1)
    for outcome in itertools.product([0, 1], repeat=k):
        j = next((i for i, o in enumerate(outcome) if not o), k)
        law[j] += np.prod([alpha if o else 1 - alpha for o in outcome])
    np.testing.assert_allclose(stats.accepted_drafts_law(alpha, k), law, atol=1e-12)
    assert stats.expected_tokens_per_round(alpha, k) == pytest.approx(np.sum(law * (np.arange(k + 1) + 1)))


def test_acceptance_probability_is_one_minus_tv(rng):
    p, q = rng.dirichlet(np.ones(9)), rng.dirichlet(np.ones(9))
    assert stats.acceptance_probability(p, q) == pytest.approx(1 - 0.5 * np.abs(p - q).sum())
    # and equals the per-token rates averaged over draws from q
    assert np.nansum(q * stats.per_token_acceptance(p, q)) == pytest.approx(stats.acceptance_probability(p, q))


def test_walltime_and_best_k():
    # Leviathan et al. (2023), Figure 3 regime: alpha = 0.8, c = 0.05
    imp = [stats.walltime_improvement(0.8, k, 0.05) for k in range(1, 30)]
    assert stats.optimal_draft_length(0.8, 0.05) == int(np.argmax(imp)) + 1
    assert stats.walltime_improvement(0.0, 3, 0.1) == pytest.approx(1 / 1.3)


def test_per_token_acceptance_test_sides(rng):
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    rates = stats.per_token_acceptance(p, q)
    drafted = rng.multinomial(200000, q)
    ok = stats.per_token_acceptance_test(drafted, rng.binomial(drafted, rates), rates)
    assert ok.pvalue > 1e-4
    bad = stats.per_token_acceptance_test(drafted, rng.binomial(drafted, np.minimum(1, rates * 1.05)), rates)
    assert bad.pvalue < 1e-6
    # a token with rate 1 rejected once is a hard violation
    r1 = np.where(np.isnan(rates), 0, rates)
    r1[0] = 1.0
    acc = rng.binomial(drafted, r1)
    acc[0] = drafted[0] - 1
    assert stats.per_token_acceptance_test(drafted, acc, r1).pvalue == 0.0


# --- multiplicity -----------------------------------------------------------------------------

def test_holm_and_bh_against_definitions(rng):
    p = rng.random(20) ** 3
    h = stats.holm(p, 0.05)
    order = np.argsort(p)
    manual = np.maximum.accumulate([min(1, (20 - i) * p[j]) for i, j in enumerate(order)])
    np.testing.assert_allclose(h.adjusted[order], manual)
    bh = stats.benjamini_hochberg(p, 0.05)
    np.testing.assert_allclose(bh.adjusted, sps.false_discovery_control(p, method="bh"))


def test_uniformity_and_rejection_rate(rng):
    assert stats.uniformity_test(rng.random(500)).pvalue > 1e-3
    assert stats.uniformity_test(rng.random(500) ** 2).pvalue < 1e-6
    r = stats.rejection_rate(3, 100, 0.01)
    assert r.low < 0.03 < r.high


# --- power --------------------------------------------------------------------------------------

def test_noncentrality_bound_by_tv(rng):
    for _ in range(50):
        p0, p1 = rng.dirichlet(np.ones(7)), rng.dirichlet(np.ones(7))
        tv = 0.5 * np.abs(p0 - p1).sum()
        assert stats.noncentrality(p0, p1, 1000) >= 4 * 1000 * tv**2 - 1e-9


def test_sample_size_and_min_tv_are_inverse():
    n = stats.samples_for_tv(0.005, dof=7, alpha=1e-4, power=0.99).n
    assert stats.min_detectable_tv(n, 7, 1e-4, 0.99).tv == pytest.approx(0.005, rel=1e-3)


def test_power_prediction_matches_simulation(rng):
    """A chosen alternative is rejected at the rate the noncentral chi-square predicts."""
    p0 = np.array([0.1, 0.2, 0.3, 0.4])
    p1 = np.array([0.12, 0.19, 0.3, 0.39])
    n, alpha, trials = 2000, 0.01, 2000
    pred = stats.chisquare_power(p0, p1, n, alpha).power
    assert 0.3 < pred < 0.8  # an informative regime
    hits = sum(stats.goodness_of_fit(rng.multinomial(n, p1), p0).pvalue < alpha for _ in range(trials))
    lo, hi = sps.binomtest(hits, trials).proportion_ci(0.999)
    assert lo - 0.03 <= pred <= hi + 0.03, (hits / trials, pred)
    nulls = sum(stats.goodness_of_fit(rng.multinomial(n, p0), p0).pvalue < alpha for _ in range(trials))
    assert stats.rejection_rate(nulls, trials, alpha).pvalue > 1e-3


def test_stats_does_not_import_jax():
    code = "import sys, stats; stats.goodness_of_fit([5, 5], [0.5, 0.5]); print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_power_helpers_say_why_there_is_no_test():
    import math

    import stats

    r = stats.min_detectable_tv(1000, 0)
    assert math.isnan(r.tv) and "fewer than two pooled cells" in r.reason
    s = stats.samples_for_tv(0.01, 0)
    assert s.n == 0 and "support check" in s.reason
    assert stats.min_detectable_tv(97228, 9).reason == ""


def test_bernoulli_sum_test_holds_its_level_and_sees_a_shift():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.05, 0.95, 400)
    n = rng.integers(1, 6, 400)
    null = [stats.bernoulli_sum_test(rng.binomial(n, p), n, p).pvalue for _ in range(2000)]
    assert abs(np.mean(np.array(null) < 0.05) - 0.05) < 0.015  # calibrated with 1-5 trials per group
    shifted = stats.bernoulli_sum_test(rng.binomial(n, np.clip(p - 0.08, 0, 1)), n, p)
    assert shifted.pvalue < 1e-4 and shifted.statistic < 0
    certain = stats.bernoulli_sum_test([3, 0], [3, 2], [1.0, 0.0])
    assert certain.pvalue == 1.0
    assert stats.bernoulli_sum_test([2, 0], [3, 2], [1.0, 0.0]).pvalue == 0.0
    with pytest.raises(ValueError, match="one shape"):
        stats.bernoulli_sum_test([1], [1, 2], [0.5, 0.5])
