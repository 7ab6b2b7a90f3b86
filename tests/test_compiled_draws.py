"""Draws inside compiled code are seen and forced: TorchScript, torch.compile; and every forced value is named.

Proof both ways: a `u * q <= p` acceptance drawn inside a TorchScript function or a torch.compile'd one is
caught at the default seed, its strict twin passes; a sampler whose draws never take the value a
generator state sets reads "not reached", never a pass of that check.
"""

import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

from specsample.host import verify_host  # noqa: E402

SAMPLERS = textwrap.dedent('''
    import torch


    @torch.jit.script
    def _accept_le(px: torch.Tensor, qx: torch.Tensor) -> torch.Tensor:
        u = torch.rand(px.shape, dtype=px.dtype)
        return u * qx <= px


    @torch.jit.script
    def _accept_lt(px: torch.Tensor, qx: torch.Tensor) -> torch.Tensor:
        u = torch.rand(px.shape, dtype=px.dtype)
        return u * qx < px


    _compiled_le = torch.compile(lambda px, qx: torch.rand(px.shape, dtype=px.dtype) * qx <= px, backend="eager")
    _compiled_lt = torch.compile(lambda px, qx: torch.rand(px.shape, dtype=px.dtype) * qx < px, backend="eager")


    def _round(drafts, q, p, accept):
        b, k = drafts.shape
        rows = torch.arange(b)
        px = torch.gather(p[:, :k], 2, drafts[..., None])[..., 0]
        qx = torch.gather(q, 2, drafts[..., None])[..., 0]
        ok = accept(px, qx)
        j = torch.where(ok.all(1), k, torch.argmin(ok.to(torch.int8), 1))
        q_j = torch.where((j < k)[:, None], q[rows, j.clamp(max=k - 1)], 0.0)
        w = torch.clamp(p[rows, j] - q_j, min=0)
        w = torch.where(w.sum(1, keepdim=True) > 0, w, p[rows, j])
        out = torch.cat([drafts, torch.zeros((b, 1), dtype=drafts.dtype)], 1)
        out[rows, j] = torch.multinomial(w, 1)[:, 0]
        return out, j + 1


    def script_le(drafts, q, p, generator):
        return _round(drafts, q, p, _accept_le)


    def script_lt(drafts, q, p, generator):
        return _round(drafts, q, p, _accept_lt)


    def compiled_le(drafts, q, p, generator):
        return _round(drafts, q, p, _compiled_le)


    def compiled_lt(drafts, q, p, generator):
        return _round(drafts, q, p, _compiled_lt)


    _own = torch.Generator().manual_seed(1234)


    def own_generator(drafts, q, p, generator):
        # draws from a generator of its own, which no state specsample sets reaches
        b, k = drafts.shape
        u = torch.rand((b, k), generator=_own)
        return _round(drafts, q, p, lambda px, qx: u * qx < px)
''')


@pytest.fixture(scope="module")
def samplers(tmp_path_factory):
    path = tmp_path_factory.mktemp("compiled") / "compiled_samplers.py"
    path.write_text(SAMPLERS)
    return path


def _boundary(samplers, fn):
    r = verify_host(f"{samplers}:{fn}", budget="quick", cases="boundary/V8/k4", k=(4,), rng="torch-global",
                    arrays="torch")
    return r, {t.name: t for t in r.case("boundary/V8/k4").tests}


@pytest.mark.parametrize("bad, good, what", [
    ("script_le", "script_lt", "TorchScript _accept_"),
    pytest.param("compiled_le", "compiled_lt", "torch.compile _compiled_", marks=pytest.mark.long)])  # dynamo: 3-5 s
def test_a_le_drawn_inside_compiled_code_is_caught_and_its_twin_passes(samplers, bad, good, what):
    report, tests = _boundary(samplers, bad)
    assert not report.passed
    t = tests["boundary-intercepted"]
    assert t.rejected and "compiled code run as Python for this pass" in t.detail and what in t.detail
    # the first violation names the value forced, and the draw site it broke
    assert "with torch.rand draw 0 element 0 = 0 forced" in t.detail
    assert "broken by draw site: torch.rand float32" in t.detail
    assert "torch.rand draw 0 element 0 = 0 forced" in report.headline(width=10_000) or \
        "uniform 0 = 0" in report.headline(width=10_000)
    report, tests = _boundary(samplers, good)
    assert report.passed and all(t.reached for t in tests.values()), report.table()


def test_values_a_generator_state_never_reaches_read_not_reached(samplers):
    # the generator-state pass set the global generator; the sampler drew from its own: that check reached
    # nothing (the interception pass, which forces the draws where they are made, still covers the sampler)
    report, tests = _boundary(samplers, "own_generator")
    t = tests["boundary-uniforms"]
    assert not t.reached and "not reached" in t.detail and "did the sampler's acceptance uniform take" in t.detail
    assert "uniform 0 = 0 set, but the sampler's uniform at slot 0 was" in t.detail
    assert tests["boundary-intercepted"].reached and report.passed
