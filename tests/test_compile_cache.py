"""The persistent compilation cache: a second process loads every compiled chunk; opt-out works."""

import os
import subprocess
import sys

import pytest

ARGS = ["-m", "specsample.cli", "verify", "--cases", "dirichlet/V8/k4", "--k", "4", "--budget", "2000", "--no-progress"]


def _run(env_value, home=None) -> None:
    env = dict(os.environ, SPECSAMPLE_COMPILE_CACHE=str(env_value))
    if home is not None:
        env["XDG_CACHE_HOME"] = str(home)
    r = subprocess.run([sys.executable, *ARGS], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def _entries(folder) -> dict:
    """Each cache file's modification time: a miss recompiles and writes its file anew."""
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} if folder.is_dir() else {}


@pytest.mark.long  # a cold compile of a whole verify, then a warm one: 17 s
def test_a_second_process_compiles_nothing_new(tmp_path):
    folder = tmp_path / "cache"
    _run(folder)
    first = _entries(folder)
    assert first, "the first run wrote no compiled chunk"
    _run(folder)
    assert _entries(folder) == first  # every compile of the second run was a cache hit


# specsample switches the cache on where the engine is imported; one tiny jitted function then compiles
# (every compile is cached: MIN_COMPILE_SECONDS is 0), which is all these two tests need
TINY_COMPILE = ["-c", "from specsample.engine import lanes; import jax, jax.numpy as jnp; "
               "jax.jit(lambda x: x * 2 + 1)(jnp.arange(3)).block_until_ready()"]


@pytest.mark.parametrize("setting", ["on", "0"])
def test_off_means_nothing_written(tmp_path, setting):
    # off ("0"): nothing under the cache folder; on (the default folder under XDG_CACHE_HOME): the same
    # program writes its entry there, so the "off" check can fire
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    for name in ("SPECSAMPLE_COMPILE_CACHE", "JAX_COMPILATION_CACHE_DIR"):  # the defaults, whatever the caller set
        env.pop(name, None)
    if setting == "0":
        env["SPECSAMPLE_COMPILE_CACHE"] = "0"
    r = subprocess.run([sys.executable, *TINY_COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    if setting == "0":
        assert not written, "the compile cache wrote files although it was turned off"
    else:
        assert written, "the compile cache wrote nothing with its default setting"


def test_the_cache_can_be_turned_off(monkeypatch, tmp_path):
    import jax

    from specsample.engine import compile_cache

    monkeypatch.setenv(compile_cache.ENV, "0")
    assert compile_cache.enable() is None
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "c"))
    if jax.config.jax_compilation_cache_dir:  # configured already (by specsample or the user): left alone
        assert compile_cache.enable() is None


@pytest.mark.last
def test_compiled_code_is_dropped_before_the_memory_map_limit():
    """Each CPU executable maps hundreds of regions; at vm.max_map_count LLVM fails or a cached
    executable segfaults. Past the threshold a battery drops compiled code first."""
    import jax
    import jax.numpy as jnp

    from specsample.engine import compile_cache

    counts = compile_cache.map_counts()
    if counts is None:
        pytest.skip("no /proc here")
    fns = [jax.jit(lambda x, i=i: jnp.sin(x) * i) for i in range(20)]
    for f in fns:
        f(jnp.ones(3))
    before = compile_cache.map_counts()[0]
    assert not compile_cache.release_if_crowded(1.0)  # far from the limit: nothing dropped
    assert compile_cache.release_if_crowded(0.0)
    import gc

    gc.collect()
    assert compile_cache.map_counts()[0] < before
    assert float(fns[0](jnp.ones(3))[0]) == 0.0  # what was dropped compiles again when used


def _root_conftest():
    import importlib.util

    spec = importlib.util.spec_from_file_location("root_conftest", os.path.join(os.path.dirname(__file__), "..",
                                                                                 "conftest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_default_test_run_compiles_for_speed_only_where_its_flags_are_known():
    conftest = _root_conftest()
    measured, older = conftest.EMITTER_JAXLIB[0], (0, 6)
    both = conftest.run_flags("", measured)
    assert conftest.OPT_FLAG in both and conftest.EMITTER_FLAG in both
    assert conftest.run_flags("", older) == conftest.OPT_FLAG  # an unknown XLA flag would abort JAX's start
    assert conftest.run_flags("--xla_backend_optimization_level=2", measured) == "--xla_backend_optimization_level=2"
    kept = conftest.run_flags("--xla_cpu_use_fusion_emitters=true", measured)
    assert kept.count("fusion_emitters") == 1 and conftest.OPT_FLAG in kept
    # this test run: where conftest chose the level, it chose the emitter too on the jaxlib it was measured on
    ours = os.environ.get("XLA_FLAGS", "")
    lo, hi = conftest.EMITTER_JAXLIB
    if conftest.OPT_FLAG in ours and lo <= conftest._jaxlib_version() < hi:
        assert "xla_cpu_use_fusion_emitters" in ours
