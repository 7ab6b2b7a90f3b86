"""Batch invariance (issue 33, item 5): a request's law must not depend on its batch neighbours.

Both sides: correct samplers (batched, unbatched, the engines' flat ragged layout) pass the batch
pass; a sampler whose requests share uniforms fails `batch-independence`; a sampler whose law moves
with the batch size (a fast path for a batch of one) fails `batch-invariance`, which the battery's
statistical cases miss (their calls carry thousands of requests).
"""

import numpy as np
import pytest

import stats
from specsample import host
from specsample.host.batch import batch_check
from specsample.host.sampler import HostSampler
from specsample.models.pairs import make_pair

from test_host import standard_np

PAIR = make_pair("dirichlet", 0, 8)


class _Shared:
    """A generator whose draws of shape (B, k) are one row of k uniforms broadcast over the batch."""

    def __init__(self, rng):
        self.rng = rng

    def random(self, shape):
        shape = (shape,) if np.isscalar(shape) else tuple(shape)
        return np.broadcast_to(self.rng.random(shape[1:] if len(shape) > 1 else (1,)), shape)


def shared_uniform(drafts, q, p, rng):
    """The bug: uniforms drawn per position, not per request (one row for the whole batch)."""
    return standard_np(drafts, q, p, _Shared(rng))


def single_fast_path(drafts, q, p, rng):
    """The bug: a batch of one takes a 'fast path' that resamples a rejection from p."""
    return standard_np(drafts, q, p, rng, from_p=len(drafts) == 1)


def _check(fn, sizes=None, **options):
    tests, rounds, _ = batch_check(HostSampler(fn, name=fn.__name__, **options), PAIR.target, PAIR.draft, k=4,
                                   **(sizes or {}))
    return {t.name: t for t in tests}, rounds


def test_independence_test_both_sides():
    rng = np.random.default_rng(1)
    p = [stats.independence_test(rng.integers(0, 5, 1500), rng.choice(5, 1500, p=[.6, .3, .05, .04, .01])).pvalue
         for _ in range(400)]
    assert np.mean(np.array(p) < 0.05) < 0.09  # level: 400 runs, 5% nominal
    a = rng.integers(0, 5, 1500)
    b = np.where(rng.random(1500) < 0.2, a, rng.integers(0, 5, 1500))  # one pair in five copies the other
    assert stats.independence_test(a, b).pvalue < 1e-6
    with pytest.raises(ValueError, match="one length"):
        stats.independence_test([1, 2], [1])
    assert stats.independence_test(np.zeros(50, int), rng.integers(0, 3, 50)).dof == 0  # nothing varies


@pytest.mark.parametrize("fn,options", [(standard_np, {}), (lambda d, q, p, rng: tuple(
    x[0] for x in standard_np(d[None], q[None], p[None], rng)), dict(batched=False))], ids=["batched", "unbatched"])
def test_a_correct_sampler_is_batch_invariant(fn, options):
    tests, rounds = _check(fn, **options)
    assert rounds == 3000 + 1500 * 8
    assert tests["batch-invariance"].pvalue > 1e-3 and tests["batch-independence"].pvalue > 1e-3, tests


def test_shared_uniforms_fail_independence():
    tests, _ = _check(shared_uniform)
    assert tests["batch-independence"].pvalue < 1e-12
    assert "agree on the whole outcome 1.000" in tests["batch-independence"].detail


def test_a_batch_size_fast_path_fails_invariance_where_the_cases_do_not_look():
    tests, _ = _check(single_fast_path)
    assert tests["batch-invariance"].pvalue < 1e-6
    assert tests["batch-independence"].pvalue > 1e-3  # its requests do not share randomness
    cases = host.verify_host(single_fast_path, budget=4000, k=4, cases="dirichlet/V8/k4,zeros-in-p/V8/k4")
    assert cases.passed, cases.table()  # batches of thousands: the fast path is almost never taken
    report = host.verify_host(single_fast_path, budget=4000, k=4, cases="dirichlet/V8/k4,boundary/V8/k4")
    assert not report.passed and [c.name for c in report.failed_cases] == ["batch/V8/k4"]


@pytest.mark.long  # the torch reference among ragged neighbours, 10-14 s (numpy samplers run by default)
def test_the_flat_layout_moves_the_probe_among_ragged_neighbours():
    torch = pytest.importorskip("torch")
    from specsample.host import adapters

    small = dict(alone=1000, amid=500)  # torch calls cost more than numpy's: a third of the default sizes
    tests, _ = _check(adapters.torch_ragged().fn, small, layout="flat", inputs="probs,logits", bonus="given",
                      rng="torch", arrays="torch")
    assert tests["batch-invariance"].pvalue > 1e-3 and tests["batch-independence"].pvalue > 1e-3, tests

    def flat_shared(ids, counts, q, p_logits, bonus, generator):
        """The engines' convention, with one row of uniforms for every request (per position)."""
        u = torch.rand(int(counts.max()), generator=generator)
        out = torch.full((len(counts), int(counts.max()) + 1), -1, dtype=torch.int64)
        p = torch.softmax(p_logits.double(), -1)
        start = 0
        for b, n in enumerate(counts.tolist()):
            row = torch.arange(start, start + n)
            px, qx = p[row, ids[row]], q[row, ids[row]].double()
            ok = u[:n] * qx < px
            j = int(n if bool(ok.all()) else int(torch.argmin(ok.to(torch.int8))))
            out[b, :j] = ids[row][:j]
            if j == n:
                out[b, j] = bonus[b]
            else:
                w = torch.clamp(p[start + j] - q[start + j].double(), min=0)
                w = w if float(w.sum()) > 0 else p[start + j]
                out[b, j] = torch.multinomial(w, 1, generator=generator)[0]
            start += n
        return out

    tests, _ = _check(flat_shared, small, layout="flat", inputs="probs,logits", bonus="given", rng="torch",
                      arrays="torch")
    assert tests["batch-independence"].pvalue < 1e-12


def test_the_batch_case_sits_beside_the_boundary_case():
    report = host.verify_host(standard_np, budget=4000, k=4, cases="dirichlet/V8/k4,boundary/V8/k4")
    assert [c.name for c in report.cases] == ["dirichlet/V8/k4", "boundary/V8/k4", "batch/V8/k4"]
    assert report.passed, report.table()
    names = {t.name for t in report.cases[-1].tests}
    assert names == {"batch-invariance", "batch-independence"}
    one = host.verify_host(lambda d, q, p, rng: tuple(x[0] for x in standard_np(d[None], q[None], p[None], rng)),
                           budget=4000, k=4, cases="boundary/V8/k4", batched=False)
    assert [c.name for c in one.cases] == ["boundary/V8/k4"]  # specsample batches it: invariant by construction


def test_the_torch_example_that_shares_acceptance_uniforms_fails_independence():
    """Only its acceptance uniforms are shared (its residual draws are its own): the copies' accepted drafts
    are pinned together, which a pooled table of whole outcomes washed out before the two were tested apart."""
    pytest.importorskip("torch")
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "torch_sampler.py"
    spec = importlib.util.spec_from_file_location("torch_sampler_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    small = dict(alone=1000, amid=500)
    good, _ = _check(mod.standard, small, rng="torch", arrays="torch")
    bad, _ = _check(mod.shared_uniform, small, rng="torch", arrays="torch")
    assert good["batch-independence"].pvalue > 1e-3
    assert bad["batch-independence"].pvalue < 1e-6 and "accepted drafts" in bad["batch-independence"].detail


def test_the_batch_pass_is_chosen_by_name_and_left_out_of_a_boundary_only_selection():
    def names(cases):
        return [c.name for c in host.verify_host(standard_np, budget=2000, k=4, cases=cases, batch_calls=200).cases]

    assert names("boundary/V8/k4") == ["boundary/V8/k4"]  # the boundary pass alone: no batch pass
    assert names("batch/V8/k4") == ["batch/V8/k4"]  # asked for by name: it alone
    assert names("dirichlet/V8/k4,boundary/V8/k4,!batch*") == ["dirichlet/V8/k4", "boundary/V8/k4"]
    assert names("dirichlet/V8/k4,boundary/V8/k4") == ["dirichlet/V8/k4", "boundary/V8/k4", "batch/V8/k4"]


def test_the_batch_pass_states_its_power_and_more_calls_raise_it():
    def shift(calls):
        r = host.verify_host(standard_np, budget=2000, k=4, cases="batch/V8/k4", batch_calls=calls)
        t = r.case("batch/V8/k4").test("batch-invariance")
        assert f"at {calls} calls alone" in t.detail and "would detect 0.05" in t.detail
        return t.min_detectable_tv

    small, large = shift(200), shift(800)
    assert large == pytest.approx(small / 2, rel=0.1)  # four times the calls: half the shift
    from specsample.host.batch import calls_for_shift, min_detectable_shift

    n = calls_for_shift(0.05, 40, 1e-4, 0.99)
    assert min_detectable_shift(n, n // 2, 40, 1e-4, 0.99) == pytest.approx(0.05, rel=0.01)
