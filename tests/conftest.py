import os

import numpy as np
import pytest

# Long statistical runs: `pytest -m long`. CI runs them bounded (SPECSAMPLE_LONG=bounded).
LONG_BOUNDED = os.environ.get("SPECSAMPLE_LONG", "full") == "bounded"


def pytest_collection_modifyitems(config, items):
    """The slowest tests (marked ``heavy``) first: two workers given the longest first end within a
    short test of each other, where one given a 200 s test last runs alone for its length. Tests
    marked ``last`` (they drop every compiled function of their process) run after all others."""

    def rank(item):
        return 0 if item.get_closest_marker("heavy") else 2 if item.get_closest_marker("last") else 1

    items.sort(key=rank)  # stable: otherwise as collected


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_code():
    """After each test module, compiled executables are dropped only when this worker nears the
    kernel's memory-map limit (see specsample.engine.compile_cache.release_if_crowded): traces are
    shared across modules, and a whole test run keeps far from the limit."""
    yield
    import sys

    if "jax" in sys.modules:
        from specsample.engine import compile_cache

        compile_cache.release_if_crowded()


@pytest.fixture(autouse=True)
def _program_cache_stays_off():
    """The program cache stays off in tests (specsample.program_cache): a test that patches specsample's
    internals would otherwise load programs traced without its patch. A test that turns it on and leaves
    it on fails here, and the variable is put back so the rest of its worker is unaffected."""
    from specsample import program_cache  # standard library imports only: no JAX

    name = program_cache.ENV
    before = os.environ.get(name)
    yield
    after = os.environ.get(name)
    if after != before:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before
        pytest.fail(f"{name} was {before!r} before this test and {after!r} after it; change it with monkeypatch")
