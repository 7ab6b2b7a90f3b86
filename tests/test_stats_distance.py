"""stats.distance: intervals that cover the exact TV at their stated rate, a bias-corrected estimate, certificates."""

import numpy as np
import pytest

from stats import distance


def _coverage(law, p, n, reps, alpha, seed):
    truth = 0.5 * np.abs(law - p).sum()
    rng = np.random.default_rng(seed)
    low = high = 0
    for _ in range(reps):
        r = distance.tv_interval(rng.multinomial(n, law), p, alpha)
        low += r.lower > truth
        high += r.upper < truth
    return low, high


@pytest.mark.parametrize("vocab, shift", [(8, 0.0), (8, 0.05), (300, 0.0), (300, 0.05)])
def test_intervals_cover_the_exact_distance_at_their_stated_rate(vocab, shift):
    # alpha 0.2 so that a miscalibrated interval shows in 300 repetitions; each end may miss at most alpha
    rng = np.random.default_rng(vocab)
    p = rng.dirichlet(np.ones(vocab))
    law = (1 - shift) * p + shift * rng.dirichlet(np.ones(vocab))
    low, high = _coverage(law, p, 5_000, 300, 0.2, seed=1)
    limit = 0.2 * 300 + 3 * np.sqrt(300 * 0.2 * 0.8)
    assert low + high <= limit, (low, high)


def test_tail_mass_moved_to_a_block_of_ids_is_covered_and_bounded_away_from_zero():
    # an adversarial shape at a 32k vocabulary: the rarest tokens (0.05 of the mass) emptied into ten ids
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(32_768))
    order = np.argsort(p)
    tail = order[: np.searchsorted(np.cumsum(p[order]), 0.05)]
    law = p.copy()
    law[tail] = 0.0
    law[order[-10:]] += p[tail].sum() / 10
    assert 0.049 < 0.5 * np.abs(law - p).sum() <= 0.05
    r = distance.tv_interval(rng.multinomial(1 << 18, law), p, 0.01)
    assert r.method == "mcdiarmid" and r.lower > 0.03 and r.lower <= 0.5 * np.abs(law - p).sum() <= r.upper


def test_the_estimate_removes_the_plugin_bias_at_a_serving_vocabulary():
    rng = np.random.default_rng(4)
    p = rng.dirichlet(np.ones(32_768))
    r = distance.tv_interval(rng.multinomial(1 << 18, p), p, 0.01)
    assert r.plugin > 0.1  # about sqrt(V / n) / 2: what the plug-in reports for a correct sampler
    assert r.estimate < 0.01 and r.lower == 0.0


@pytest.mark.parametrize("vocab, n", [(8, 100_000), (1000, 100_000)])
def test_the_estimate_errs_by_less_than_the_plugins_null_bias(vocab, n):
    # the plug-in errs by up to E_p T (its mean for a correct sampler); the estimate by less, whether the
    # deviation is absent, spread over every token or within the noise of each
    from stats.identity import tv_null_mean

    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.ones(vocab))
    bias = tv_null_mean(p, n)
    for shift in (0.0, 0.02, 0.1):
        law = (1 - shift) * p + shift * rng.dirichlet(np.ones(vocab))
        truth = 0.5 * np.abs(law - p).sum()
        est = np.mean([distance.tv_estimate(rng.multinomial(n, law), p) for _ in range(40)])
        assert abs(est - truth) < bias, (shift, est, truth, bias)
        if shift == 0.0:
            assert est < bias / 3


def test_mass_outside_the_support_counts_in_full():
    p = np.array([0.5, 0.5, 0.0])
    r = distance.tv_interval(np.array([450, 450, 100]), p, 0.01)
    assert r.estimate == pytest.approx(0.1, abs=0.01) and r.lower > 0.05
    assert distance.kl_estimate([450, 450, 100], p).estimate == np.inf


def test_kl_estimate_and_pinsker():
    p = np.full(4, 0.25)
    counts = np.random.default_rng(0).multinomial(100_000, p)
    k = distance.kl_estimate(counts, p)
    assert abs(k.estimate) < 1e-4
    assert np.isnan(distance.kl_estimate([3, 2, 1, 1], p).estimate)  # n < 10 cells: no bias correction
    tv = distance.tv_interval(np.array([60_000, 40_000, 0, 0]), p, 0.01)
    assert distance.kl_estimate([60_000, 40_000, 0, 0], p, tv).lower == pytest.approx(2 * tv.lower**2)


def test_certify_reads_the_family():
    iv = lambda est, lo, hi: distance.TVInterval(est, lo, hi, est, 1000, "sets", 0.99)  # noqa: E731
    assert distance.certify([iv(0.0, 0.0, 0.01), iv(0.0, 0.0, 0.02)], 0.05).verdict == "within"
    beyond = distance.certify([iv(0.0, 0.0, 0.01), iv(0.2, 0.1, 0.3)], 0.05)
    assert beyond.verdict == "beyond" and beyond.worst == 1
    und = distance.certify([iv(0.01, 0.0, 0.04), iv(0.02, 0.0, 0.08)], 0.05)
    assert und.verdict == "undecided" and und.worst == 1 and und.growth == pytest.approx((0.06 / 0.03) ** 2)
    assert distance.certify([iv(0.06, 0.0, 0.08)], 0.05).growth == np.inf
    with pytest.raises(ValueError, match="tolerance must lie"):
        distance.certify([iv(0, 0, 0.1)], 1.5)
    with pytest.raises(ValueError, match="nothing to certify"):
        distance.certify([], 0.1)


@pytest.mark.parametrize("vocab", [8, 500])
def test_sequences_to_certify_holds_its_power(vocab):
    p = np.random.default_rng(vocab).dirichlet(np.ones(vocab))
    tol, a = (0.06, 0.001) if vocab == 8 else (0.3, 0.001)
    n = distance.sequences_to_certify(p, tol, a, power=0.8)
    rng = np.random.default_rng(99)
    certified = np.mean([distance.tv_interval(rng.multinomial(n, p), p, a).upper <= tol for _ in range(150)])
    assert certified >= 0.7, certified  # 0.8 planned; 150 draws
    smaller = np.mean([distance.tv_interval(rng.multinomial(n // 4, p), p, a).upper <= tol for _ in range(50)])
    assert smaller < certified  # the size is not a formality


def test_bad_inputs_get_one_line():
    with pytest.raises(ValueError, match="shape"):
        distance.tv_interval([1, 2], [0.5, 0.25, 0.25])
    with pytest.raises(ValueError, match="'mcdiarmid'"):
        distance.tv_interval(np.ones(20, int), np.full(20, 0.05), method="sets")
    with pytest.raises(ValueError, match="unknown method"):
        distance.tv_interval([1, 2], [0.5, 0.5], method="bootstrap")
    with pytest.raises(ValueError, match="not normalised"):
        distance.tv_interval([1, 2], [0.5, 0.6])
