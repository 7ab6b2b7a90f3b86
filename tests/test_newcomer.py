"""A newcomer's first hour: interrupts, errors before work, readable reports, one API."""

import os
import pty
import re
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import specsample
from specsample.cli import main

CASE = "dirichlet/V8/k4"


def _spawn(*args):
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "specsample", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _cli(*args, timeout=300):
    p = _spawn(*args)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


# --- 1. Ctrl-C acts at once, and keeps what was counted -------------------------------------


def test_ctrl_c_while_starting_up_exits_at_once():
    # during the imports (JAX, the schemes) there is nothing to save: leave with 130, no traceback, no hang
    p = _spawn("verify", "--budget", str(1 << 31), "--cases", CASE, "--k", "4", "--no-progress")
    time.sleep(1.0)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130 and time.monotonic() - t0 < 5, err[-2000:]
    assert "Traceback" not in err


def _read_pty(fd, until=None, timeout=120.0) -> str:
    """What the child wrote to its terminal, up to ``until(text)`` or end of output."""
    text, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline and not (until and until(text)):
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed its terminal (Linux reports EIO)
                break
            if not chunk:
                break
            text += chunk.decode(errors="replace")
    return text


def _sampled(text: str) -> bool:
    # the progress bar's "done/total" after a finished chunk: a nonzero count of sequences
    return any(float(n) > 0 for n in re.findall(r"([0-9.]+)[kMG]?/[0-9.]+[kMG]?", text))


def test_ctrl_c_returns_control_within_seconds_and_saves_counts(tmp_path):
    ck = tmp_path / "ck"
    # stderr is a terminal, so the progress bar shows when the first chunk is counted: interrupt
    # only then (a fixed sleep raced the compile on a loaded machine, leaving nothing to save)
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1"}
    # one case of 2^31 sequences: minutes of sampling, far longer than the wait below
    p = subprocess.Popen([sys.executable, "-m", "specsample", "verify", "--budget", str(1 << 31), "--cases", CASE,
                          "--k", "4", "--checkpoint", str(ck)],
                         stdout=subprocess.PIPE, stderr=slave, text=True, env=env)
    os.close(slave)
    try:
        shown = _read_pty(master, until=_sampled)
        assert _sampled(shown) and p.poll() is None, shown[-2000:]
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
        latency = time.monotonic() - t0
        err = _read_pty(master, timeout=10)
    finally:
        p.kill()
        os.close(master)
    assert p.returncode == 130, err[-2000:]
    assert latency < 5.0, f"Ctrl-C took {latency:.1f} s"
    assert "interrupted" in err
    assert "saved to 1 checkpoint" in err and list(ck.iterdir())


# --- 2. outputs are checked before any work ---------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["verify", "--json", "/nonexistent/dir/x.json"], "does not exist"),
    (["calibrate", "--json", "/nonexistent/dir/x.json"], "does not exist"),
    (["bench", "--json", "/nonexistent/dir/x.json"], "does not exist"),
    (["decode", "--json", "/nonexistent/dir/x.json"], "does not exist"),
])
def test_bad_output_paths_fail_before_any_work(args, message, capsys):
    t0 = time.monotonic()
    assert main(args) == 2
    assert time.monotonic() - t0 < 2.0
    captured = capsys.readouterr()
    assert message in captured.err and "PASS" not in captured.out


def test_output_folders_that_cannot_be_made(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["verify", "--checkpoint", str(blocker / "ck")]) == 2
    assert main(["figures", "--out", str(blocker / "figs")]) == 2
    assert main(["verify", "--json", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot be created" in err and "is a folder" in err


# --- 5, 9. readable tables and headlines ---------------------------------------------------------


@pytest.fixture(scope="module")
def failing_report():
    return specsample.verify("control:bonus-from-q", budget="quick", k=4,
                             cases=f"{CASE},one-hot-p/V8/k4,ngram-1/V4/k4")


def test_table_fits_narrow_and_wide_terminals(failing_report):
    narrow = failing_report.table(width=80)
    assert max(len(line) for line in narrow.splitlines()) < 100
    assert "KL" not in narrow.splitlines()[0]
    wide = failing_report.table(width=160)
    assert "KL" in wide.splitlines()[0] and "accept obs/theory" in wide.splitlines()[0]
    # a one-hot target has no soft test: said so, not a bare nan
    row = next(line for line in narrow.splitlines() if line.startswith("one-hot-p"))
    assert "n/a*" in row and "nan" not in narrow
    assert "one-hot target" in " ".join(narrow.split("\n* ", 1)[1].split())


def test_headline_wraps_and_names_the_evidence(failing_report):
    head = failing_report.headline(width=80)
    assert all(len(line) <= 80 for line in head.splitlines())
    assert head.startswith("FAIL") and "Evidence:" in head
    assert "support violation" in head  # bonus from q emits a token p gives 0 on the one-hot pair


def test_passing_table_shows_raw_p_values():
    report = specsample.verify("standard", budget="quick", k=4, cases=CASE)
    head, _, row = report.table(width=80).splitlines()[:3]
    cols = head.split()
    assert cols[:4] == ["case", "rounds", "worst", "test"] and "p" in cols and "adj" in cols
    worst = report.cases[0].worst
    assert worst.pvalue == min(t.pvalue for t in report.cases[0].tests if not t.hard)
    assert f"{worst.pvalue:.3f}" in row or f"{worst.pvalue:.1e}" in row


# --- 6. one API, the CLI's names ------------------------------------------------------------------


def test_api_takes_the_cli_names():
    report = specsample.verify("standard", budget="quick", k=4, cases=CASE)
    assert [c.k for c in report.cases] == [4]
    assert report.case(CASE).test("position[0]").pvalue > 0
    assert report.engine["devices"] == 2 or os.cpu_count() == 1  # every core, as the CLI
    assert specsample.verify("standard", budget="quick", ks=(4,), cases=CASE).cases[0].k == 4  # old name
    with pytest.raises(KeyError, match="has no test 'nosuch'"):
        report.cases[0].test("nosuch")


# --- 7. bad input is refused, not accepted silently -------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["figures", "--only", "nosuch"], "unknown figure 'nosuch'"),
    (["list", "--budget", "banana"], "--budget takes quick, default, thorough, certify or a number"),
    (["verify", "--seed", "-1"], "--seed must lie in"),
    (["calibrate", "--runs", "0"], "must be >= 1"),
    (["verify", "--cases", CASE, "--k", "1"], "add that to --k"),
    (["verify", "--scheme", "my_scheme.py"], "use path.py:attr"),
])
def test_bad_input_is_refused(args, message, capsys):
    code = None
    try:
        code = main(args)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_seed_out_of_range_in_the_api():
    with pytest.raises(ValueError, match="seed must be an integer"):
        specsample.verify("standard", budget="quick", seed=-1, cases=CASE)


BROKEN = textwrap.dedent("""
    import jax.numpy as jnp
    from specsample.schemes import standard

    def emits_nothing(k=4):
        base = standard(k)
        def step(key, target, draft, context):
            out = base.step(key, target, draft, context)
            return out._replace(n_emitted=jnp.int32(0))
        return base._replace(name="emits-nothing", step=step)

    def float_tokens(k=4):
        base = standard(k)
        def step(key, target, draft, context):
            out = base.step(key, target, draft, context)
            return out._replace(tokens=out.tokens.astype(jnp.float32))
        return base._replace(name="float-tokens", step=step)

    def helper(x):
        return x.no_such_attribute

    def raises(k=4):
        base = standard(k)
        def step(key, target, draft, context):
            return helper(context)
        return base._replace(step=step)
""")


@pytest.fixture(scope="module")
def broken_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "broken.py"
    path.write_text(BROKEN)
    return str(path)


def test_a_round_emitting_nothing_is_a_broken_scheme(broken_file):
    report = specsample.verify(f"{broken_file}:emits_nothing", budget="quick", k=4, cases=CASE)
    assert not report.passed
    t = report.cases[0].test("valid-tokens")
    assert t.rejected and "rounds emitting outside [1, 5]" in t.detail
    assert "invalid tokens or rounds" in report.headline(width=200)


def test_float_tokens_are_refused(broken_file):
    with pytest.raises(specsample.SchemeError, match="dtype float32"):
        specsample.verify(f"{broken_file}:float_tokens", budget="quick", k=4, cases=CASE)


def test_an_error_in_a_user_scheme_names_their_file_and_line(broken_file):
    with pytest.raises(specsample.SchemeError) as e:
        specsample.verify(f"{broken_file}:raises", budget="quick", k=4, cases=CASE)
    msg = str(e.value)
    assert "broken.py:20 in helper" in msg and "return x.no_such_attribute" in msg


# --- 10. long commands show progress with an ETA ------------------------------------------------


def test_calibrate_prints_progress_with_eta():
    code, out, err = _cli("calibrate", "--runs", "2", "--cases", CASE)
    assert code == 0, err
    assert "run 1/2" in err and "ETA" in err and "run 2/2" in err
    assert "false alarms" in out


# --- 4. a calibration figure with few runs shows its uncertainty ---------------------------------


def test_calibration_figure_states_its_uncertainty():
    from specsample.figures import gallery as figures

    fig = figures.fig_calibration(0.02, 0)
    title = fig.axes[0].get_title()
    assert "95% CI" in title and "binomial p" in title
    assert "only 20 runs" in fig._suptitle.get_text()


def test_min_tv_says_where_it_comes_from_when_position_0_has_no_power_figure():
    from specsample.battery.report import CaseResult, Report, TestResult

    tests = [TestResult("support", 0.0, 1.0, hard=True),
             TestResult("position[0]", 1.0, 0.5, min_detectable_tv=float("nan")),
             TestResult("position[1]", 1.0, 0.5, min_detectable_tv=0.03),
             TestResult("joint", 1.0, 0.5, min_detectable_tv=0.05)]
    case = CaseResult("ngram-2-peaked/V4/k4", "s", "f", "m", 4, 4, 3, 1000, 3000, tests, float("nan"))
    assert case.min_detectable_tv == 0.05 and "position[0] had too few sequences" in case.min_tv_note
    table = Report("s", 0.01, 0, "1000", [case], 1.0, 0.99, {}).table(width=80)
    assert "5.0e-02+" in table and "+ ngram-2-peaked/V4/k4: largest min TV of position[1], joint" in table
    assert "n/a*" not in table
    hard = CaseResult("boundary/V8/k4", "s", "f", "m", 8, 4, 1, 0, 10, tests[:1], float("nan"))
    assert hard.min_tv_note == "hard checks only" and "n/a*" in Report("s", 0.01, 0, "q", [hard], 1.0, 0.99, {}).table(80)
