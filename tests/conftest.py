import os

import numpy as np
import pytest

# Long statistical runs: `pytest -m long`. CI runs them bounded (SPECSAMPLE_LONG=bounded).
LONG_BOUNDED = os.environ.get("SPECSAMPLE_LONG", "full") == "bounded"


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_code():
    """Each test module's compiled executables are dropped after it: a whole session keeps far from
    the kernel's memory-map limit (see specsample.compile_cache.release_if_crowded)."""
    yield
    import sys

    if "jax" in sys.modules:
        sys.modules["jax"].clear_caches()
