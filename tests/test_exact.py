"""Exact oracles: the literature's fixtures, losslessness by enumeration, and every scheme's
JAX implementation against its float64 oracle (both sides: correct laws are matched,
controls' laws differ from p)."""

import numpy as np
import pytest

import stats
from specsample.engine import lanes as engine
from specsample.laws import exact
from specsample.models import tables as models, pairs
from specsample import schemes
from specsample.schemes.controls import CONTROL_NAMES
from specsample.schemes.greedy import argmax_law

P_FIX = models.context_free([1 / 3, 2 / 3])
Q_FIX = models.context_free([2 / 3, 1 / 3])


def test_block_beats_token_level_on_the_papers_fixture():
    assert exact.expected_accepted("block", P_FIX, Q_FIX, 2) == pytest.approx(11 / 9)
    assert exact.expected_accepted("standard", P_FIX, Q_FIX, 2) == pytest.approx(10 / 9)


def test_block_measured_acceptance_beats_standard():
    out = {}
    for name in ("block", "standard"):
        c = engine.run(schemes.make_scheme(name, 2), P_FIX, Q_FIX, sequences=200_000, length=1,
                       lanes=1024, per_lane=16).pair(0)
        out[name] = (c.accepted * np.arange(3)).sum() / c.rounds
    assert out["block"] == pytest.approx(11 / 9, abs=0.01)
    assert out["standard"] == pytest.approx(10 / 9, abs=0.01)


@pytest.mark.parametrize("scheme", ["standard", "block", "multidraft", "multidraft-wor", "kseq"])
@pytest.mark.parametrize("pair", [pairs.make_pair("dirichlet", 1, 3), pairs.make_pair("zeros-in-p", 2, 4),
                                  pairs.ngram_pair(3, vocab=3, order=1), pairs.ngram_pair(4, vocab=2, order=2)],
                         ids=["cf", "zeros-in-p", "1-gram", "2-gram"])
def test_lossless_schemes_are_exact_by_enumeration(scheme, pair):
    law = exact.exact_output(scheme, pair.target, pair.draft, 2, 3)
    np.testing.assert_allclose(law, models.exact_joint(pair.target, 3).ravel(), atol=1e-12)


def test_greedy_oracle_is_greedy_decoding():
    pr = pairs.ngram_pair(5, vocab=3, order=1)
    law = exact.exact_output("greedy", pr.target, pr.draft, 2, 4)
    greedy_model = models.TableModel(argmax_law(pr.target.table), 1)
    np.testing.assert_allclose(law, models.exact_joint(greedy_model, 4).ravel())


def _tv(law, pair, length):
    return 0.5 * np.abs(law - models.exact_joint(pair.target, length).ravel()).sum()


# differ from the correct rule only at u = 0 (the boundary pass's job) or where max(0, p - q) vanishes in
# float32 though p != q (the edge-row pass's): in exact arithmetic their law is p's
BOUNDARY_ONLY = {"le-acceptance", "no-residual-fallback"}


@pytest.mark.parametrize("name", CONTROL_NAMES)
def test_every_control_deviates_exactly(name):
    pr = pairs.ngram_pair(6, vocab=3, order=1) if name == "off-by-one" else pairs.make_pair("dirichlet", 0, 4)
    tv = _tv(exact.exact_output(f"control:{name}", pr.target, pr.draft, 2, 3), pr, 3)
    if name in BOUNDARY_ONLY:  # u = 0 is a null event for continuous uniforms: the exact law is p's
        assert tv < 1e-12
    else:
        assert tv > 1e-3


ORACLE_SCHEMES = ["standard", "block", "greedy", "multidraft", "multidraft-wor", "kseq"] + [
    f"control:{n}" for n in CONTROL_NAMES]


@pytest.mark.parametrize("name", ORACLE_SCHEMES)
def test_implementation_matches_its_oracle(name):
    """Engine counts of the first 3 tokens against the scheme's exact law (pooled chi-square)."""
    pr = pairs.ngram_pair(7, vocab=3, order=1)
    law = exact.exact_output(name, pr.target, pr.draft, 2, 3)
    c = engine.run(schemes.make_scheme(name, 2), pr.target, pr.draft, sequences=60_000, length=3,
                   lanes=512, per_lane=8).pair(0)
    assert c.joint[law == 0].sum() == 0
    r = stats.goodness_of_fit(c.joint, law)
    assert r.pvalue > 1e-4 / len(ORACLE_SCHEMES), (name, r)


@pytest.mark.parametrize("name", ["standard", "block", "multidraft", "multidraft-wor", "kseq"])
def test_measured_acceptance_matches_exact_theory(name):
    """Accepted drafts in a first round: engine mean against the oracle's expectation."""
    pr = pairs.ngram_pair(8, vocab=3, order=1)
    theory = exact.expected_accepted(name, pr.target, pr.draft, 2)
    c = engine.run(schemes.make_scheme(name, 2), pr.target, pr.draft, sequences=100_000, length=1,
                   lanes=1024, per_lane=16).pair(0)  # L = 1: every round starts from the initial context
    j = np.arange(3)
    mean = (c.accepted * j).sum() / c.rounds
    se = np.sqrt(((c.accepted * j**2).sum() / c.rounds - mean**2) / c.rounds)
    assert abs(mean - theory) < 5 * se, (name, mean, theory)
    assert theory >= exact.expected_accepted("standard", pr.target, pr.draft, 2) - 1e-12


def test_unknown_oracle():
    with pytest.raises(ValueError, match="no exact oracle"):
        exact.round_law("no-such", P_FIX, Q_FIX, 2)
