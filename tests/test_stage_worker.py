"""The stage pass in a worker process: used only where it cannot change a result, and it does not.

The worker rebuilds a registered scheme and a case's pair from their names and plays the same
pass as the battery's thread; these tests hold it to the same results, bit for bit, for a table
case and a tree case (and a transformer case's exact laws), and check what happens when the child cannot serve.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from specsample.battery import stage_worker, suite
from specsample.battery.cases import default_cases
from specsample.schemes import SCHEMES, builtin_scheme, make_scheme



def _served(w=None):
    """The process's worker, checked afterwards not to have fallen back to playing here."""
    w = w or stage_worker.worker()
    assert w is not None and w.broken is None
    return w


def _case(name, k):
    bud, _, _ = suite.resolve_budget("quick")
    return next(c for c in default_cases(bud, (k,)) if c.name == name)


def _same(a, b):
    (tests_a, stages_a), (tests_b, stages_b) = a, b
    assert [(t.name, t.statistic, t.pvalue, t.dof) for t in tests_a] == [
        (t.name, t.statistic, t.pvalue, t.dof) for t in tests_b]
    assert len(stages_a) == len(stages_b)
    for x, y in zip(stages_a, stages_b):
        for u, v in zip(x, y):
            if isinstance(u, str) or u is None:
                assert u == v
            else:
                assert np.array_equal(np.asarray(u, np.float64), np.asarray(v, np.float64), equal_nan=True)


@pytest.mark.parametrize("scheme, case, k", [("standard", "dirichlet/V8/k4", 4), ("tree-wor", "ngram-2/V4/k4", 4)])
def test_the_worker_plays_the_pass_the_thread_plays(scheme, case, k):
    c, s = _case(case, k), make_scheme(scheme, k)
    seed, sequences = 3, 4096
    here = suite._stage_pass(c, s, c.pair(seed), sequences, seed)
    w = _served()
    there = w.submit(suite._stage_pass, scheme, c, s, c.pair(seed), sequences, seed)
    _same(here, there.result(timeout=300))
    _served(w)
    assert here[0]  # the case has stage tests to compare


def test_the_worker_computes_a_transformer_case_s_exact_laws_as_the_thread_does():
    """A transformer case sends the worker its exact laws only (its stage tests read the rounds its engine
    run recorded: tests/test_recorded_rounds.py)."""
    c, s = _case("transformer-far/V8/k1", 1), make_scheme("cached", 1)
    here = suite._case_laws(c, s, c.pair(3), 4096, 3)
    w = _served()
    there = w.submit(suite._case_laws, "cached", c, s, c.pair(3), 4096, 3).result(timeout=300)
    _served(w)
    assert len(here) == len(there) == 2 and here[0][0].shape == (1, 8)
    for a, b in zip(here, there):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_an_error_in_the_worker_comes_back_as_the_error():
    c = _case("dirichlet/V8/k4", 4)
    w = _served()
    future = w.submit(suite._stage_pass, "no-such-scheme", c, make_scheme("standard", 4), c.pair(0), 64, 0)
    with pytest.raises(ValueError, match="unknown scheme 'no-such-scheme'"):  # raised in the child, by name
        future.result(timeout=300)
    _served(w)


def test_a_worker_that_died_leaves_the_pass_to_the_battery():
    w = stage_worker.StageWorker()
    w._proc.kill()
    w._proc.wait()
    c = _case("dirichlet/V8/k4", 4)
    here = suite._stage_pass(c, make_scheme("standard", 4), c.pair(0), 64, 0)
    future = w.submit(suite._stage_pass, "standard", c, make_scheme("standard", 4), c.pair(0), 64, 0)
    _same(future.result(timeout=60), here)
    assert w.broken is not None
    w.close()


def test_only_specsample_schemes_on_cpu_go_to_the_worker(monkeypatch):
    monkeypatch.setenv(stage_worker.ENV, "on")
    assert stage_worker.eligible("tree-wor", 1)
    assert not stage_worker.eligible(make_scheme("standard", 4), 100)  # a Scheme object: its factory is unknown
    assert not stage_worker.eligible(lambda k: make_scheme("standard", k), 100)  # a user's factory
    monkeypatch.setitem(SCHEMES, "standard", lambda k=4: make_scheme("greedy", k))  # a name re-registered
    assert not builtin_scheme("standard") and not stage_worker.eligible("standard", 100)
    monkeypatch.undo()
    monkeypatch.setenv(stage_worker.ENV, "off")
    assert not stage_worker.eligible("tree-wor", 100)
    monkeypatch.delenv(stage_worker.ENV)
    assert not stage_worker.eligible("tree-wor", stage_worker.MIN_CASES - 1)  # too few passes to pay for a start


def test_verify_gives_one_report_with_the_worker_and_without(monkeypatch):
    # with the worker, the battery also takes back the passes it has not started once its own work is done
    kw = dict(budget="quick", cases="dirichlet/V8/k4,ngram-2/V4/k1,zeros-in-p/V8/k1", seed=5)
    reports = []
    for setting in ("off", "on"):
        monkeypatch.setenv(stage_worker.ENV, setting)
        reports.append(suite.verify("tree-wor", **kw))
    a, b = ([(c.name, t.name, t.statistic, t.pvalue) for c in r.cases for t in c.tests] for r in reports)
    assert a == b and any(name.startswith("stage:") for _, name, _, _ in a)


def test_a_transformer_case_gives_one_report_with_the_worker_and_without(monkeypatch):
    # its stage pass and its exact prefix laws both come from the worker
    reports = []
    for setting in ("off", "on"):
        monkeypatch.setenv(stage_worker.ENV, setting)
        reports.append(suite.verify("cached", budget=2048, cases="transformer-far/V8/k4", seed=7))
    a, b = ([(c.name, t.name, t.statistic, t.pvalue) for c in r.cases for t in c.tests] for r in reports)
    assert a == b and any(name.startswith("stage:") for _, name, _, _ in a) and any(n == "joint" for _, n, _, _ in a)


def test_what_the_child_prints_does_not_reach_the_results_pipe():
    c = _case("dirichlet/V8/k4", 4)
    s, w = make_scheme("standard", 4), _served()
    printed = w.submit(print, "standard", c, s, c.pair(0), 64, 0)  # print(case, scheme, pair, 64, 0) in the child
    assert printed.result(timeout=300) is None
    after = w.submit(suite._stage_pass, "standard", c, s, c.pair(0), 64, 0)
    assert after.result(timeout=300)[0]  # the pipe still carries results
    _served(w)


def test_one_core_keeps_the_pass_in_the_thread(monkeypatch):
    monkeypatch.delenv(stage_worker.ENV, raising=False)
    monkeypatch.setattr(stage_worker.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert not stage_worker.eligible("tree-wor", 100)
    monkeypatch.setattr(stage_worker.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert stage_worker.eligible("tree-wor", 100)


def test_a_worker_whose_parent_is_done_exits_cleanly():
    # the command leaves without its exit handlers (os._exit) and closes the worker first; the child
    # leaves on the closed pipe (os._exit too), with code 0
    w = stage_worker.StageWorker()
    c = _case("dirichlet/V8/k4", 4)
    assert w.submit(suite._stage_pass, "standard", c, make_scheme("standard", 4), c.pair(0), 64, 0).result(timeout=300)
    w.close()
    assert w._proc.poll() == 0


def test_a_job_the_child_has_not_started_is_given_back_and_played_here_once():
    # the parent, done with its own work, takes the worker's last jobs; each job runs once, on one side,
    # and gives what the thread gives
    w = stage_worker.StageWorker()
    cases = [_case(name, 4) for name in ("dirichlet/V8/k4", "ngram-2/V4/k4", "zeros-in-p/V8/k4")]
    s = make_scheme("tree-wor", 4)
    here = [suite._stage_pass(c, s, c.pair(1), 4096, 1) for c in cases]
    futures = [w.submit(suite._stage_pass, "tree-wor", c, s, c.pair(1), 4096, 1) for c in cases]
    assert w.steal()  # the child is still starting, or on the first job: the last one comes back
    while w.steal():
        pass
    for a, f in zip(here, futures):
        _same(a, f.result(timeout=300))
    assert w.stolen >= 1 and w.broken is None and not w.steal()
    w.close()
    assert w._proc.poll() == 0


def _cores() -> int:
    return stage_worker._cores()


@pytest.mark.skipif(_cores() < 2, reason="the worker needs two cores")
def test_the_command_starts_the_worker_before_it_imports_jax():
    # `specsample verify` starts the worker first, so that its imports run beside the command's; the worker
    # found then is the one the battery gets, and it plays the pass the thread plays

    code = (
        "import sys\n"
        "from specsample.battery import stage_worker\n"
        "stage_worker.start_early()\n"
        "assert 'jax' not in sys.modules and 'stats' not in sys.modules, 'imported before the start'\n"
        "w = stage_worker._WORKER\n"
        "assert w is not None and w._proc.poll() is None\n"
        "from specsample.battery import suite\n"
        "from specsample.battery.cases import default_cases\n"
        "from specsample.schemes import make_scheme\n"
        "assert stage_worker.worker() is w\n"
        "c = next(c for c in default_cases(suite.resolve_budget('quick')[0], (4,)) if c.name == 'dirichlet/V8/k4')\n"
        "s = make_scheme('standard', 4)\n"
        "here = suite._stage_pass(c, s, c.pair(0), 256, 0)\n"
        "there = w.submit(suite._stage_pass, 'standard', c, s, c.pair(0), 256, 0).result(timeout=300)\n"
        "row = lambda tests: [(t.name, t.statistic, t.pvalue) for t in tests]\n"
        "assert row(here[0]) == row(there[0]) and here[0] and w.broken is None\n"
        "stage_worker.shutdown()\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k not in (stage_worker.ENV, "JAX_PLATFORMS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_an_early_start_is_skipped_where_the_battery_would_not_use_the_worker(monkeypatch):
    started = []
    monkeypatch.setattr(stage_worker, "worker", lambda: started.append(1))
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(stage_worker, "_cores", lambda: 2)
    monkeypatch.setenv(stage_worker.ENV, "off")
    stage_worker.start_early()
    monkeypatch.delenv(stage_worker.ENV)
    monkeypatch.setattr(stage_worker, "_cores", lambda: 1)
    stage_worker.start_early()
    monkeypatch.setattr(stage_worker, "_cores", lambda: 2)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    stage_worker.start_early()
    assert not started
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    stage_worker.start_early()
    assert started == [1]


@pytest.mark.parametrize("argv, early", [
    ("verify", True), ("verify --scheme cached --budget quick", False), ("verify --scheme tree-wor --k 4", True),
    ("verify --scheme control:tree-flat-positions", False),
    ("verify --scheme my_module:scheme", False), ("verify --scheme ./mine.py:scheme", False),
    ("verify --cases dirichlet/V8/k4", False), ("verify --sampler s.py:f", False),
    ("verify --num-processes 2 --process-id 0 --coordinator h:1", False)])
def test_the_command_starts_the_worker_early_for_a_registered_scheme_s_default_cases_only(argv, early):
    from specsample import cli

    assert cli._default_battery(cli._parser().parse_args(argv.split())) is early


def test_a_worker_that_never_had_a_job_ends_at_once():
    # started early by a command that then stopped on an error: its imports do not hold the command up
    w = stage_worker.StageWorker()
    w.close()
    assert w._proc.poll() is not None


def test_the_schemes_the_command_starts_no_worker_for_are_the_registered_kv_cache_schemes():
    """The command looks the scheme up in a list before it imports JAX: the list must be the registry's."""
    from specsample.schemes import StatefulStep, registered

    stateful = {n for n in registered() if isinstance(make_scheme(n, 4).step, StatefulStep)}
    assert stage_worker.KV_CACHE_SCHEMES == stateful, (
        "a scheme over KV caches was registered or removed: update stage_worker.KV_CACHE_SCHEMES")
