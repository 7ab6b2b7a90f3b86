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
    shared across modules, and a whole session keeps far from the limit."""
    yield
    import sys

    if "jax" in sys.modules:
        from specsample.engine import compile_cache

        compile_cache.release_if_crowded()
