"""The suite measuring itself (bounded here; the README's table comes from
benchmarks/calibration_table.py)."""

import numpy as np

from specsample import calibrate as cal


def test_calibrate_lossless_and_control_bounded():
    ok = cal.calibrate("standard", 2, cases="dirichlet/V8/k4,ngram-2/V4/k4")
    assert ok.lossless and ok.runs == 2 and 0 <= ok.rate <= 1 and "false alarms" in ok.summary()
    bad = cal.calibrate("control:resample-from-p", 2, cases="dirichlet/V8/k4")
    assert not bad.lossless and bad.rejections == 2
    assert 0.9 < bad.predicted_detection <= 1.0  # exact deviation is large: detection predicted


def test_peer_criteria_on_exact_and_biased_counts():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(10))
    good = rng.multinomial(100_000, p)
    assert cal.criterion_six_sigma(good, p) and cal.criterion_specsample(good, p)
    assert cal.criterion_kl_gap(good, p, rng)
    sizes = [rng.multinomial(n, p) for n in cal.VLLM_SIZES]
    assert cal.criterion_l2_convergence(sizes, p, rng)
    biased = rng.multinomial(100_000, 0.97 * p + 0.03 * rng.dirichlet(np.ones(10)))
    assert not cal.criterion_specsample(biased, p)


def test_peer_comparison_runs_side_by_side():
    rows = cal.peer_comparison(["standard", "control:accept-all"], reps=2, sizes=(1000, 3000))  # one block shape
    assert rows[0]["detection"]["specsample chi-square"] == 0.0
    assert rows[1]["detection"]["specsample chi-square"] == 1.0
    assert set(rows[0]["detection"]) == {"l2-convergence (vLLM)", "6 SE + 5 per bin (TileOPs)",
                                         "KL gap < 0.01 (TensorRT-LLM)", "specsample chi-square"}


def test_min_detectable_deviation_brackets_prediction():
    d = cal.min_detectable_deviation(20000, reps=200)
    assert d["observed_tv"] <= d["worst_case_tv"]
    assert 0.5 < d["observed_tv"] / d["predicted_tv"] < 1.6
