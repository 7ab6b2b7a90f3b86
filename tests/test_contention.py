"""A busy machine only slows a run down: no collective between one process's CPU devices.

XLA aborts a cross-device psum on CPU (a fatal check, no report) when one device thread
waits more than its collective timeout for another; the engine therefore returns each
device's counts and adds them on the host. The compiled chunk is checked for collectives
(deterministic), and a real run is starved on purpose and must give the quiet run's report.
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from specsample.engine import lanes as engine
from specsample.models.tables import TableModel
from specsample.schemes import make_scheme

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


def _hlo(devices, monkeypatch=None, processes=1) -> str:
    """The compiled chunk's text; ``processes=2`` builds the multi-process form (with its psum)."""
    p = np.array([[0.5, 0.3, 0.2]], np.float32)
    q = np.array([[0.2, 0.3, 0.5]], np.float32)
    prep = engine._prepare(make_scheme("standard", 2), TableModel(p, 0), TableModel(q, 0), sequences=1024,
                           length=3, seed=0, lanes=64, per_lane=2, joint=None, prng=engine.DEFAULT_PRNG,
                           blocks_per_call=2, devices=devices, prompt=None)
    fn = prep.fn
    if processes > 1:
        monkeypatch.setattr(jax, "process_count", lambda: processes)
        fn = engine._chunk_fn(prep.spec, Mesh(np.array(devices), ("d",)))
    ids = jax.numpy.arange(prep.blocks_per_step, dtype=jax.numpy.uint32)
    return fn.lower(prep.base, ids, jax.numpy.uint32(prep.n_blocks), prep.target, prep.draft,
                    jax.numpy.zeros((0,), jax.numpy.int32)).compile().as_text().lower()


def _collectives(text: str) -> list:
    return [c for c in COLLECTIVES if c in text]


two_devices = pytest.mark.skipif(len(jax.devices()) < 2, reason="needs two CPU devices (conftest exposes every core)")


@two_devices
def test_chunk_has_no_collective_between_devices():
    assert not _collectives(_hlo(jax.devices()[:2])), "a collective makes devices wait for each other"


@two_devices
def test_collective_detector_sees_the_multiprocess_psum(monkeypatch):
    assert "all-reduce" in _collectives(_hlo(jax.devices()[:2], monkeypatch, processes=2))


def _verify(tmp_path, name, prefix=(), extra_flags="") -> dict:
    out = tmp_path / f"{name}.json"
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=4 {extra_flags}".strip()
    cmd = [*prefix, sys.executable, "-m", "specsample.cli", "verify", "--cases", "dirichlet/V8/k4",
           "--k", "4", "--budget", "2000", "--no-progress", "--json", str(out)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    doc.pop("seconds", None)
    doc.pop("engine", None)
    for case in doc["cases"]:
        case.pop("seconds", None)
    return doc


@pytest.mark.heavy
@pytest.mark.long
@pytest.mark.skipif(not shutil.which("taskset") or not hasattr(os, "sched_getaffinity"), reason="needs taskset")
def test_starved_run_gives_the_quiet_report(tmp_path):
    """Four device threads and two busy loops share one core; our process runs at nice 10.

    The collective timeouts are cut to 1 s (where this jaxlib knows the flags), so any
    rendezvous left in the chunk would abort under this contention.
    """
    quiet = _verify(tmp_path, "quiet")
    core = str(min(os.sched_getaffinity(0)))
    hogs = [subprocess.Popen(["taskset", "-c", core, sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        short = ""
        if tuple(int(x) for x in jax.__version__.split(".")[:2]) >= (0, 10):
            short = ("--xla_cpu_collective_call_terminate_timeout_seconds=1 --xla_cpu_collective_timeout_seconds=1 "
                     "--xla_cpu_collective_call_warn_stuck_timeout_seconds=1")
        starved = _verify(tmp_path, "starved", prefix=("taskset", "-c", core, "nice", "-n", "10"), extra_flags=short)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert starved == quiet
