"""The program cache (specsample.program_cache): a program loaded from disk gives the very counts of
one traced now, and only specsample's own code, at this source, gets a key."""

import dataclasses
import hashlib
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsample import program_cache
from specsample.engine import lanes as engine
from specsample.models.pairs import make_pair, neural_pair
from specsample.schemes import SCHEMES, builtin_identity, make_scheme, program_identity, standard

pytest.importorskip("flatbuffers")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A cache of this test's own that saves every program, fresh counters."""
    monkeypatch.setattr(program_cache, "folder", lambda: str(tmp_path))
    monkeypatch.setattr(program_cache, "SAVE_SECONDS", 0.0)
    monkeypatch.setattr(program_cache, "_LOADED", {})
    monkeypatch.setattr(program_cache, "STATS", dict.fromkeys(program_cache.STATS, 0))
    return tmp_path


def _digest(counts) -> str:
    return hashlib.sha256(b"".join(np.asarray(f).tobytes() for f in counts if f is not None)).hexdigest()


def _neural_run():
    pair = neural_pair("transformer-close", 3, vocab=8, prompt_len=2)
    return lambda: engine.run(make_scheme("cached", 2), pair.target, pair.draft, sequences=256, length=4, seed=5,
                              lanes=64, per_lane=4, prompt=pair.prompt)


def _table_run(**kw):
    pair = make_pair("dirichlet-peaked", 11, 6)
    return lambda: engine.run(make_scheme("standard", 3), pair.target, pair.draft, sequences=1024, length=3, seed=2,
                              lanes=128, per_lane=8, **kw)


@pytest.mark.parametrize("make_run", [_neural_run, _table_run], ids=["cached-transformer", "standard-table"])
def test_a_loaded_program_counts_what_the_traced_one_counts(folder, monkeypatch, make_run):
    run = make_run()
    traced = _digest(run())
    assert program_cache.STATS["saved"] >= 1 and os.listdir(folder)
    program_cache.clear()
    loaded = _digest(run())
    assert program_cache.STATS["loaded"] >= 1
    monkeypatch.setattr(program_cache, "folder", lambda: None)  # the cache off: the jitted function itself
    assert _digest(run()) == traced == loaded


def test_a_mesh_other_than_the_default_is_not_kept(folder):
    if jax.device_count() < 2:
        pytest.skip("needs two devices")
    _table_run(devices=jax.devices()[1:])()
    assert not os.listdir(folder) and program_cache.STATS["traced"] == 0


def test_an_entry_that_does_not_load_is_traced_again_and_replaced(folder):
    run = _neural_run()
    want = _digest(run())
    for name in os.listdir(folder):
        (folder / name).write_bytes(b"not a program")
    program_cache.clear()
    assert _digest(run()) == want
    assert program_cache.STATS["failed"] >= 1 and program_cache.STATS["saved"] >= 2
    program_cache.clear()
    assert _digest(run()) == want and program_cache.STATS["loaded"] >= 1


def test_only_the_registry_s_own_schemes_have_an_identity(monkeypatch):
    assert builtin_identity(make_scheme("standard", 4)) == ("standard", 4)
    assert program_identity(make_scheme("standard", 4), "stage-step", 9) == ("stage-step", ("standard", 4), 9)
    assert program_identity(standard(4), "stage-step", 9) is None  # a user's scheme: traced every time
    assert builtin_identity(standard(4)) is None  # built by hand: nothing says it is the registry's
    assert builtin_identity(make_scheme("standard", 4)._replace(k=3)) is None  # the registry's, changed by hand
    monkeypatch.setitem(SCHEMES, "standard", lambda k: standard(k))  # a user's factory under the name
    assert builtin_identity(make_scheme("standard", 4)) is None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _UsersModel:
    weights: jax.Array
    note: str = dataclasses.field(metadata=dict(static=True))


def test_a_key_needs_specsample_s_own_containers_and_arrays():
    x = jnp.ones(3)
    assert program_cache.key(("t",), (x, {"a": x}, (x,))) is not None
    pair = neural_pair("transformer-far", 0, vocab=4)
    assert program_cache.key(("t",), (pair.target, x)) is not None
    assert program_cache.key(("t",), (_UsersModel(x, "v1"), x)) is None  # its code is not in the digest
    assert program_cache.key(("t",), (x, "text")) is None


def test_the_source_digest_reads_the_whole_package():
    import specsample

    assert program_cache.package_root() == os.path.dirname(os.path.abspath(specsample.__file__))


def test_a_key_changes_with_the_source_the_identity_and_the_shapes(monkeypatch):
    x = jnp.ones(3)
    base = program_cache.key(("t", 1), (x,))
    assert base == program_cache.key(("t", 1), (jnp.zeros(3),))  # values are arguments, not part of it
    assert program_cache.key(("t", 2), (x,)) != base
    assert program_cache.key(("t", 1), (jnp.ones(4),)) != base
    assert program_cache.key(("t", 1), (jnp.ones(3, jnp.int32),)) != base
    monkeypatch.setattr(program_cache, "source_digest", lambda: "an edited package")
    assert program_cache.key(("t", 1), (x,)) != base


def test_prune_drops_the_least_recently_used_entries(tmp_path):
    for i in range(8):
        path = tmp_path / f"e{i}"
        path.write_bytes(b"x" * 1000)
        os.utime(path, (1000 + i, 1000 + i))
    assert program_cache.prune(str(tmp_path), max_bytes=10_000) == 0  # under the limit: nothing goes
    assert program_cache.prune(str(tmp_path), max_bytes=6000) == 4  # down to 3/4 of it, oldest first
    assert sorted(os.listdir(tmp_path)) == ["e4", "e5", "e6", "e7"]


def test_on_in_the_command_off_in_a_library_process(monkeypatch):
    # setenv, not delenv: delenv of an unset variable records nothing to undo, and enable() below would then
    # leave the cache on for every later test of this worker
    monkeypatch.setenv(program_cache.ENV, "")
    assert program_cache.folder() is None  # a test's monkeypatched internals must not reach the disk
    program_cache.enable()
    assert program_cache.folder() == os.path.join(jax.config.jax_compilation_cache_dir, "programs")
    monkeypatch.setenv(program_cache.ENV, "0")
    assert program_cache.folder() is None
    out = subprocess.run([sys.executable, "-m", "specsample", "list"], capture_output=True, text=True)
    assert out.returncode == 0


def test_a_new_process_loads_what_the_last_one_saved(tmp_path):
    script = textwrap.dedent("""
        import hashlib, numpy as np
        from specsample import program_cache
        from specsample.engine import lanes as engine
        from specsample.models.pairs import neural_pair
        from specsample.schemes import make_scheme
        pair = neural_pair("transformer-far", 1, vocab=4, prompt_len=1)
        c = engine.run(make_scheme("cached", 2), pair.target, pair.draft, sequences=128, length=3, seed=9,
                       lanes=64, per_lane=2, prompt=pair.prompt)
        print(program_cache.STATS["loaded"], program_cache.STATS["executables_loaded"],
              hashlib.sha256(np.asarray(c.joint).tobytes()).hexdigest())
    """)
    env = dict(os.environ, SPECSAMPLE_COMPILE_CACHE=str(tmp_path), SPECSAMPLE_PROGRAM_CACHE="1")
    out = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
           .stdout.split() for _ in range(2)]
    assert out[0][0] == "0" and int(out[1][0]) >= 1  # the second process traced nothing it had saved
    # its engine chunk came back as a compiled executable (over every device of the default mesh)
    assert int(out[1][1]) >= 1
    assert out[0][2] == out[1][2]


def test_the_edge_and_boundary_checks_load_what_they_traced(folder):
    from specsample.battery import boundary, edges

    scheme = make_scheme("tree-wor", 2)
    pair = make_pair("zeros-in-p", 4, 8)

    def checks():
        return (edges.jax_edge_check(scheme, seed=1),
                boundary.boundary_check(make_scheme("standard", 2), pair.target, pair.draft, seed=1))

    traced = checks()
    assert program_cache.STATS["saved"] >= 2
    program_cache.clear()
    assert checks() == traced and program_cache.STATS["loaded"] >= 2


def test_the_table_and_tree_stage_passes_load_what_they_traced(folder, monkeypatch):
    from specsample.battery import stages, tree_stages

    pair = make_pair("zeros-in-p", 4, 8)

    def passes():
        monkeypatch.setattr(stages, "_PLAY", {})  # a new process: no jitted player kept yet
        monkeypatch.setattr(tree_stages, "_PLAY", {})
        return [stages.table_stage_tests(make_scheme(name, 2), pair.target, pair.draft, 512, 3)[0]
                for name in ("standard", "tree-wor")]

    def rows(results):
        return [[(t.name, t.statistic, t.pvalue) for t in tests] for tests in results]

    traced = passes()
    assert program_cache.STATS["saved"] >= 2 and all(traced)
    program_cache.clear()
    assert rows(passes()) == rows(traced) and program_cache.STATS["loaded"] >= 2


def test_a_kept_value_comes_back_to_the_bit_and_only_for_its_key(folder):
    calls = []

    def pair():
        calls.append(1)
        return neural_pair("transformer-close", 4, vocab=8, prompt_len=2)

    fresh = program_cache.value(pair, ("test-pair", 4))
    kept = program_cache.value(pair, ("test-pair", 4))
    assert len(calls) == 1 and program_cache.STATS["values_loaded"] == 1
    assert jax.tree.structure(kept) == jax.tree.structure(fresh)
    for a, b in zip(jax.tree.leaves(fresh), jax.tree.leaves(kept)):
        assert type(a) is type(b) and np.array_equal(np.asarray(a), np.asarray(b))  # same arrays, same bits
    program_cache.value(pair, ("test-pair", 5))  # another identity
    program_cache.value(pair, None)  # no identity (a user's): computed every time
    assert len(calls) == 3


def test_a_case_s_exact_laws_are_kept_as_float64_and_only_for_its_networks(folder, monkeypatch):
    from specsample.battery import suite
    from specsample.laws import exact

    calls = []
    real = exact.prefix_rows
    monkeypatch.setattr(exact, "prefix_rows", lambda *a: calls.append(1) or real(*a))
    pair = neural_pair("transformer-far", 6, vocab=4, prompt_len=1)
    fresh = suite._neural_laws(pair, 3)
    kept = suite._neural_laws(pair, 3)
    assert len(calls) == 2  # both models' rows computed once, then read
    for a, b in zip(jax.tree.leaves(fresh), jax.tree.leaves(kept)):
        assert b.dtype == np.float64 and np.array_equal(a, b)  # numpy, float64, the same bits
    other = neural_pair("transformer-far", 6, vocab=4, prompt_len=1)._replace(draft=pair.draft.perturbed(1, 0.1))
    suite._neural_laws(other, 3)  # another draft: another key
    suite._neural_laws(pair, 4)  # another window
    suite._neural_laws(pair._replace(prompt=((pair.prompt[0] + 1) % 4,)), 3)  # another prompt
    assert len(calls) == 8


def test_the_battery_s_pairs_and_passed_checks_are_kept(folder, monkeypatch):
    from specsample.battery import suite

    pair = neural_pair("transformer-far", 6, vocab=4, prompt_len=1)  # kept: the next one is loaded
    assert neural_pair("transformer-far", 6, vocab=4, prompt_len=1).prompt == pair.prompt
    assert program_cache.STATS["values_loaded"] == 1
    traced = []
    real = suite._check_now
    monkeypatch.setattr(suite, "_check_now", lambda *a: traced.append(1) or real(*a))
    for _ in range(2):
        suite._check_scheme_output(make_scheme("cached", 2), pair, 0, 4)
    assert len(traced) == 1  # the registry's scheme: checked once at this source and these shapes
    for _ in range(2):
        suite._check_scheme_output(make_scheme("cached", 2), pair, 0, 5)  # another length: checked again
        suite._check_scheme_output(standard(2)._replace(name="mine"), make_pair("dirichlet", 0, 4), 0)
    assert len(traced) == 4  # a user's scheme is checked every time

    def broken(k):
        s = standard(k)
        return s._replace(step=dataclasses.replace(s.step, round=lambda u, t, d, c: s.step.round(u, t, d, c)[1:]))

    monkeypatch.setitem(SCHEMES, "standard", broken)  # even under a registered name: not the registry's own
    for _ in range(2):
        with pytest.raises(suite.SchemeError):
            suite._check_scheme_output(make_scheme("standard", 2), make_pair("dirichlet", 0, 4), 0)
