"""Host runs keep their promises: --checkpoint resumes, --time bounds the wall time, --prng is refused."""

import time

import numpy as np
import pytest

from specsample import cli, host
from specsample.loops import verify as e2e
from test_e2e import plain_generate
from test_host import standard_np

CASES = "dirichlet/V8/k4,ngram-2/V4/k4"


def _counts(report):
    return [(c.name, c.sequences, c.rounds, [(t.name, t.statistic) for t in c.tests]) for c in report.cases]


def test_a_killed_host_run_resumes_to_the_uninterrupted_counts(tmp_path):
    whole = host.verify_host(standard_np, budget=3000, k=4, cases=CASES)
    mode = {"run": "dies"}

    def sampler(drafts, q, p, rng):  # one sampler (its code is part of the checkpoint's signature)
        if mode["run"] == "dies" and q.shape[-1] == 4:  # killed in the n-gram case (V = 4), which comes second
            raise KeyboardInterrupt
        assert mode["run"] == "dies" or q.shape[-1] == 4, "the finished case was sampled again"
        return standard_np(drafts, q, p, rng)

    with pytest.raises(KeyboardInterrupt):
        host.verify_host(sampler, budget=3000, k=4, cases=CASES, checkpoint_dir=str(tmp_path), name="standard_np")
    assert len(list(tmp_path.glob("host-*.npz"))) == 1  # the first case was kept
    mode["run"] = "resumed"
    resumed = host.verify_host(sampler, budget=3000, k=4, cases=CASES, checkpoint_dir=str(tmp_path),
                               name="standard_np")
    assert _counts(resumed) == _counts(whole)


def test_a_checkpoint_of_another_budget_is_not_mixed_in(tmp_path):
    host.verify_host(standard_np, budget=2000, k=4, cases="dirichlet/V8/k4", checkpoint_dir=str(tmp_path))
    again = host.verify_host(standard_np, budget=2500, k=4, cases="dirichlet/V8/k4", checkpoint_dir=str(tmp_path))
    assert again.cases[0].sequences == 2500


def slow_one_round(drafts, q, p, rng):
    time.sleep(0.002)  # a slow sampler, one round a call (500 rounds/s at best)
    tokens, n = standard_np(drafts[None], q[None], p[None], rng)
    return tokens[0], int(n[0])


def test_time_bounds_the_whole_run(tmp_path):
    t0 = time.perf_counter()
    report = host.verify_host(slow_one_round, time_budget="6s", batched=False, k=(1, 4),
                              cases="dirichlet/V8/k1,dirichlet/V8/k4,boundary/V8/k4")
    took = time.perf_counter() - t0
    # the budget bounds the sampling (boundary pass included); the tests on the counts come after it
    # (a cold compile of them on a loaded machine took 1.3 s more)
    assert report.engine["host"]["sampling_s"] <= 6 * 1.2 and took <= 6 * 2, (report.engine["host"], took)
    stat = [c for c in report.cases if not c.name.startswith("boundary")]
    assert all(0 < c.sequences < 1000 for c in stat)  # small budgets run, and are stated
    assert all(np.isfinite(c.min_detectable_tv) or c.min_tv_note for c in stat)
    # cut short of their plan, and said so: never a plain PASS
    assert all(c.short_of_plan and c.sequences_planned > c.sequences for c in stat)
    if report.passed:
        assert report.headline().startswith("PASS, SHORT OF PLAN")


def test_prng_is_refused_for_host_samplers(tmp_path, capsys):
    path = tmp_path / "s.py"
    path.write_text("def f(d, q, p, rng):\n    pass\n")
    assert cli.main(["verify", "--sampler", f"{path}:f", "--prng", "rbg"]) == 2
    assert "--rng" in capsys.readouterr().err


def test_an_end_to_end_run_resumes_from_its_checkpoint(tmp_path):
    generate = plain_generate(np.array([[0.6, 0.4], [0.3, 0.7]]))
    whole, _ = e2e.sample(generate, [0], 3, 200, seed=5)
    ck = str(tmp_path / "e.npz")
    e2e.sample(generate, [0], 3, 200, seed=5, checkpoint_path=ck)
    part, _ = e2e.sample(lambda *a: pytest.fail("sampled again"), [0], 3, 200, seed=5, checkpoint_path=ck)
    np.testing.assert_array_equal(part, whole)
    with pytest.raises(ValueError, match="other arguments"):
        e2e.sample(generate, [0], 3, 300, seed=5, checkpoint_path=ck)


def test_a_sampler_drawing_from_torch_global_generator_is_told_the_flag():
    torch = pytest.importorskip("torch")

    def uses_global(drafts, q, p, generator):
        torch.rand(1)  # behind the generator it was given
        tokens, n = standard_np(drafts.numpy(), q.numpy(), p.numpy(), np.random.default_rng(0))
        return tokens, n

    opts = dict(budget=1000, k=4, cases="dirichlet/V8/k4", arrays="torch")
    with pytest.warns(host.HostNondeterminismWarning, match="--rng torch-global"):
        report = host.verify_host(uses_global, rng="torch", **opts)
    assert "torch-global" in report.engine["host"]["warnings"][0]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", host.HostNondeterminismWarning)
        clean = host.verify_host(uses_global, rng="torch-global", **opts)
        assert clean.engine["host"]["warnings"] == []


def test_a_sampler_drawing_from_numpy_global_state_is_told():
    def uses_np_global(drafts, q, p, rng):
        np.random.random()
        return standard_np(drafts, q, p, rng)

    with pytest.warns(host.HostNondeterminismWarning, match="numpy's global generator"):
        host.verify_host(uses_np_global, budget=1000, k=4, cases="dirichlet/V8/k4")


def test_a_time_budget_already_spent_still_tests_something():
    # a host sampler: a bound is a bound, so a time that covers no case's first calls is refused (below);
    # a loop's first sequences are one call each, and run
    loop = e2e.verify_generate(lambda t: np.full(np.shape(t) + (2,), 0.5), plain_generate(np.full((2, 2), 0.5)), [0],
                               length=2, time_budget=0.001)
    assert loop.cases[0].sequences > 0


def slow_calls(drafts, q, p, rng):
    time.sleep(0.25)  # a slow batched sampler: a quarter of a second a call, whatever the batch
    return standard_np(drafts, q, p, rng)


def test_a_time_too_short_for_every_case_runs_fewer_and_says_which():
    from specsample.host.verify import TimeBudgetWarning

    cases = "dirichlet/V8/k4,zeros-in-p/V8/k4,rare-accept/V8/k4,perturbed/V8/k4,mostly-below/V8/k4,ngram-2/V4/k4"
    t0 = time.perf_counter()
    with pytest.warns(TimeBudgetWarning, match="covers .* of 6 statistical cases"):
        report = host.verify_host(slow_calls, time_budget="6s", k=4, cases=cases)
    took = time.perf_counter() - t0
    skipped = report.engine["host"]["skipped_cases"]
    assert skipped and len(report.cases) + len(skipped) == 6
    # a bound is a bound (a case's last call may overrun its share); the tests on the counts come after it
    assert report.engine["host"]["sampling_s"] <= 6 * 1.25 and took <= 6 * 2, (report.engine["host"], took)
    assert any("not run: " in w for w in report.engine["host"]["warnings"])


def test_a_time_that_covers_no_case_is_refused_with_the_time_that_would():
    with pytest.raises(ValueError, match=r"cannot cover one case.*give --time \d+s or more"):
        host.verify_host(slow_calls, time_budget="0.3s", k=4, cases="dirichlet/V8/k4,ngram-2/V4/k4")


def tenth_calls(drafts, q, p, rng):
    time.sleep(0.05)  # a slow batched sampler: a twentieth of a second a call
    return standard_np(drafts, q, p, rng)


@pytest.mark.long  # six seconds of a slow sampler; the refusal below runs in the default run
def test_time_bounds_the_boundary_and_batch_passes_of_a_slow_batched_sampler():
    # a batched sampler of a quarter second a call made 4,500 calls in the batch pass alone (19 minutes);
    # under --time every pass is timed from a first call, sized, and run against its deadline
    t0 = time.perf_counter()
    report = host.verify_host(tenth_calls, time_budget="6s", k=1, cases="dirichlet/V8/k1,boundary/V8/k1")
    took = time.perf_counter() - t0
    assert report.engine["host"]["sampling_s"] <= 6 * 1.25 and took <= 6 * 2, (report.engine["host"], took)
    batch = report.case("batch/V8/k1")
    assert [t.name for t in batch.tests] == ["batch-not-run"] and not batch.tests[0].reached
    assert "leaves" in batch.tests[0].detail and "give more time" in batch.tests[0].detail
    assert "NOT REACHED" in report.headline() and "batch/V8/k1 (batch-not-run)" in report.headline()


def test_a_time_the_boundary_pass_cannot_fit_is_refused_at_once():
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"cannot cover the boundary pass: one sampler call took 0.2\d s.*give --time"):
        host.verify_host(slow_calls, time_budget="3s", k=4, cases="dirichlet/V8/k4,boundary/V8/k4")
    assert time.perf_counter() - t0 < 3  # at once: one timed call, not the pass


def test_a_pass_whose_time_runs_out_says_what_it_did_not_reach():
    from specsample.battery.cases import BUDGETS, default_cases
    from specsample.host.boundary import _boundary_case
    from specsample.host.run import clock

    c = next(c for c in default_cases(BUDGETS["quick"], (4,)) if c.boundary)
    with clock(time.perf_counter() + 0.05):
        r = _boundary_case(host.load_sampler(tenth_calls), c, 0)
    cut = r.tests[-1]
    assert cut.name == "boundary-cut-short" and not cut.reached and cut.hard and not cut.rejected
    assert "ran out after" in cut.detail and "give more time" in cut.detail
