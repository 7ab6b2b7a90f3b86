"""Whole generate loops with the care of JAX schemes: errors, budgets, batches, workers (issue 22, part)."""

import json
import time

import numpy as np
import pytest

import stats
from specsample import cli
from specsample.loops import verify as e2e

TABLE = np.array([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.2, 0.5]])

HELPER = "TABLE = [[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.2, 0.5]]\n"

GLUE = '''
import numpy as np
from helper_beside import TABLE  # a module beside the glue file

TABLE = np.array(TABLE)


def next_token(tokens):
    return TABLE[tokens]


def one(rng, last, n):
    out = []
    for _ in range(n):
        last = int(rng.choice(3, p=TABLE[last]))
        out.append(last)
    return out


def generate(prompt, n, seed):
    return np.array(one(np.random.default_rng(seed), int(prompt[-1]), n))


def generate_batched(prompts, n, seeds):  # each row from its own seed, as the contract asks
    return np.array([one(np.random.default_rng(int(s)), int(p[-1]), n) for p, s in zip(prompts, seeds)])


def raises(prompt, n, seed):
    return helper_step(prompt)


def helper_step(prompt):
    raise RuntimeError("cache index out of range")
'''


@pytest.fixture
def glue(tmp_path):
    (tmp_path / "helper_beside.py").write_text(HELPER)
    path = tmp_path / "loop_glue.py"
    path.write_text(GLUE)
    return str(path)


def test_a_raising_generate_gets_one_line_and_exit_2(glue, capsys):
    args = ["verify", "--generate", f"{glue}:raises", "--next-token", f"{glue}:next_token", "--sequences", "10"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "generate 'raises' raised: RuntimeError: cache index out of range" in err[0]
    assert "loop_glue.py:" in err[0] and "helper_step" in err[0]


def test_quick_budget_sizes_itself_from_the_power_calculation(glue):
    from specsample.schemes import _load_object

    report = e2e.verify_generate(_load_object(f"{glue}:next_token"), _load_object(f"{glue}:generate"), [0], length=2,
                                 budget="quick")
    level = 0.01 / (2 + 3)  # one arm, exact mode: length + 3 planned tests
    want = min(stats.samples_for_tv(0.02, 2, level, 0.99).n, 1 << 14)  # three cells in the first row
    assert report.cases[0].sequences == want == report.engine["end_to_end"]["sequences_planned"]
    assert report.passed and report.engine["end_to_end"]["sequences_per_s"] > 0


def test_serial_batched_and_two_workers_give_the_same_sequences(glue):
    serial, bad = e2e.sample(f"{glue}:generate", [0], 4, 300, seed=9)
    batched, _ = e2e.sample(f"{glue}:generate_batched", [0], 4, 300, seed=9, batch=64)
    workers, _ = e2e.sample(f"{glue}:generate", [0], 4, 300, seed=9, workers=2)
    assert bad == 0
    np.testing.assert_array_equal(serial, batched)
    np.testing.assert_array_equal(serial, workers)


def test_time_bounds_an_end_to_end_run():
    def slow(prompt, n, seed):  # about 300 sequences a second at best
        time.sleep(0.003)
        return np.random.default_rng(seed).choice(3, size=n, p=TABLE[0])

    t0 = time.perf_counter()
    report = e2e.verify_generate(lambda toks: np.broadcast_to(TABLE[0], toks.shape + (3,)), slow, [0], length=1,
                                 tv=0.001, time_budget="3s")
    # the budget bounds the sampling (no call starts after its deadline); the checks that follow it
    # (the tests, the boundary pass's few calls) come after, and on a loaded machine took 0.6 s more
    e2e_info = report.engine["end_to_end"]
    assert e2e_info["sampling_s"] < 3 * 1.2, e2e_info
    assert time.perf_counter() - t0 < 3 * 2
    assert 0 < report.cases[0].sequences < e2e_info["sequences_planned"]
    # a run cut short never reads as a plain PASS: its verdict, headline and JSON say so, with the claim it
    # reached next to the one planned
    case = report.cases[0]
    assert report.passed and case.short_of_plan and case.verdict == "pass, short"
    assert case.min_detectable_tv > case.min_detectable_tv_planned > 0
    line = " ".join(report.headline().split())
    assert line.startswith("PASS, SHORT OF PLAN") and f"{case.sequences:,} of {e2e_info['sequences_planned']:,}" in line
    assert "pass, short" in report.table() and json.loads(report.to_json())["short_of_plan"] is True


def test_a_run_that_drew_its_plan_reads_as_a_plain_pass():
    report = e2e.verify_generate(lambda toks: np.broadcast_to(TABLE[0], toks.shape + (3,)),
                                 lambda prompt, n, seed: np.random.default_rng(seed).choice(3, size=n, p=TABLE[0]),
                                 [0], length=1, sequences=2000)
    # (pass° here: a loop of numpy's float64 draws cannot reach its boundary, which the verdict says apart)
    assert report.passed and not report.cases[0].short_of_plan and report.cases[0].verdict in ("pass", "pass°")
    assert report.headline().startswith("PASS  ") and "SHORT OF PLAN" not in report.headline()


def test_sequences_and_budget_are_exclusive():
    with pytest.raises(ValueError, match="not both"):
        e2e.verify_generate(lambda t: TABLE[t], lambda p, n, s: np.zeros(n, int), [0], length=1, sequences=10,
                            budget="quick")
