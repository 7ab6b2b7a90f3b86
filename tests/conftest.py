import os

import numpy as np
import pytest

# Long statistical runs: `pytest -m long`. CI runs them bounded (SPECSAMPLE_LONG=bounded).
LONG_BOUNDED = os.environ.get("SPECSAMPLE_LONG", "full") == "bounded"


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
