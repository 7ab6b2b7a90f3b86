"""The boundary pass: extreme uniforms in every slot, hard checks only."""

import jax.numpy as jnp
import numpy as np

from specsample.battery import boundary
from specsample.models import pairs
from specsample.schemes import make_scheme, standard


def _pair():
    return pairs.make_pair("zeros-in-p", 3, 8)


def test_correct_rule_passes_and_le_rule_fails():
    pr = _pair()
    ok = boundary.boundary_check(make_scheme("standard", 4), pr.target, pr.draft)
    assert ok.passed and ok.rounds == (2 * 9 + 2) * boundary.LANES
    bad = boundary.boundary_check(make_scheme("control:le-acceptance", 4), pr.target, pr.draft)
    assert not bad.passed and "= 0: token" in bad.detail and "probability 0" in bad.detail


def test_the_extremes_are_the_generators_extremes():
    assert boundary.EXTREMES[0] == 0.0
    top = np.float32(boundary.EXTREMES[1])
    assert top < 1 and np.nextafter(top, np.float32(2)) == np.float32(1)


def test_a_scheme_without_uniforms_or_with_its_own_key_is_not_applicable():
    pr = _pair()
    greedy = boundary.boundary_check(make_scheme("greedy", 4), pr.target, pr.draft)
    assert greedy.rounds == 0 and greedy.passed and "no uniforms" in greedy.detail
    base = standard(4)
    keyed = base._replace(step=lambda key, t, d, c: base.step(key, t, d, c))
    r = boundary.boundary_check(keyed, pr.target, pr.draft)
    assert r.rounds == 0 and "its own randomness" in r.detail


def test_a_round_emitting_nothing_is_caught():
    from specsample.schemes import UniformStep

    base = standard(4)

    def silent(u, t, d, c):
        out = base.step.round(u, t, d, c)
        return out._replace(n_emitted=jnp.int32(0))

    pr = _pair()
    r = boundary.boundary_check(base._replace(step=UniformStep(silent, base.step.n)), pr.target, pr.draft)
    assert r.violations == r.rounds and "n_emitted = 0" in r.detail
