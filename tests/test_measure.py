"""specsample measure: distances from p with intervals that cover the exact value, certificates, lossy rules.

Proof both ways: a control's interval excludes 0 and covers its exact distance; the standard rule, and a
lossy rule at the threshold where it is exact, are certified; the certificate lands below the min
detectable TV that verify states at the default budget.
"""

import json

import numpy as np
import pytest

from specsample.battery.cases import BUDGETS, default_cases
from specsample.battery.suite import verify
from specsample.cli import main
from specsample.laws.exact import exact_output
from specsample.measure import exact_laws, measure
from specsample.measure.exact import case_exact_laws, renewal_marginals
from specsample.models.tables import exact_marginals
from specsample.laws.exact import round_law
from specsample.models.pairs import make_pair
from specsample.schemes import CONTROLS, SchemeLoadError, make_scheme

CASE = "dirichlet/V8/k4"
# the controls whose bug shows on a context-free pair's output law (the others: n-gram, boundary, edge rows)
VISIBLE = [n for n in CONTROLS if n.split(":")[1] in (
    "softmax-residual", "resample-from-p", "accept-all", "epsilon-residual", "bonus-from-q", "shared-uniform",
    "reused-uniform", "draft-temperature", "lenient", "typical")]


def _measured(scheme, cases=CASE, k=(4,), budget="quick", tolerance=None):
    report = verify(scheme, budget=budget, cases=cases, k=k)
    b = BUDGETS[budget] if isinstance(budget, str) else BUDGETS["default"]
    return measure(report, tolerance=tolerance, exact=exact_laws(scheme, b, 0, k))


def _exact_tvs(scheme, k=4):
    """The exact TV from p of each position's law of the case (renewal over exact round laws)."""
    case = next(c for c in default_cases(BUDGETS["quick"], (k,)) if c.name == CASE)
    p = exact_marginals(case.pair(0).target, case.length)
    return 0.5 * np.abs(case_exact_laws(scheme, case, 0) - p).sum(axis=1)


@pytest.mark.parametrize("control", [pytest.param(c, marks=[] if c == "control:shared-uniform" else pytest.mark.long)
                                     for c in VISIBLE])
def test_each_controls_interval_excludes_zero_and_covers_its_exact_distance(control):
    tvs = _exact_tvs(control)  # a control may leave some positions exact (bonus-from-q: those before the bonus)
    n = int(min(1 << 21, max(1 << 14, 60 / tvs.max() ** 2)))  # enough sequences that the interval clears 0
    m = _measured(control, budget=n)
    assert len(m.positions) == len(tvs)
    for row in m.positions:
        assert row.exact == pytest.approx(tvs[row.position], abs=1e-9)
        assert row.tv.lower <= row.exact <= row.tv.upper, (control, row)
    farthest = m.positions[int(np.argmax(tvs))]
    assert farthest.tv.lower > 0, (control, farthest)


@pytest.mark.parametrize("cases", [
    pytest.param("dirichlet-flat/V8/k1", marks=pytest.mark.long),
    pytest.param("dirichlet/V8/k4,warp-temperature/V8/k4,zeros-in-q/V8/k4,ngram-1/V4/k1", marks=pytest.mark.long)])
def test_the_standard_rule_is_certified_below_the_min_detectable_tv_verify_states(cases):
    # verify at the default budget states a min detectable TV per case; measure's default budget (certify)
    # is sized by the certificate's power calculation to certify every position law below it
    said = {c.name: c.min_detectable_tv for c in verify("standard", budget="default", cases=cases, k=(1, 4)).cases}
    m = _measured("standard", cases=cases, k=(1, 4), budget="certify")
    assert len({r.case for r in m.rows}) == len(cases.split(","))
    for row in m.positions:
        assert row.tv.lower == 0.0 and row.tv.upper < said[row.case], row
        assert row.exact is None or row.exact < 1e-12
    assert m.bound < min(said.values())


def test_a_lossy_rule_at_its_exact_threshold_is_certified_and_lossy_ones_are_not():
    exact_end = _measured("relaxed", tolerance=0.03)
    assert make_scheme("relaxed", 4).lossless and exact_end.certificate.verdict == "within"
    lossy = _measured("relaxed[threshold_single=0.3,threshold_acc=0.3]", tolerance=0.01)
    assert not make_scheme("relaxed[threshold_single=0.3,threshold_acc=0.3]", 4).lossless
    assert lossy.certificate.verdict == "beyond"
    assert all(r.tv.lower <= r.exact <= r.tv.upper for r in lossy.positions)


@pytest.mark.long  # the torch form's test holds the same rule to the same exact law in the default run
def test_typical_acceptance_matches_its_exact_law():
    m = _measured("typical[recovery=argmax]")
    assert all(r.tv.lower <= r.exact <= r.tv.upper and r.tv.lower > 0.1 for r in m.positions)


def test_renewal_marginals_equal_the_composed_joint():
    pair = make_pair("dirichlet", 1, 4)
    for scheme in ("standard", "control:resample-from-p", "relaxed[threshold_acc=0.5]"):
        joint = exact_output(scheme, pair.target, pair.draft, 2, 4).reshape((4,) * 4)
        marg = np.stack([joint.sum(axis=tuple(a for a in range(4) if a != t)) for t in range(4)])
        np.testing.assert_allclose(renewal_marginals(round_law(scheme, pair.target, pair.draft, 2)(()), 4, 4),
                                   marg, atol=1e-12)


def test_measure_cli_exit_codes_json_and_html(tmp_path, capsys):
    args = ["measure", "--budget", "quick", "--cases", CASE, "--k", "4", "--no-progress"]
    assert main(args + ["--tolerance", "0.05", "--json", str(tmp_path / "m.json"), "--html",
                        str(tmp_path / "m.html")]) == 0
    out = capsys.readouterr().out
    assert "WITHIN 0.05  standard" in out and "simultaneous over 6 position laws and 3 stage laws" in out
    d = json.loads((tmp_path / "m.json").read_text())
    assert d["certificate"]["verdict"] == "within" and len(d["laws"]) == 9 and d["exit_code"] == 0
    assert sorted(x["stage"] for x in d["laws"] if x["stage"]) == ["bonus", "drafting", "rejection"]
    assert {"tv_estimate", "tv_lower", "tv_upper", "tv_exact", "kl_estimate"} <= set(d["laws"][0])
    assert "<svg" in (tmp_path / "m.html").read_text()
    assert main(args + ["--tolerance", "0.002"]) == 3  # undecided at this budget: says how much more
    out = capsys.readouterr().out
    assert "UNDECIDED 0.002" in out and "times the sequences" in out
    assert main(args + ["--scheme", "control:resample-from-p", "--tolerance", "0.05"]) == 1
    out = capsys.readouterr().out  # and the stage it comes from: the rejection's law, TV 0.21 from the residual
    assert "BEYOND 0.05" in out and "Where it comes from: dirichlet/V8/k4 rejection[slot 0]" in out
    assert main(args) == 0  # no tolerance: the bound it certifies
    assert "MEASURED  standard: every position's law is within TV" in capsys.readouterr().out


def test_measure_sweep_cli(tmp_path, capsys):
    assert main(["measure", "--scheme", "relaxed", "--sweep", "threshold_single,threshold_acc=1,0.2",
                 "--budget", "quick", "--json", str(tmp_path / "s.json"), "--html", str(tmp_path / "s.html")]) == 0
    d = json.loads((tmp_path / "s.json").read_text())
    pts = d["points"]
    assert [p["scheme"] for p in pts][0] == "standard" and len(pts) == 3
    exact = [max(q["tv_exact"] for q in p["positions"]) for p in pts[1:]]
    assert exact[0] < 1e-12 < exact[1]  # thresholds 1 (exact), 0.2
    assert pts[2]["positions"][0]["tv_lower"] > 0 and pts[1]["positions"][0]["tv_lower"] == 0
    speed = [p["tokens_per_round"] for p in pts[1:]]
    assert speed[0] < speed[1]
    assert "<svg" in (tmp_path / "s.html").read_text()
    capsys.readouterr()
    assert main(["measure", "--scheme", "standard", "--sweep", "threshold_acc=1"]) == 2
    assert "--scheme must be one of typical, relaxed" in capsys.readouterr().err


def test_lossy_names_and_verify_says_a_fail_is_expected(capsys):
    with pytest.raises(SchemeLoadError, match="parameters: threshold_single, threshold_acc"):
        make_scheme("relaxed[threshold=0.5]", 4)
    with pytest.raises(SchemeLoadError, match="threshold_acc in"):
        make_scheme("relaxed[threshold_acc=0]", 4)
    assert make_scheme("relaxed[threshold_acc=0.5]", 4) is make_scheme("relaxed[threshold_acc=0.5]", 4)
    assert main(["verify", "--scheme", "typical", "--budget", "quick", "--cases", CASE, "--k", "4",
                 "--no-progress"]) == 1
    assert "declares itself lossy (lossless=False): a FAIL is what it expects" in capsys.readouterr().out


@pytest.mark.parametrize("fn, rule, budget", [("typical", "typical[recovery=argmax]", "quick"),
                                              pytest.param("relaxed_half", "relaxed[threshold_single=0.5,threshold_acc=0.5]",
                                                           1 << 17, marks=pytest.mark.long)])
def test_the_torch_forms_follow_their_rules_exact_laws(fn, rule, budget):
    # the host form of each lossy rule, measured as a sampler, lands on the JAX rule's exact distance
    pytest.importorskip("torch")
    import pathlib

    from specsample.host import load_sampler, verify_host

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "lossy_torch.py"
    sampler = load_sampler(f"{path}:{fn}", rng="torch", arrays="torch", rule="none")
    report = verify_host(sampler, budget=budget, cases=CASE, k=(4,))
    tvs = _exact_tvs(rule)
    m = measure(report)
    assert len(m.positions) == len(tvs)
    for row in m.positions:
        assert row.tv.lower <= tvs[row.position] <= row.tv.upper and row.tv.lower > 0, row


@pytest.mark.long  # a loop's quick run (3 s)
def test_measure_reads_a_whole_loop_as_verify_does(capsys):
    import pathlib

    loop = pathlib.Path(__file__).resolve().parents[1] / "examples" / "numpy_loop.py"
    assert main(["measure", "--generate", f"{loop}:loop", "--next-token", f"{loop}:next_token", "--prompt", "1",
                 "--length", "3", "--batch", "500", "--budget", "quick", "--tolerance", "0.05"]) == 0
    assert "WITHIN 0.05  loop: every position's law" in capsys.readouterr().out


def test_a_stage_law_is_measured_against_the_law_it_must_follow():
    # resample-from-p draws a rejection's token from p: the rejection stage's law is TV(p, residual) off
    m = _measured("control:resample-from-p")
    rej = [r for r in m.rows if r.stage == "rejection"]
    pair = next(c for c in default_cases(BUDGETS["quick"], (4,)) if c.name == CASE).pair(0)
    p = np.asarray(pair.target.table[0], np.float64)
    q = np.asarray(pair.draft.table[0], np.float64)
    p, q = p / p.sum(), q / q.sum()
    res = np.maximum(p - q, 0.0)
    exact = 0.5 * np.abs(p - res / res.sum()).sum()
    assert rej and all(r.tv.lower <= exact <= r.tv.upper and r.tv.lower > 0.1 for r in rej), (exact, rej)
    assert m.certificate is None and m.bound == max(r.tv.upper for r in m.positions)
