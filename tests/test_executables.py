"""Compiled executables kept by the program cache (specsample.program_cache.executables): one that JAX read from its
own persistent cache is kept from that entry's bytes, so a new process runs it; one whose origin is not
known is not kept; another CPU's is not loaded."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsample.program_cache import executables

pytest.importorskip("flatbuffers")

# a program of several fusions, called through the program cache as specsample's own programs are
_SCRIPT = textwrap.dedent("""
    import hashlib, json, sys
    import numpy as np
    import specsample.engine.lanes  # points JAX's persistent cache at SPECSAMPLE_COMPILE_CACHE
    import jax, jax.numpy as jnp
    from specsample import program_cache

    @jax.jit
    def f(x, y):
        a = jnp.sin(x) * y[::-1]
        b = jax.lax.dynamic_slice(a * 3, (2,), (10,))
        return jnp.cumsum(b) + jnp.tanh(a[:10]), jax.nn.softmax(a)

    x, y = np.arange(64, dtype=np.float32), np.linspace(0, 1, 64, dtype=np.float32)
    out = program_cache.call(f, ("test-executables",), x, y)
    digest = hashlib.sha256(b"".join(np.asarray(o).tobytes() for o in out)).hexdigest()
    print(json.dumps(dict(program_cache.STATS, digest=digest)))
""")


def _run(tmp_path):
    env = dict(os.environ, SPECSAMPLE_COMPILE_CACHE=str(tmp_path), SPECSAMPLE_PROGRAM_CACHE="1")
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def _kept(tmp_path):
    return [tmp_path / "programs" / n for n in os.listdir(tmp_path / "programs") if n.startswith("x-")]


def test_an_executable_jax_read_from_its_cache_is_kept_from_that_entry(tmp_path):
    first = _run(tmp_path)  # compiled now: serialised anew
    assert first["executables_saved"] == 1 and first["traced"] == 1
    for path in _kept(tmp_path):
        path.unlink()  # JAX's cache still holds the executable: the next process reads it from there
    second = _run(tmp_path)
    assert second["executables_saved"] == 1 and second["traced"] == 0 and second["executables_loaded"] == 0
    # kept from JAX's entry: a new serialisation of the executable JAX deserialised from it lacks its
    # functions (XLA's CPU client), and the next process would fail with NOT_FOUND running it
    third = _run(tmp_path)
    assert third["executables_loaded"] == 1 and third["executables_saved"] == 0
    assert first["digest"] == second["digest"] == third["digest"]


def test_an_executable_from_jax_s_memory_is_not_kept(tmp_path):
    f = jax.jit(lambda x: jnp.cos(x) * 3)
    x = np.ones(16, np.float32)
    compiled, log = executables.compile_watched(f, [x])
    again, log_again = executables.compile_watched(f, [x])  # JAX's in-memory cache: origin not known
    assert log and not log_again
    written = []
    assert not executables.save(str(tmp_path / "x-b"), "b", again, log_again, None, lambda *a: written.append(a))
    assert not written
    if any(how == "fresh" for how, *_ in log):  # compiled now (no persistent cache here): kept
        assert executables.save(str(tmp_path / "x-a"), "a", compiled, log, None, lambda p, d: open(p, "wb").write(d))
        loaded, _ = executables.load(str(tmp_path / "x-a"), "a")
        assert np.array_equal(np.asarray(executables.call(loaded, [x])), np.asarray(f(x)))


def test_an_entry_is_loaded_for_its_own_key_and_cpu_only(tmp_path, monkeypatch):
    x = np.ones(4, np.float32)
    compiled, log = executables.compile_watched(jax.jit(lambda x: jnp.tanh(x) + 1), [x])
    path = str(tmp_path / "x-k")
    if not executables.save(path, "k", compiled, log, None, lambda p, d: open(p, "wb").write(d)):
        pytest.skip("the executable came from JAX's memory here")
    assert executables.load(path, "k") is not None
    assert executables.load(path, "another key") is None
    assert executables.load(str(tmp_path / "x-none"), "k") is None
    monkeypatch.setattr(executables, "cpu_identity", lambda: "another host's CPU")
    assert executables.load(path, "k") is None


def test_an_executable_is_written_in_the_layout_of_the_installed_jax_or_not_at_all(tmp_path, monkeypatch):
    # JAX 0.12.1 numbered its pickled tuple (version 3); an entry in the old layout failed to load there
    from jax.experimental import serialize_executable as se

    x = np.ones(8, np.float32)
    compiled, log = executables.compile_watched(jax.jit(lambda x: jnp.sin(x) - 2), [x])
    if not any(how == "fresh" for how, *_ in log):
        pytest.skip("the executable came from JAX's persistent cache here")
    path = str(tmp_path / "x-v")
    assert executables.save(path, "v", compiled, log, None, lambda p, d: open(p, "wb").write(d))
    loaded, _ = executables.load(path, "v")  # through se.deserialize_and_load, which checks the version
    assert np.array_equal(np.asarray(executables.call(loaded, [x])), np.sin(x) - 2)
    monkeypatch.setattr(se, "_SERIALIZATION_VERSION", 99, raising=False)  # a layout not known here
    written = []
    assert not executables.save(str(tmp_path / "x-w"), "w", compiled, log, None, lambda *a: written.append(a))
    assert not written
