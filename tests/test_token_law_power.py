"""Claims that hold for the token law (stats.identity): every stated min detectable TV is tested against
adversarial deviations of exactly that TV, at V = 8, 32,768 and 131,072: mass moved inside the pooled
chi-square's cells, between blocks of token ids, among tail tokens, by rank (tempering) and to a wrong
row, and the token chi-square's own least favourable law. Each must be detected at the stated rate (0.99,
within simulation error) by the tests the battery makes of such a law (the pooled chi-square, and at large
V the token chi-square), at a Holm level."""

import os

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as sps

import stats
from stats import identity

MIN_EXPECTED = 100.0  # the battery's pooling threshold (specsample.battery.MIN_EXPECTED)
LEVEL = 1e-4  # a Holm level of a run of about 100 tests at alpha = 0.01


def test_the_binomial_mean_deviation_is_exact():
    for n, p in [(10, 0.3), (100, 0.01), (7, 0.9), (1000, 1e-4), (5, 1.0), (5, 0.0)]:
        k = np.arange(n + 1)
        brute = float((sps.binom.pmf(k, n, p) * np.abs(k - n * p)).sum())
        assert float(identity.binomial_mad(n, p)) == pytest.approx(brute, rel=1e-9, abs=1e-15)


def test_the_tv_test_keeps_its_level_and_refuses_bad_input():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(2000))
    pv = np.array([identity.tv_identity_test(rng.multinomial(20_000, p), p).pvalue for _ in range(300)])
    assert np.mean(pv <= 0.05) <= 0.05  # McDiarmid's bound: conservative at any n and V
    with pytest.raises(ValueError, match="non-negative"):
        identity.tv_identity_test([1, -1], [0.5, 0.5])
    assert identity.tv_identity_test([0, 0], [0.5, 0.5]).pvalue == 1.0


def _law(family: str, vocab: int, rng) -> np.ndarray:
    if family == "dirichlet":
        return rng.dirichlet(np.ones(vocab))
    logits = rng.standard_normal(vocab) * 2.5 / 0.8  # a tokenizer-sized softmax: many near-zero tokens
    p = np.exp(logits - logits.max())
    return p / p.sum()


def _tv(a, b):
    return 0.5 * float(np.abs(a - b).sum())


def deviations(p: np.ndarray, eps: float, n: int, rng) -> dict:
    """Laws at total variation exactly ``eps`` from ``p``, each of a shape a real bug has."""
    out = {}
    # inside pooled cells: each merged cell's mass onto its largest token (invisible to the pooled test),
    # the rest of eps as the pooled law's least detectable shift (proportional to p, half up, half down)
    plan = stats.pool_cells(p, n, MIN_EXPECTED)
    g = plan.groups
    sizes = np.bincount(g[g >= 0], minlength=plan.n_groups)
    q, hidden = p.copy(), 0.0
    for c in np.flatnonzero(sizes >= 2):
        idx = np.flatnonzero(g == c)
        j = idx[np.argmax(p[idx])]
        hidden += p[idx].sum() - p[j]
        q[idx], q[j] = 0.0, p[idx].sum()
    if hidden >= eps:
        q = p + (q - p) * (eps / hidden)
    else:
        cum = np.cumsum(plan.probs)
        up = cum <= cum[-1] / 2
        rest = eps - hidden
        fac = np.where(up, 1 + rest / plan.probs[up].sum(), 1 - rest / plan.probs[~up].sum())
        q = q * np.where(g >= 0, fac[np.maximum(g, 0)], 1.0)
    out["inside pooled cells"] = q
    half = p.size // 2  # between blocks of ids: the first half gains what the second loses
    q = p.copy()
    q[:half] *= 1 + eps / p[:half].sum()
    q[half:] *= 1 - eps / p[half:].sum()
    out["between id blocks"] = q
    tail = np.argsort(p, kind="stable")[: p.size // 2]  # among the tail: odd ids give to even ones
    ev, od = tail[tail % 2 == 0], tail[tail % 2 == 1]
    q = p.copy()
    if eps <= min(p[od].sum(), p[ev].sum()):
        q[ev] *= 1 + eps / p[ev].sum()
        q[od] *= 1 - eps / p[od].sum()
    else:  # a light tail: all of its odd mass, and the rest from the head, to its even tokens
        moved, head = p[od].sum(), np.setdiff1d(np.arange(p.size), tail)
        q[od] = 0.0
        q[head] *= 1 - (eps - moved) / p[head].sum()
        q[ev] += eps * p[ev] / p[ev].sum()
    out["among tail tokens"] = q

    def tempered(beta):
        w = p ** beta
        return w / w.sum()

    out["by rank (tempering)"] = tempered(optimize.brentq(lambda b: _tv(tempered(b), p) - eps, 1.0, 4.0))
    r = rng.dirichlet(np.ones(p.size))
    out["a wrong row"] = p + (r - p) * (eps / _tv(r, p))
    out["token chi-square's least favourable"] = token_least_favourable(p, eps, n)
    for name, q in out.items():
        assert abs(_tv(q, p) - eps) < 1e-9 + 1e-6 * eps and np.all(q >= 0), name
    return out


def token_least_favourable(p: np.ndarray, eps: float, n: int) -> np.ndarray:
    """The law at TV ``eps`` the token chi-square sees least: the rest cell's mass onto its largest token
    (unseen), the remainder proportional to p over the cells, gained by the smallest cells up to half the
    mass (the largest variance for the least chi-square distance)."""
    cell, cp, rest = identity._token_cells(p, n, identity.TOKEN_MIN_EXPECTED)
    q, hidden = p.copy(), 0.0
    r = np.flatnonzero(cell == cp.size - 1) if rest > 0 else np.zeros(0, np.int64)
    if r.size >= 2:
        j = r[np.argmax(p[r])]
        hidden = p[r].sum() - p[j]
        q[r], q[j] = 0.0, p[r].sum()
    if hidden >= eps:
        return p + (q - p) * (eps / hidden)
    lone = cp.size - (r.size >= 2)  # the cells of one token each (the rest cell, if any, is the last)
    order = np.argsort(cp[:lone], kind="stable")
    up = np.zeros(lone, bool)
    up[order[np.cumsum(cp[order]) <= cp[:lone].sum() / 2]] = True
    fac = np.ones(cp.size)
    fac[:lone] = np.where(up, 1 + (eps - hidden) / cp[:lone][up].sum(), 1 - (eps - hidden) / cp[:lone][~up].sum())
    return np.where(cell >= 0, q * fac[np.maximum(cell, 0)], q)


CASES = [(8, "dirichlet", 20_000, 200), (32_768, "dirichlet", 1 << 18, 80),
         pytest.param(32_768, "softmax", 1_000_000, 40, marks=pytest.mark.long),
         pytest.param(32_768, "dirichlet", 10_000_000, 40, marks=pytest.mark.long),
         pytest.param(131_072, "softmax", 10_000_000, 100, marks=pytest.mark.long),
         pytest.param(131_072, "dirichlet", 30_000_000, 100, marks=pytest.mark.long)]


@pytest.mark.parametrize("vocab, family, n, reps", CASES)
def test_every_stated_min_tv_holds_against_adversarial_deviations(vocab, family, n, reps):
    rng = np.random.default_rng(vocab + n)
    p = _law(family, vocab, rng)
    token_test = vocab > 4096  # as the battery: the token chi-square beside the pooled one at large V
    claim = identity.token_min_tv(p, n, LEVEL, 0.99, MIN_EXPECTED, token_test=token_test)
    assert 0 < claim.tv < 1 and claim.test == ("chi2" if token_test else "pooled")
    for shape, q in deviations(p, claim.tv, n, rng).items():
        missed = 0
        for _ in range(reps):
            c = rng.multinomial(n, q)
            hit = stats.goodness_of_fit(c, p, min_expected=MIN_EXPECTED).pvalue <= LEVEL
            missed += not (hit or (token_test and identity.token_chi2_test(c, p).pvalue <= LEVEL))
        # detected at 0.99 or more: no more misses than a 1 % miss rate makes likely (one-sided, 0.001)
        assert sps.binomtest(missed, reps, 0.01, alternative="greater").pvalue > 1e-3, \
            f"{shape}: missed {missed} of {reps} at the stated TV {claim.tv:.4f} ({claim.test})"


def test_the_pooled_law_claim_alone_is_not_a_token_law_claim():
    # why the claim changed: at V = 32,768 and 25,000 draws nearly every token is pooled, and mass moved
    # inside the pooled cells at the pooled test's own min TV (0.043, the claim the battery printed before)
    # goes unseen; the token-law claim says so (no claim below 1)
    rng = np.random.default_rng(5)
    p, n = _law("dirichlet", 32_768, rng), 25_000
    plan = stats.pool_cells(p, n, MIN_EXPECTED)
    pooled_claim = stats.min_detectable_tv(n, plan.n_groups - 1, LEVEL, 0.99).tv
    q = deviations(p, pooled_claim, n, rng)["inside pooled cells"]
    seen = sum(stats.goodness_of_fit(rng.multinomial(n, q), p, min_expected=MIN_EXPECTED).pvalue <= LEVEL
               for _ in range(40))
    assert seen <= 2
    assert np.isnan(identity.token_min_tv(p, n, LEVEL, 0.99, MIN_EXPECTED).tv)
    assert identity.merged_mass(p, n, MIN_EXPECTED) > 0.99


def test_the_battery_states_the_token_law_claim_of_a_large_vocabulary():
    # the 32k case makes the token chi-square of each position, and its claim is the better of the two
    # (here the token chi-square's: most tokens are pooled); the claim of a small case is the chi-square's own
    import specsample
    from specsample.battery.suite import MIN_EXPECTED as BATTERY_MIN

    report = specsample.verify("standard", budget=1 << 16, cases="large-vocab/V32768/k4,dirichlet/V8/k4", k=4)
    assert report.passed, report.table()
    big = report.case("large-vocab/V32768/k4")
    assert big.test("tokens[0]").min_detectable_tv is not None
    pos = big.test("position[0]")
    p = np.asarray(pos.law[1], np.float64)
    n = int(np.asarray(pos.law[0]).sum())
    # the run sizes its claims at Holm's strictest level, alpha over its soft tests
    level = report.alpha / sum(1 for c in report.cases for t in c.tests if not t.hard)
    claim = identity.token_min_tv(p, n, level, 0.99, BATTERY_MIN, token_test=True)
    assert big.min_detectable_tv == pytest.approx(claim.tv, rel=0.05) and claim.test == "chi2"
    small = report.case("dirichlet/V8/k4")
    assert identity.merged_mass(np.asarray(small.test("position[0]").law[1], np.float64),
                                small.sequences, BATTERY_MIN) == 0
    assert "detected any deviation of a token's law" in " ".join(report.headline().split())


def test_the_engines_draws_keep_a_tokenizer_like_tail_at_its_mass():
    # the alias threshold has 8 bits at V = 32,768 and a Zipf tail holds 5,146 tokens below 1e-7 (below a
    # uniform of 2^-23 each): rounded up column by column they were drawn at 2.2 times their mass, and the
    # battery rejected the correct rule on that pair. With the keep counts chosen along the alias forest
    # the tail's total is within 2.2 % of its mass (52 uniforms of 2^-23), and the pair is in the battery,
    # capped where the floor stays out of its tests' reach (tests/test_serving_vocab.py; docs/protocol.md)
    from specsample.battery.cases import BUDGETS, default_cases
    from specsample.models.pairs import make_pair
    from specsample.models.tables import PackedAlias, draw_resolution_tv

    p = np.asarray(make_pair("large-vocab-zipf", 0).target.table[0], np.float64)
    p /= p.sum()
    law = PackedAlias.build(p[None]).law(p.size)[0]
    tail = p < 1e-7
    assert tail.sum() > 5000 and abs(law[tail].sum() - p[tail].sum()) < 0.05 * p[tail].sum()
    assert 0.5 * np.abs(law - p).sum() <= draw_resolution_tv(p.size) / 2
    assert any(c.family == "large-vocab-zipf" for c in default_cases(BUDGETS["default"]))


def test_a_stage_law_at_large_v_is_tested_token_by_token():
    # a residual drawn from the even ids only (twice as likely each): TV 0.5 of the stage's law, all of it
    # moved between neighbouring ids. The pooled chi-square merges rare neighbours into one cell and sees
    # little of it; the stage's [tokens] test sees every token
    from specsample.battery import diagnosis

    v, n = 8192, 20_000
    law = np.full((1, v), 1.0 / v)
    rng = np.random.default_rng(0)
    token = 2 * rng.integers(v // 2, size=n)
    zeros = np.zeros(n, np.int64)
    tv = diagnosis._token_stage("rejection", zeros, token, law, v)
    assert tv.stage == "rejection[tokens]" and tv.pvalue < 1e-6, tv.detail
    pooled = diagnosis._law_stage("rejection", zeros, zeros, token, law, v, rng)
    assert pooled.pvalue > tv.pvalue
    correct = diagnosis._token_stage("rejection", zeros, rng.integers(v, size=n), law, v)
    assert correct.pvalue > 0.01


@pytest.mark.long  # the 32k case twice, once at 2^18 sequences (8-10 s)
def test_the_large_vocabulary_case_tests_each_stage_token_by_token():
    from specsample.battery.suite import verify

    names = lambda r: {t.name: t for t in r.cases[0].tests}  # noqa: E731
    ok = names(verify("standard", budget="quick", cases="large-vocab*"))
    # at the quick budget the bonus stage holds too few tokens for any to expect a draw alone: no [tokens] test
    assert {"stage:drafting[tokens]", "stage:rejection[tokens]"} <= set(ok)
    # a control draws its last token by an inverse CDF over the row: 2^18 sequences of the 32k case
    bad = verify("control:bonus-from-q", budget=1 << 18, cases="large-vocab/V32768/k4")
    # its stage pass replays about 2,000 bonus tokens: none expects a draw alone among 32,768, so the bonus
    # stage is tested by its pooled chi-square only, which names it
    assert names(bad)["stage:bonus"].rejected and bad.cases[0].rejected_stages == ["bonus"]
    assert "stage:bonus[tokens]" not in names(bad)


def test_the_token_chi_square_has_its_exact_null_moments():
    # every multinomial outcome of n = 6 draws over 4 cells: E Z = -1, Var Z = 2 (m - 1)(n - 1) / n
    from itertools import product
    from math import factorial

    p, n = np.array([0.1, 0.2, 0.3, 0.4]), 6
    zs, ws = [], []
    for c in product(range(n + 1), repeat=3):
        if sum(c) <= n:
            counts = np.array([*c, n - sum(c)])
            w = factorial(n) * np.prod(p ** counts) / np.prod([factorial(int(x)) for x in counts])
            zs.append(float(np.sum(counts * (counts - 1) / (n * p)) - n))
            ws.append(w)
    zs, ws = np.array(zs), np.array(ws)
    mean, var, _ = identity._token_null(p, n)
    assert float(ws @ zs) == pytest.approx(mean, abs=1e-12)
    assert float(ws @ (zs - mean) ** 2) == pytest.approx(var, rel=1e-12)
    # the third cumulant's cell term, 8 + 4 / lambda, against a Poisson sum
    for lam in (1.0, 3.5, 40.0):
        k = np.arange(0, int(lam + 60 * np.sqrt(lam) + 60))
        y = ((k - lam) ** 2 - k) / lam
        assert float(sps.poisson.pmf(k, lam) @ y**3) == pytest.approx(8 + 4 / lam, rel=1e-9)


@pytest.mark.parametrize("family, n", [("dirichlet", 1 << 16), pytest.param("softmax", 1 << 18, marks=pytest.mark.long)])
def test_the_token_chi_square_keeps_its_level(family, n):
    # its size by simulation at V = 32,768 (the long run checks 1e-3 and 1e-4 with 20,000 draws each)
    rng = np.random.default_rng(n)
    p = _law(family, 32_768, rng)
    reps = 500
    pv = np.array([identity.token_chi2_test(rng.multinomial(n, p), p).pvalue for _ in range(reps)])
    for a in (0.05, 0.01):
        assert sps.binomtest(int((pv <= a).sum()), reps, a).pvalue > 1e-3, (a, np.mean(pv <= a))


@pytest.mark.long
def test_the_token_chi_square_keeps_its_level_in_the_far_tail():
    rng = np.random.default_rng(3)
    p = _law("dirichlet", 32_768, rng)
    reps = 20_000 if os.environ.get("SPECSAMPLE_LONG") != "bounded" else 4_000
    pv = np.array([identity.token_chi2_test(rng.multinomial(1 << 18, p), p).pvalue for _ in range(reps)])
    for a in (1e-2, 1e-3, 1e-4):
        assert sps.binomtest(int((pv <= a).sum()), reps, a).pvalue > 1e-3, (a, np.mean(pv <= a))


def test_the_token_chi_square_sees_what_the_plug_in_tv_test_needs_ten_times_the_draws_for():
    rng = np.random.default_rng(11)
    p = _law("dirichlet", 32_768, rng)
    for n in (1 << 18, 1 << 20):
        chi2, tv = identity.token_chi2_min_detectable(p, n, 1e-5, 0.99), identity.tv_min_detectable(p, n, 1e-5, 0.99)
        assert chi2 < tv / 8, (n, chi2, tv)
    with pytest.raises(ValueError, match="non-negative"):
        identity.token_chi2_test([1, -1], [0.5, 0.5])
    assert identity.token_chi2_test([0, 0], [0.5, 0.5]).pvalue == 1.0
    assert identity.token_chi2_min_detectable([0.5, 0.5], 2) == float("inf")
