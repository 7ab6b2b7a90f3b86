"""Floating-point edges (issue 21): edge rows, intercepted randomness, the end-to-end boundary pass.

Both sides each time: every built-in scheme and the correct torch/numpy samplers pass; each edge
has a sampler written here that fails it; a check that reached nothing says "not reached".
"""

import re

import numpy as np
import pytest

import specsample
from specsample.battery import suite as battery, edges
from specsample.loops import verify as e2e
from specsample import host
from specsample.host import intercept
from specsample.loops.boundary import generate_boundary_check
from specsample.host.boundary import _boundary_case, host_intercept_check
from specsample.schemes import make_scheme

from test_host import self_drafting_np, standard_np

BOUNDARY = {c.k: c for c in battery.default_cases(battery.BUDGETS["quick"]) if c.boundary}


def test_the_vanishing_residual_vanishes_in_float32():
    e = {x.name: x for x in edges.catalogue()}
    for name in ("vanishing-residual", "vanishing-residual-spread", "vanishing-residual-large-V"):
        row = e[name]
        assert not np.any(np.maximum(row.p - row.q, np.float32(0)) > 0)  # all zero in float32
        assert row.p[row.hazard] == 0 < row.q[row.hazard]
    assert e["vanishing-residual-large-V"].p.size == 512 and e["vanishing-residual-large-V"].p[:100].sum() == 0
    assert e["subnormal-draft-probability"].q[4] < np.finfo(np.float32).tiny  # subnormal


@pytest.mark.parametrize("name", ["standard", "block", "greedy", "multidraft", "multidraft-wor", "kseq"])
def test_every_built_in_scheme_passes_the_edge_rows(name):
    for k in (1, 4):
        r = edges.jax_edge_check(make_scheme(name, k))
        assert r.passed and r.reached > 0, (name, k, r.detail)


def test_the_edge_player_gives_each_lane_the_round_of_its_own_edge():
    """The player runs every (edge, lane) in one batch over the edges' flattened tables: each lane's
    round is the one its edge's models give alone (rows, alias tables and a tree's chains offset right)."""
    import jax
    import jax.numpy as jnp

    s = make_scheme("tree-wor", 3)  # prepared models: residual chains and siblings' laws per edge
    jobs = [e for e in edges.catalogue() if e.p.size == 8 and e.safe >= 0][:3]
    models = [edges._prepared(s.prepare, e, 1, edges._forced_models(e, 1)) for e in jobs]
    t = jax.tree.map(lambda *x: jnp.stack(x), *[m[0] for m in models])
    d = jax.tree.map(lambda *x: jnp.stack(x), *[m[1] for m in models])
    ctx = jnp.asarray([[[m[2]]] * 2 for m in models], jnp.int32)
    keys = jax.random.split(jax.random.key(5), len(jobs) * 2).reshape(len(jobs), 2)
    out = jax.device_get(edges._jax_player(s.step)(keys, t, d, ctx))
    alone = jax.jit(s.step)
    for e, (tm, dm, _) in enumerate(models):
        for b in range(2):
            for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(alone(keys[e, b], tm, dm, ctx[e, b]))):
                assert np.array_equal(x[e, b], np.asarray(y)), (jobs[e].name, b)


def test_no_residual_fallback_fails_only_the_vanishing_residual_edges():
    r = edges.jax_edge_check(make_scheme("control:no-residual-fallback", 4))
    assert not r.passed and "vanishing-residual" in r.detail
    assert "one-hot-p" not in r.detail.split(";")[0]
    # and the battery's boundary case says so (its statistics cannot)
    report = specsample.verify("control:no-residual-fallback", budget="quick", k=4, cases="boundary/V8/k4")
    assert not report.passed and report.cases[0].test("edge-rows").rejected


def test_host_samplers_right_and_wrong():
    torch = pytest.importorskip("torch")  # noqa: F841
    from specsample.host import adapters

    def tests_of(sampler):
        return {t.name: t for t in _boundary_case(host.load_sampler(sampler), BOUNDARY[4], 0).tests}

    ok = tests_of(adapters.torch_batched())
    assert all(t.pvalue == 1.0 and t.reached for t in ok.values()), ok
    assert set(ok) == {"boundary-uniforms", "boundary-intercepted", "edge-rows"}
    race = tests_of(adapters.exponential_race_residual())  # argmax(residual / E) over an all-zero residual
    assert race["edge-rows"].pvalue == 0 and "vanishing-residual" in race["edge-rows"].detail
    f64 = tests_of(adapters.float64_ge())  # float64 uniforms, p / q >= u
    assert f64["boundary-intercepted"].pvalue == 0 and "torch.rand" in f64["boundary-intercepted"].detail or \
        "emitted token 5" in f64["boundary-intercepted"].detail
    assert not f64["boundary-uniforms"].reached and "float64" in f64["boundary-uniforms"].detail


def hf_accepts_at_u_zero():
    """transformers up to 5.24 accepted with ``r_i <= p_i / q_i`` (u = 0 accepts a token of p = 0);
    5.25 made it strict (``<``)."""
    from packaging.version import Version
    import transformers

    return Version(transformers.__version__) < Version("5.25")


def test_hugging_face_at_u_zero_by_interception():
    pytest.importorskip("transformers")
    from specsample.host import adapters

    r = host_intercept_check(adapters.hf_speculative_sampling(), k=4)
    assert r.reached > 0  # u = 0 reached its acceptance test
    if hf_accepts_at_u_zero():
        assert r.violations > 0 and "emitted token 5, which the target gives probability 0" in r.detail
    else:  # the strict rule: the same values at their extremes, and no violation
        assert r.violations == 0 and r.passed and "torch.rand_like float32" in r.detail, r.detail


def test_numpy_samplers_are_intercepted_through_the_generator_given():
    r = host_intercept_check(host.HostSampler(standard_np), k=4)
    assert r.passed and r.reached > 0 and "Generator.random float64" in r.detail

    def ge_np(drafts, q, p, rng):  # float64 uniforms, accept when p / q >= u
        b, k = drafts.shape
        px = np.take_along_axis(p[:, :k], drafts[..., None], 2)[..., 0]
        qx = np.take_along_axis(q, drafts[..., None], 2)[..., 0]
        ok = px / qx >= rng.random((b, k))
        j = np.where(ok.all(1), k, np.argmin(ok, 1))
        out = np.concatenate([drafts, np.zeros((b, 1), np.int64)], 1)
        out[np.arange(b), j] = np.argmax(p[np.arange(b), j], 1)
        return out, j + 1

    bad = host_intercept_check(host.HostSampler(ge_np), k=4)
    assert bad.violations > 0


def test_a_sampler_whose_draws_cannot_be_reached_is_not_reached_never_passed():
    import random

    class PythonUniforms:  # draws from Python's random module: nothing specsample can intercept
        def random(self, size):
            return np.array([random.random() for _ in range(int(np.prod(size)))]).reshape(size)

    def python_random(drafts, q, p, rng):
        return standard_np(drafts, q, p, PythonUniforms())

    r = host_intercept_check(host.HostSampler(python_random), k=4)
    assert r.reached == 0 and r.verdict == "not reached" and not r.passed
    t = edges.as_test(r)
    assert not t.reached and t.pvalue == 1.0
    from specsample.battery.report import CaseResult, Report

    case = CaseResult("boundary/V8/k4", "s", "f", "m", 8, 4, 6, 0, 0, [t], float("nan"))
    assert case.verdict == "not reached" and case.passed
    report = Report("s", 0.01, 0, "quick", [case], 0.0, 0.99, {})
    assert "NOT REACHED: 1 case (boundary/V8/k4 (edge-rows))" in " ".join(report.headline(200).split())


def test_a_self_drafting_sampler_gets_its_own_pass_and_keeps_its_statistics():
    s = host.load_sampler(self_drafting_np, drafts="self")
    case = _boundary_case(s, BOUNDARY[4], 0)
    names = {t.name: t for t in case.tests}
    assert "boundary-raised" not in names, names
    assert names["edge-rows"].reached and names["edge-rows"].pvalue == 1.0
    assert not names["boundary-uniforms"].reached  # a self-drafting sampler draws its drafts first
    report = host.verify_host(self_drafting_np, drafts="self", budget=2000, k=4,
                              cases="boundary/V8/k4,dirichlet/V8/k4")
    assert [c.name for c in report.cases] == ["dirichlet/V8/k4", "boundary/V8/k4"]
    # the generator-state mode cannot reach it, but interception and the edges did: the case passes
    assert report.passed and report.cases[1].verdict == "pass" and "NOT REACHED" not in report.headline(200)


def _torch_loop(le: bool, k: int = 3):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    q = rng.dirichlet(np.ones(6), size=6)
    p = rng.dirichlet(np.ones(6), size=6)
    for r in p:  # a top-3 target: it forbids tokens the draft keeps
        r[np.argsort(r)[:3]] = 0
    p /= p.sum(1, keepdims=True)
    P, Q = torch.tensor(p), torch.tensor(q)

    def generate(prompt, n, seed):
        g = torch.Generator().manual_seed(int(seed))
        out, last = [], int(prompt[-1])
        while len(out) < n:
            drafts, ctx = [], last
            for _ in range(k):  # drafts first, by torch.multinomial; then the acceptance uniforms
                ctx = int(torch.multinomial(Q[ctx], 1, generator=g))
                drafts.append(ctx)
            u = torch.rand(k, generator=g, dtype=torch.float64)
            ctx, emitted = last, []
            for i, x in enumerate(drafts):
                ratio = P[ctx, x] / Q[ctx, x]
                if (u[i] <= ratio) if le else (u[i] < ratio):
                    emitted.append(x)
                    ctx = x
                    continue
                w = torch.clamp(P[ctx] - Q[ctx], min=0)
                emitted.append(int(torch.multinomial(w if w.sum() > 0 else P[ctx], 1, generator=g)))
                break
            else:
                emitted.append(int(torch.multinomial(P[ctx], 1, generator=g)))
            out += emitted
            last = out[-1]
        return np.array(out[:n])

    return p, generate


def test_a_whole_loop_accepting_with_u_le_p_over_q_fails_the_end_to_end_boundary_pass():
    p, right = _torch_loop(le=False)
    _, wrong = _torch_loop(le=True)
    model = e2e._TeacherForced(lambda t: p[t], "probs", np.array([2]), None)
    ok = generate_boundary_check(model, right, [2], 6, seed=1)
    assert ok.passed and ok.reached > 0
    bad = generate_boundary_check(model, wrong, [2], 6, seed=1)
    assert bad.violations > 0 and "probability 0" in bad.detail
    # inside verify_generate: a hard test of the generate arm, its statistics intact
    report = e2e.verify_generate(lambda t: p[t], wrong, [2], length=3, sequences=2000)
    t = report.cases[0].test("boundary-intercepted")
    assert t.rejected and not report.passed
    assert {x.name for x in report.cases[0].tests} >= {"support", "joint", "boundary-intercepted"}


def test_interception_restores_every_patched_function():
    torch = pytest.importorskip("torch")
    before = (torch.rand, torch.rand_like, torch.Tensor.uniform_, torch.Tensor.exponential_, torch.multinomial,
              np.random.default_rng)
    with intercept.Interceptor((0, 0, 0.0)) as icpt:
        x = torch.rand(3)
    assert x[0] == 0 and icpt.applied and icpt.draws[0].dtype == "torch.float32"
    assert (torch.rand, torch.rand_like, torch.Tensor.uniform_, torch.Tensor.exponential_, torch.multinomial,
            np.random.default_rng) == before
    assert intercept.extremes("uniform", "torch.float64") == (0.0, 1 - 2**-53)
    assert intercept.extremes("uniform", "float32") == (0.0, 1 - 2**-24)


def test_torch_states_are_crafted_to_give_exact_zeros_in_float32_and_float64():
    torch = pytest.importorskip("torch")
    from specsample.host.boundary import crafted_zero_state

    for slot in (0, 3):
        u = torch.rand(5, generator=crafted_zero_state(slot))
        assert u[slot] == 0 and (u[np.arange(5) != slot] > 0).all()
        u64 = torch.rand(5, generator=crafted_zero_state(slot, words=2), dtype=torch.float64)
        assert u64[slot] == 0 and (u64[np.arange(5) != slot] > 0).all()


def _le_rule(drafts, q, p, u, u_last):
    """The standard rule accepting with u q(x) <= p(x) (the boundary bug), uniforms given: ``u`` [b, k]
    for acceptance, ``u_last`` for the token at the stop."""
    b, k = drafts.shape
    px = np.take_along_axis(p[:, :k], drafts[..., None], -1)[..., 0]
    qx = np.take_along_axis(q, drafts[..., None], -1)[..., 0]
    ok = u * qx <= px
    j = np.where(ok.all(1), k, np.argmin(ok, 1))
    rows = np.arange(b)
    w = np.maximum(p[rows, j] - np.where((j < k)[:, None], q[rows, np.minimum(j, k - 1)], 0.0), 0.0)
    w = np.where(w.sum(1, keepdims=True) > 0, w, p[rows, j])
    cdf = np.cumsum(w, 1)
    out = np.concatenate([drafts, np.zeros((b, 1), drafts.dtype)], 1)
    out[rows, j] = np.minimum((cdf <= (u_last * cdf[:, -1])[:, None]).sum(1), p.shape[-1] - 1)
    return out, j + 1


def _beta_le(drafts, q, p, rng):
    """``u`` drawn by Generator.beta(1, 1) (a uniform the interception does not force); the residual's
    by Generator.random (forced)."""
    return _le_rule(drafts, q, p, rng.beta(1.0, 1.0, drafts.shape), rng.random(len(drafts)))


def test_numpy_draws_the_interception_cannot_force_read_partly_reached():
    """A numpy Generator method specsample does not wrap (beta) advances the generator past what the
    intercepted draws account for: never a plain pass, and the detail says what to draw with."""
    from specsample.host.boundary import host_intercept_check

    r = host_intercept_check(host.HostSampler(_beta_le, name="beta-le"), k=3, seed=0)
    assert r.violations == 0 and r.reached == 0, r.detail  # its `<=` is never forced: not a pass
    assert r.detail.startswith("partly reached") and "numpy Generator passed in advanced" in r.detail, r.detail
    ok = host_intercept_check(host.HostSampler(standard_np, name="standard"), k=3, seed=0)
    assert ok.violations == 0 and ok.reached > 0 and "partly" not in ok.detail, ok.detail


def _self_drafting_race(context, draft, target, rng, *, k, guard):
    """A self-drafting sampler (standard rule) whose bonus is an exponential race argmax(p / E),
    with or without the guard for E = 0 at a token of p = 0 (0 / 0 = NaN, and argmax picks it)."""
    b = context.shape[0]
    toks, q_rows = context, []
    for _ in range(k):
        row = draft(toks)[:, -1]
        q_rows.append(row)
        cdf = np.cumsum(row, 1)
        x = np.minimum((cdf <= (rng.random(b) * cdf[:, -1])[:, None]).sum(1), row.shape[1] - 1)
        toks = np.concatenate([toks, x[:, None]], 1)
    drafts = toks[:, context.shape[1]:]
    q, p = np.stack(q_rows, 1), target(toks)[:, -(k + 1):]
    rows = np.arange(b)
    px, qx = p[rows[:, None], np.arange(k), drafts], q[rows[:, None], np.arange(k), drafts]
    ok = rng.random((b, k)) * qx < px
    j = np.where(ok.all(1), k, np.argmin(ok, 1))
    w = np.maximum(p[rows, j] - np.where((j < k)[:, None], q[rows, np.minimum(j, k - 1)], 0.0), 0.0)
    w = np.where(w.sum(1, keepdims=True) > 0, w, p[rows, j])
    cdf = np.cumsum(w, 1)
    rejected = np.minimum((cdf <= (rng.random(b) * cdf[:, -1])[:, None]).sum(1), p.shape[-1] - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = p[:, k] / rng.exponential(size=p[:, k].shape)
    if guard:
        score = np.where(p[:, k] > 0, score, -np.inf)
    out = np.concatenate([drafts, np.zeros((b, 1), np.int64)], 1)
    out[rows, j] = np.where(j < k, rejected, np.argmax(score, 1))
    return out, j + 1, drafts


@pytest.mark.parametrize("guard", [True, False], ids=["guarded", "unguarded"])
def test_a_self_drafting_samplers_bonus_is_forced_in_a_round_that_emits_it(guard):
    """Self-drafting samplers get the bonus round too: drafting from q = p, every draft is accepted and
    the bonus is drawn from p, which forbids the hazard; an unguarded exponential race then emits it."""
    from specsample.host.boundary import host_intercept_check

    def fn(context, draft, target, rng, k):
        return _self_drafting_race(context, draft, target, rng, k=k, guard=guard)

    r = host_intercept_check(host.HostSampler(fn, name="race", drafts="self"), k=3, seed=0)
    if guard:
        assert r.violations == 0 and r.reached > 0, r.detail
    else:
        assert r.violations > 0 and "a round of safe drafts (its bonus)" in r.detail, r.detail


def _wasted_draws(drafts, q, p, rng):
    """Uniforms from Python's random (seeded from the generator passed in, which the interception does
    not force), after drawing numpy uniforms it never uses."""
    import random

    py = random.Random(int(rng.integers(2**32)))
    rng.random(drafts.shape)  # drawn, intercepted, forced, and thrown away
    u = np.array([[py.random() for _ in range(drafts.shape[1])] for _ in range(len(drafts))])
    return _le_rule(drafts, q, p, u, py.random())


def test_a_forced_value_that_feeds_nothing_is_not_reached():
    """'Reached' means 'could have changed the output': values the sampler draws and throws away met
    their draw, but moved nothing in the probe round (the forbidden token at 1e-6), so the pass is
    not reached, not a pass. The standard sampler's settings could fire, and are counted per site."""
    from specsample.host.boundary import host_intercept_check

    r = host_intercept_check(host.HostSampler(_wasted_draws, name="wasted"), k=3, seed=0)
    assert r.violations == 0 and r.reached == 0 and r.detail.startswith("not reached"), r.detail
    assert re.search(r"Generator.random float64 \[1x3\] at test_edges.py:\d+ 0 of 24", r.detail), r.detail
    ok = host_intercept_check(host.HostSampler(standard_np, name="standard"), k=3, seed=0)
    assert ok.violations == 0 and ok.reached > 0, ok.detail
    m = re.search(r"Generator.random float64 \[1x3\] at test_host.py:\d+ \(decides acceptance\) (\d+) of (\d+)",
                  ok.detail)
    assert m and 0 < int(m.group(1)) < int(m.group(2)), ok.detail  # safe slots' uniforms cannot fire
    # the standard sampler's two draw sites, apart: the acceptance uniforms and the last token's
    assert re.search(r"Generator.random float64 \[1\] at test_host.py:\d+ \(decides last token\)", ok.detail)


def test_a_loops_forced_values_that_change_nothing_are_not_reached():
    """End to end, a setting is reached when, at one of its extremes, it changed the sequence: a loop
    that draws numpy uniforms and throws them away (its tokens from Python's random) reaches nothing."""
    import random

    p = np.random.default_rng(3).dirichlet(np.ones(5), size=5)
    p[:, 4] = 0.0  # a forbidden token, so that the pass could find something
    p /= p.sum(1, keepdims=True)
    model = e2e._TeacherForced(lambda t: p[np.asarray(t)], "probs", np.array([1]), None)

    def loop(prompt, n, seed):
        rng = np.random.default_rng(seed)
        rng.random(4)  # intercepted, forced, unused
        py, out, last = random.Random(seed), [], int(prompt[-1])
        for _ in range(n):
            last = py.choices(range(5), weights=p[last])[0]
            out.append(last)
        return np.array(out)

    r = generate_boundary_check(model, loop, [1], 3, seed=0)
    assert r.violations == 0 and r.reached == 0, r.detail
    assert r.detail.startswith("not reached: none of the"), r.detail
    assert re.search(r"Generator.random float64 \[4\] at test_edges.py:\d+ 0 of", r.detail), r.detail


def test_a_loops_bonus_round_forces_its_bonus_draws():
    """A loop whose bonus is an unguarded exponential race, with a draft far from its target, seldom
    emits a bonus: the boundary pass misses it at the default seed. Given the same loop with the target
    as its own draft (every round emits its bonus), the pass fails it; the guarded twin passes."""
    from specsample.schemes import _load_object

    load = lambda n: _load_object(f"{specsample.__path__[0]}/../examples/numpy_loop.py:{n}")  # noqa: E731
    model = e2e._TeacherForced(load("next_token"), "probs", np.array([1]), None)
    assert generate_boundary_check(model, load("race_bonus"), [1], 12, seed=0, batched=True).violations == 0
    kw = dict(length=12, sequences=2000, batch=500, batch_pass=False)
    bad = e2e.verify_generate(load("next_token"), load("race_bonus"), [1],
                              bonus_generate=load("race_bonus_target_draft"), **kw)
    test = bad.cases[0].test("boundary-bonus")
    assert not bad.passed and test.rejected and "which the target gives probability 0" in test.detail, bad.table()
    assert not bad.cases[0].test("boundary-intercepted").rejected  # the loop's own sequences missed it
    ok = e2e.verify_generate(load("next_token"), load("race_bonus"), [1],
                             bonus_generate=load("race_guarded_target_draft"), **kw)
    assert not ok.cases[0].test("boundary-bonus").rejected and ok.cases[0].test("boundary-bonus").reached
