"""The battery end to end: verdicts, controls rejected, CLI, JSON, pytest helper, errors."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import specsample
from specsample.schemes import CONTROLS
from specsample.testing import assert_lossless

# each public control is rejected: see tests/test_conformance.py (every registered scheme)


def _cli(*args, timeout=600):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "specsample", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_cli_rejects_a_control_with_exit_1_and_names_cases(tmp_path):
    out = _cli("verify", "--scheme", "control:bonus-from-q", "--budget", "quick", "--k", "4",
               "--cases", "dirichlet/V8/k4", "--json", str(tmp_path / "r.json"))
    assert out.returncode == 1, out.stderr
    assert "FAIL" in out.stdout and "dirichlet/V8/k4" in out.stdout
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["verdict"] == "fail" and any(not c["passed"] for c in d["cases"])


EXAMPLE = textwrap.dedent('''
    from specsample.schemes import standard
    def my_scheme(k=4):
        return standard(k)._replace(name="my-scheme")
''')


def test_scheme_from_file_path_passes(tmp_path):
    path = tmp_path / "my_scheme.py"
    path.write_text(EXAMPLE)
    out = _cli("verify", "--scheme", f"{path}:my_scheme", "--budget", "quick", "--k", "2",
               "--cases", "dirichlet/V8/k2,ngram-2/V4/k2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS  my-scheme" in out.stdout


def test_assert_lossless_both_sides():
    rep = assert_lossless("standard", cases="perturbed/V8/k4", k=4)
    assert rep.passed
    with pytest.raises(AssertionError, match="FAIL") as e:
        assert_lossless("control:accept-all", cases="dirichlet/V8/k4", k=4)
    assert "dirichlet/V8/k4" in str(e.value)


BROKEN = textwrap.dedent('''
    import jax.numpy as jnp
    from specsample.schemes import standard, RoundOutput

    def raises(k=4):
        def step(key, target, draft, context):
            raise RuntimeError("my bug")
        return standard(k)._replace(name="raises", step=step)

    def wrong_shape(k=4):
        s = standard(k)
        def step(key, target, draft, context):
            out = s.step(key, target, draft, context)
            return out._replace(tokens=out.tokens[:-1])
        return s._replace(name="wrong-shape", step=step)

    def out_of_range(k=4):
        s = standard(k)
        def step(key, target, draft, context):
            out = s.step(key, target, draft, context)
            return out._replace(tokens=out.tokens + 100)
        return s._replace(name="out-of-range", step=step)

    not_a_scheme = 42
''')


@pytest.mark.parametrize("args,needle", [
    (["verify", "--scheme", "no-such"], "unknown scheme"),
    (["verify", "--budget", "enormous"], "--budget takes quick, default, thorough, certify or a number"),
    (["verify", "--budget", "0"], "--budget must be positive"),
    (["verify", "--alpha", "1.5"], "--alpha"),
    (["verify", "--cases", "zzz-none"], "no case matches"),
    (["verify", "--k", "0"], "draft lengths"),
    (["verify", "--scheme", "nomodule_xyz:thing"], "cannot import module"),
    (["verify", "--prng", "mt19937"], "unknown prng 'mt19937'; choose one of threefry2x32"),
    (["verify", "--time", "5"], "--time applies to a host sampler"),
    (["verify", "--time", "5", "--rule", "rrs"], "--time, --rule apply to a host sampler"),
])
def test_bad_usage_exits_2_with_one_line(args, needle, capsys):
    code, _, err = _main(args, capsys)  # in-process: the same code path, without a new interpreter
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("specsample")]
    assert len(lines) == 1 and needle in err, err
    assert "Traceback" not in err


def test_an_unknown_prng_is_the_caller_s_error_before_any_case_runs(monkeypatch):
    from specsample.battery import suite

    monkeypatch.setattr(suite, "_sample_and_test", lambda *a, **k: pytest.fail("a case ran"))
    with pytest.raises(ValueError, match="unknown prng 'mt19937'; choose one of threefry2x32"):
        specsample.verify("standard", budget="quick", prng="mt19937", cases="dirichlet/V8/k4", k=4)


def test_bad_usage_in_a_real_process():
    out = _cli("verify", "--scheme", "no-such")
    assert out.returncode == 2 and "unknown scheme" in out.stderr and "Traceback" not in out.stderr


def _main(args, capsys):
    from specsample.cli import main

    try:
        code = main(args)
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("attr,needle", [
    ("raises", "my bug"),
    ("wrong_shape", "tokens with shape"),
    ("not_a_scheme", "must be a name, a factory or a Scheme"),
])
def test_broken_user_schemes_exit_2(tmp_path, attr, needle, capsys):
    path = tmp_path / "broken.py"
    path.write_text(BROKEN)
    code, out, err = _main(["verify", "--scheme", f"{path}:{attr}", "--budget", "quick", "--k", "2",
                            "--cases", "dirichlet/V8/k2"], capsys)
    assert code == 2, out + err
    assert needle in err and "Traceback" not in err


def test_out_of_range_tokens_fail_the_case(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(BROKEN)
    r = specsample.verify(f"{path}:out_of_range", budget="quick", k=2, cases="dirichlet/V8/k2")
    assert not r.passed
    assert r.cases[0].worst.name == "valid-tokens"


def test_list_command():
    out = _cli("list")
    assert out.returncode == 0
    for word in ("standard", "control:bonus-from-q", "rare-accept", "ngram-2", "sweep-dirichlet/V8/k4"):
        assert word in out.stdout


def test_every_control_is_registered_apart():
    assert all(not f(4).lossless for f in CONTROLS.values())


@pytest.mark.parametrize("scheme, cases, says", [
    ("cached", "dirichlet/V8/k4", "names table cases only; cached carries KV caches and runs the transformer cases"),
    ("standard", "transformer-far/V8/k4", "names transformer cases only; standard is a table scheme"),
])
def test_cases_of_the_other_kind_of_scheme_are_named_as_such(scheme, cases, says):
    with pytest.raises(ValueError, match=says):
        specsample.verify(scheme, budget="quick", k=4, cases=cases)


@pytest.mark.parametrize("scheme, case", [("standard", "dirichlet/V8/k4")])
def test_the_stage_pass_beside_the_engine_gives_what_it_gives_alone(scheme, case):
    """verify plays each table case's stage pass in a background thread while the engine samples: its
    tests must be those of the pass played alone, after the run (it depends on no counts). A transformer
    case's: tests/test_recorded_rounds.py."""
    from specsample.battery import suite
    from specsample.battery.cases import BUDGETS, default_cases, select
    from specsample.schemes import make_scheme

    report = specsample.verify(scheme, budget=4096, cases=case, seed=3, k=(4 if "k4" in case else 1))
    c = select(default_cases(BUDGETS["quick"], (1, 4)), case)[0]
    alone, _ = suite._stage_pass(c, make_scheme(scheme, c.k), c.pair(3), 4096, 3)
    got = [t for t in report.cases[0].tests if t.name.startswith("stage:")]
    assert got and [(t.name, t.statistic, t.pvalue) for t in got] == [(t.name, t.statistic, t.pvalue) for t in alone]


def test_the_engine_samples_every_case_before_it_waits_for_a_stage_pass(monkeypatch):
    """Stage passes need no counts: verify samples every case, then collects them. Each pass here
    waits until every case has sampled, so a verify that waited for a case's pass before sampling
    the next would stall, and its first pass would fail after the timeout."""
    import functools
    import threading

    from specsample.battery import suite

    monkeypatch.setenv("SPECSAMPLE_STAGE_WORKER", "0")  # the passes in verify's background thread
    cases = "dirichlet/V8/k4,perturbed/V8/k4,zeros-in-p/V8/k4"
    runs, sampled = [], threading.Event()
    real_run, real_pass = suite.engine.run, suite._stage_pass

    @functools.wraps(real_run)  # warm() reads run's keywords from its signature
    def run(*args, **kwargs):
        out = real_run(*args, **kwargs)
        runs.append(kwargs["seed"])
        if len(runs) == 3:
            sampled.set()
        return out

    def stage_pass(*args):
        assert sampled.wait(60), "a stage pass was waited for before every case had sampled"
        return real_pass(*args)

    monkeypatch.setattr(suite.engine, "run", run)
    monkeypatch.setattr(suite, "_stage_pass", stage_pass)
    report = suite.verify("standard", budget=4096, k=4, cases=cases)
    assert len(runs) == 3 and [c.name for c in report.cases] == cases.split(",")
    assert all(any(t.name.startswith("stage:") for t in c.tests) for c in report.cases)
