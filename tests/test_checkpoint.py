"""Billion-round runs resume: a run killed at a random point resumes to exactly the counts
of an uninterrupted run (subprocess, small sizes)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from specsample.engine import lanes as engine
from specsample.models import pairs
from specsample import schemes

SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    from specsample import engine, pairs, schemes
    pr = pairs.make_pair("dirichlet", 0)
    c = engine.run(schemes.standard(2), pr.target, pr.draft, sequences=int(sys.argv[2]), length=3,
                   lanes=256, per_lane=8, blocks_per_call=1, checkpoint=sys.argv[1], checkpoint_every=0)
    np.save(sys.argv[1] + ".joint.npy", c.joint)
""")


@pytest.mark.long  # two processes and 600 one-block calls, 12-19 s (the default run resumes in process:
# test_cli_checkpoint_dir, and test_newcomer saves the counts at Ctrl-C)
def test_killed_run_resumes_to_identical_counts(tmp_path):
    ck = str(tmp_path / "run.npz")
    n = 600 * 2048  # 600 blocks of one call each: seconds of run after the first checkpoint
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, ck, str(n)], env=env)
    deadline = time.time() + 240
    while not os.path.exists(ck) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(np.random.default_rng().uniform(0.0, 0.5))  # a random point of the run
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.path.exists(ck), "no checkpoint was written"
    with np.load(ck) as f:
        part = int(f["a_next_block"])
    assert 1 <= part < 600, part  # killed mid-run
    out = subprocess.run([sys.executable, "-c", SCRIPT, ck, str(n)], env=env, timeout=600)
    assert out.returncode == 0
    resumed = np.load(ck + ".joint.npy")
    pr = pairs.make_pair("dirichlet", 0)
    full = engine.run(schemes.standard(2), pr.target, pr.draft, sequences=n, length=3, lanes=256, per_lane=8,
                      blocks_per_call=1).joint
    np.testing.assert_array_equal(resumed, full)


def test_checkpoint_of_other_arguments_or_engine_is_refused(tmp_path, monkeypatch):
    ck = str(tmp_path / "a.npz")
    pr = pairs.make_pair("dirichlet", 0)
    kw = dict(sequences=4096, length=2, lanes=256, per_lane=8, checkpoint=ck)
    engine.run(schemes.standard(2), pr.target, pr.draft, **kw)
    with pytest.raises(ValueError, match="other arguments"):
        engine.run(schemes.standard(2), pr.target, pr.draft, **{**kw, "seed": 1})
    # a scheme of the same name and k with other parameters (here: three draft chains, not two)
    mkw = {**kw, "checkpoint": str(tmp_path / "m.npz")}
    engine.run(schemes.multidraft_with_replacement(2, n_drafts=2), pr.target, pr.draft, **mkw)
    with pytest.raises(ValueError, match="other arguments"):
        engine.run(schemes.multidraft_with_replacement(2, n_drafts=3), pr.target, pr.draft, **mkw)
    # an engine that draws other numbers from the same seed: its counts must not be mixed in
    monkeypatch.setattr(engine, "STREAM_VERSION", engine.STREAM_VERSION + 1)
    with pytest.raises(ValueError, match="older engine"):
        engine.run(schemes.standard(2), pr.target, pr.draft, **kw)


def test_every_registered_step_is_described_without_addresses():
    """A checkpoint's signature names a scheme's code by module and name: a memory address (a dataclass's
    repr of its functions) would differ in the next process, and no run of that scheme could resume."""
    from specsample.schemes import make_scheme, registered

    for name in registered():
        scheme = make_scheme(name, 2)
        for part in (scheme.step, scheme.prepare):
            if part is not None:
                text = engine._describe(part)
                assert " at 0x" not in text, (name, text)


def test_cli_checkpoint_dir(tmp_path, capsys):
    # in this process (its compiled chunks serve both runs); a killed process resumes in the test above
    from specsample.cli import main

    args = ["verify", "--budget", "quick", "--k", "2", "--cases", "dirichlet/V8/k2", "--checkpoint", str(tmp_path),
            "--no-progress"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert any(p.name.endswith(".npz") for p in tmp_path.iterdir())
    assert main(args) == 0  # resumes from the final state
    assert capsys.readouterr().out.splitlines()[-1] == first.splitlines()[-1]
