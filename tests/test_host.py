"""Host samplers (numpy, torch, Hugging Face): the battery on a Python callable, both sides.

A correct sampler passes, a broken one is rejected; counts are exact (no rounding up), only
rounds that still need tokens reach the sampler, and the boundary pass puts the sampler's own
generator at 0 and 1 - 2^-24. torch and transformers are optional: their tests skip without them.
"""

import json

import numpy as np
import pytest

import stats
from specsample import cli, host
from specsample.models.tables import exact_marginals
from specsample.models.pairs import make_pair

CASES = "dirichlet/V8/k4,zeros-in-p/V8/k4,ngram-2/V4/k4"


def standard_np(drafts, q, p, rng, *, from_p=False):
    """The standard rule, vectorised in numpy (from_p: the residual bug)."""
    b, k = drafts.shape
    rows = np.arange(b)
    px = np.take_along_axis(p[:, :k], drafts[..., None], 2)[..., 0]
    qx = np.take_along_axis(q, drafts[..., None], 2)[..., 0]
    ok = rng.random((b, k)) * qx < px
    j = np.where(ok.all(1), k, np.argmin(ok, 1))
    q_j = np.where((j < k)[:, None], q[rows, np.minimum(j, k - 1)], 0.0)
    w = p[rows, j] if from_p else np.maximum(p[rows, j] - q_j, 0.0)
    w = np.where(w.sum(1, keepdims=True) > 0, w, p[rows, j]).astype(np.float64)
    cdf = np.cumsum(w, 1)
    last = np.minimum((cdf <= (rng.random(b) * cdf[:, -1])[:, None]).sum(1), p.shape[-1] - 1)
    out = np.concatenate([drafts, np.zeros((b, 1), np.int64)], 1)
    out[rows, j] = last
    return out, j + 1


def residual_from_p_np(drafts, q, p, rng):
    return standard_np(drafts, q, p, rng, from_p=True)


def one_round(drafts, q, p, rng):
    tokens, n = standard_np(drafts[None], q[None], p[None], rng)
    return tokens[0], int(n[0])


def from_logits(drafts, q_logits, p_logits, rng):
    return standard_np(drafts, np.exp(q_logits), np.exp(p_logits), rng)


@pytest.mark.parametrize("fn, options", [(standard_np, {}), (one_round, dict(batched=False)),
                                         (from_logits, dict(inputs="logits"))], ids=["batched", "unbatched", "logits"])
def test_a_correct_numpy_sampler_passes(fn, options):
    report = host.verify_host(fn, budget=4000, k=4, cases=CASES, **options)
    assert report.passed, report.table()
    assert report.engine["host"]["wasted_fraction"] == 0.0


def test_a_sampler_that_resamples_from_p_is_rejected():
    report = host.verify_host(residual_from_p_np, budget=4000, k=4, cases=CASES)
    assert not report.passed


def test_assert_lossless_takes_a_host_sampler():
    from specsample.testing import assert_lossless

    assert assert_lossless(sampler=standard_np, budget=2000, k=4, cases="dirichlet/V8/k4").passed
    with pytest.raises(AssertionError, match="dirichlet/V8/k4"):
        assert_lossless(sampler=residual_from_p_np, budget=2000, k=4, cases="dirichlet/V8/k4")
    with pytest.raises(TypeError, match="not both"):
        assert_lossless("standard", sampler=standard_np)


def self_drafting_np(context, draft, target, rng, *, stale_rows=False):
    """Drafts k = 4 tokens from the draft model, then the standard rule with the target model's rows."""
    b, k = context.shape[0], 4
    toks, q_rows = context, []
    for i in range(k):
        row = draft(toks)[:, -1]
        q_rows.append(row)
        if stale_rows:  # the bug: draw from the first draft row while the ratio test is told the right one
            row = q_rows[0]
        cdf = np.cumsum(row, 1)
        x = np.minimum((cdf <= (rng.random(b) * cdf[:, -1])[:, None]).sum(1), row.shape[1] - 1)
        toks = np.concatenate([toks, x[:, None]], 1)
    drafts = toks[:, context.shape[1]:]
    q = np.stack(q_rows, 1)
    p = target(toks)  # the k + 1 verification rows in one teacher-forced call
    tokens, n = standard_np(drafts, q, p, rng)
    return tokens, n, drafts


def test_a_self_drafting_sampler():
    ok = host.verify_host(self_drafting_np, drafts="self", budget=4000, k=4, cases=CASES)
    assert ok.passed, ok.table()
    # drafting from a row other than the one the ratio test uses breaks losslessness (n-gram drafts)
    stale = lambda c, d, t, rng: self_drafting_np(c, d, t, rng, stale_rows=True)  # noqa: E731
    bad = host.verify_host(stale, drafts="self", budget=4000, k=4, cases="ngram-2/V4/k4")
    assert not bad.passed


def test_sequence_counts_are_exact_and_only_live_rounds_are_passed():
    seen = []

    def recording(drafts, q, p, rng):
        seen.append(len(drafts))
        return standard_np(drafts, q, p, rng)

    pair = make_pair("dirichlet", 1, 8)
    run = host.HostRun()
    c = host.run_host(host.HostSampler(recording), pair.target, pair.draft, k=3, sequences=1234, length=5,
                      batch=256, stats=run)
    assert int(c.sequences[0]) == 1234 and c.position[0].sum(axis=1).tolist() == [1234] * 5
    assert sum(seen) == run.rounds == int(c.rounds[0])  # every round passed was counted: none wasted
    assert seen[0] == 256 and seen[-1] < 256  # the batch shrinks as sequences finish
    m = exact_marginals(pair.target, 5)
    assert all(stats.goodness_of_fit(c.position[0, t], m[t]).pvalue > 1e-4 for t in range(5))


def test_same_seed_same_counts():
    pair = make_pair("rare-accept", 2, 8)
    a, b = (host.run_host(host.HostSampler(standard_np), pair.target, pair.draft, k=4, sequences=3000, length=6,
                          seed=9) for _ in range(2))
    np.testing.assert_array_equal(a.position, b.position)


def test_time_and_tv_budgets():
    tv = host.verify_host(standard_np, tv=0.05, k=4, cases="dirichlet/V8/k4")
    # planned: 6 positions, the joint, accepted drafts, per-token acceptance; stages acceptance, rejection, bonus
    level = 0.01 / 12
    assert tv.cases[0].sequences == stats.samples_for_tv(0.05, 7, level, 0.99).n
    timed = host.verify_host(standard_np, time_budget="2s", k=(1, 4), cases="dirichlet/V8/k4,dirichlet/V8/k1")
    assert timed.engine["host"]["time_budget_s"] == 2.0 and all(c.sequences >= 1000 for c in timed.cases)
    with pytest.raises(ValueError, match="10m"):
        host.verify_host(standard_np, time_budget="ten minutes", k=4, cases="dirichlet/V8/k4")


@pytest.mark.parametrize("fn, match", [
    (lambda d, q, p, rng: (d, np.ones(len(d), int)), r"shape \(\d+, 4\).*expected \(\d+, 5\)"),
    (lambda d, q, p, rng: 1 / 0, r"raised: ZeroDivisionError: division by zero \(at .*test_host.py"),
    (lambda d, q, p, rng: (np.zeros((len(d), 5)), np.ones(len(d))), "floats"),
])
def test_a_broken_sampler_gets_one_line(fn, match):
    with pytest.raises(host.HostSamplerError, match=match):
        host.verify_host(fn, budget=1000, k=4, cases="dirichlet/V8/k4")


def test_an_adapter_factory_loads_by_name():
    pytest.importorskip("torch")
    s = host.load_sampler("specsample.adapters:torch_batched")
    assert s.name == "torch-batched" and s.rng == "torch" and s.arrays == "torch"
    assert host.load_sampler("specsample.adapters:torch_batched", rule="none").rule is None


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="inputs must be probs, logits, or DRAFT,TARGET"):
        host.HostSampler(standard_np, inputs="scores")
    with pytest.raises(TypeError, match="not a callable"):
        host.load_sampler(3)


def test_cli_verifies_a_sampler_file(tmp_path, capsys):
    path = tmp_path / "mine.py"
    path.write_text("import numpy as np\n" + "\n".join(
        __import__("inspect").getsource(f) for f in (standard_np, residual_from_p_np)))
    out = tmp_path / "r.json"
    args = ["verify", "--sampler", f"{path}:standard_np", "--budget", "3000", "--k", "4", "--cases",
            "dirichlet/V8/k4", "--json", str(out), "--no-progress"]
    assert cli.main(args) == 0
    doc = json.loads(out.read_text())
    assert doc["engine"]["host"]["sampler"] == "standard_np" and doc["verdict"] == "pass"
    args[2] = f"{path}:residual_from_p_np"
    assert cli.main(args) == 1
    capsys.readouterr()
    assert cli.main(["verify", "--inputs", "logits"]) == 2
    assert "--sampler" in capsys.readouterr().err
    assert cli.main(["verify", "--scheme", "standard", "--sampler", f"{path}:standard_np"]) == 2
    assert "not both" in capsys.readouterr().err


# --- torch and Hugging Face ---------------------------------------------------------------------


def test_torch_batched_passes_and_its_residual_bug_fails():
    pytest.importorskip("torch")
    from specsample.host import adapters

    good = host.verify_host(adapters.torch_batched(), budget=4000, k=4, cases=CASES + ",boundary/V8/k4")
    assert good.passed, good.table()
    bad = host.verify_host(adapters.residual_from_p(), budget=4000, k=4, cases=CASES)
    assert not bad.passed


@pytest.mark.long  # three torch batteries, 8 s (test_torch_batched_passes_and_its_residual_bug_fails runs by default)
def test_the_readme_torch_example_file():
    pytest.importorskip("torch")
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "torch_sampler.py"
    kw = dict(rng="torch", arrays="torch", budget=3000, k=4, cases="dirichlet/V8/k4,zeros-in-p/V8/k4,boundary/V8/k4")
    assert host.verify_host(f"{path}:standard", **kw).passed
    assert not host.verify_host(f"{path}:resample_from_p", **kw).passed


def test_rejection_sample_with_ragged_draft_counts():
    """Requests with 0..3 drafts in one flat batch: each request's accepted count follows its own
    truncated geometric law, and its first token follows p."""
    torch = pytest.importorskip("torch")
    from specsample.host import adapters

    pair = make_pair("dirichlet", 4, 6)
    p, q = (np.asarray(m.table[0], np.float64) for m in (pair.target, pair.draft))
    counts = [0, 1, 2, 3] * 5000
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    drafts = torch.as_tensor(rng.choice(6, size=sum(counts), p=q))
    out = adapters.rejection_sample(drafts, counts, torch.as_tensor(np.tile(q, (sum(counts), 1))),
                                    torch.as_tensor(np.tile(p, (sum(counts) + len(counts), 1))), g).numpy()
    alpha = stats.acceptance_probability(p, q)
    n_em = (out != adapters.PAD).sum(1)
    for kk in range(4):
        rows = np.arange(len(counts))[np.array(counts) == kk]
        if kk == 0:  # no draft: one token from p
            assert np.all(n_em[rows] == 1)
        else:
            law = stats.accepted_drafts_law(alpha, kk)
            assert stats.goodness_of_fit(np.bincount(n_em[rows] - 1, minlength=kk + 1), law).pvalue > 1e-4
        assert stats.goodness_of_fit(np.bincount(out[rows, 0], minlength=6), p).pvalue > 1e-4


def test_boundary_pass_sets_the_generator_to_the_extreme_uniforms():
    torch = pytest.importorskip("torch")
    seen = []

    def spy(drafts, q, p, generator):
        seen.append(torch.rand(drafts.shape[1], generator=generator).numpy().copy())
        return drafts.new_zeros(1, drafts.shape[1] + 1) + 0, drafts.new_ones(1)

    pair = make_pair("zeros-in-p", 3, 8)
    s = host.HostSampler(spy, rng="torch", arrays="torch", rule=None)
    r = host.host_boundary_check(s, pair.target, pair.draft, k=3)
    assert r.rounds == 6
    for call, (i, value) in zip(seen, [(i, v) for i in range(3) for v in host.EXTREME_VALUES]):
        assert call[i] == np.float32(value)


@pytest.mark.long  # Hugging Face's own sampler, a Python loop per round: about 40 s (its boundary pass
# alone runs by default: tests/test_edges.py::test_hugging_face_at_u_zero_by_interception)
def test_hugging_face_speculative_sampling_passes_the_battery_and_fails_the_boundary_pass():
    pytest.importorskip("transformers")
    from specsample.host import adapters
    from test_edges import hf_accepts_at_u_zero

    report = host.verify_host(adapters.hf_speculative_sampling(), budget=3000, k=4,
                              cases="warp-top-k/V8/k4,boundary/V8/k4")
    statistical, boundary = report.case("warp-top-k/V8/k4"), report.case("boundary/V8/k4")
    assert statistical.passed, report.table()
    tests = {t.name: t for t in boundary.tests}
    assert not boundary.passed and "vanishing-residual" in tests["edge-rows"].detail  # raises there, every version
    u_zero = "uniform 0 = 0: emitted token" in tests["boundary-uniforms"].detail
    assert u_zero == hf_accepts_at_u_zero() and tests["boundary-uniforms"].reached, tests["boundary-uniforms"].detail
