"""MLX draws (``mlx.core.random``) are intercepted: forced at their extremes, both ways (issue 31, item 6).

Runs where MLX installs (``pip install "mlx[cpu]"`` on Linux); skips cleanly elsewhere.
"""

import os

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from specsample.host import HostSampler, intercept, verify_host  # noqa: E402
from specsample.host.boundary import host_intercept_check  # noqa: E402
from specsample.schemes import _load_object  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "mlx_sampler.py")


def test_mlx_draws_are_recorded_and_forced():
    with intercept.Interceptor() as rec:
        mx.random.uniform(shape=(2, 3))
        mx.random.gumbel(shape=(4,))
        mx.random.categorical(mx.zeros((2, 5)))
    assert [(d.function, d.kind, d.shape) for d in rec.draws] == [
        ("mlx.random.uniform", "uniform", (2, 3)), ("mlx.random.gumbel", "gumbel", (4,)),
        ("mlx.random.categorical", "discrete", (2,))]
    with intercept.Interceptor((0, 4, 0.0)) as icpt:
        u = mx.random.uniform(low=2.0, high=4.0, shape=(2, 3))
    assert icpt.applied and np.array(u).ravel()[4] == 2.0  # the low end, scaled as MLX scales it
    with intercept.Interceptor((1, 0, -np.inf)) as icpt:
        mx.random.uniform(shape=(1,))
        g = mx.random.gumbel(shape=(3,))
    assert icpt.applied and np.array(g)[0] == -np.inf  # -log(-log(0)): what MLX's Gumbel gives at u = 0
    assert mx.random.uniform is not None and "wrapper" not in repr(mx.random.uniform)  # restored


@pytest.mark.parametrize("name, passes", [("standard", True), ("le_acceptance", False)])
def test_an_mlx_samplers_draws_are_reached_both_ways(name, passes):
    s = HostSampler(_load_object(f"{EXAMPLE}:{name}"), name=name, rng="numpy", arrays="numpy")
    r = host_intercept_check(s, k=3, seed=0)
    if passes:  # every forced uniform and Gumbel value met its draw, and none broke the round
        assert r.violations == 0 and r.reached > 0, r.detail
        assert "mlx.random.uniform float32" in r.detail and "mlx.random.gumbel float32" in r.detail, r.detail
    else:
        assert r.violations > 0 and "probability 0" in r.detail, r.detail


def test_the_mlx_sampler_passes_a_battery_case():
    report = verify_host(_load_object(f"{EXAMPLE}:standard"), budget=3000, k=4, cases="dirichlet/V8/k4")
    assert report.passed, report.table()


def test_draws_inside_mx_compile_are_left_alone():
    """A draw traced by ``mx.compile`` is not forced (the value would stay in the compiled graph and
    every later call would draw it): the setting does not count as applied, and later calls draw afresh."""
    import functools

    state = [mx.random.state]

    @functools.partial(mx.compile, inputs=state, outputs=state)
    def noisy(x):
        return x + mx.random.uniform(shape=(2,))

    with intercept.Interceptor((0, 0, 0.0)) as icpt:
        first = np.array(noisy(mx.zeros((2,))))
    assert not icpt.applied and first[0] != 0.0
    assert not np.array_equal(np.array(noisy(mx.zeros((2,)))), np.array(noisy(mx.zeros((2,)))))
