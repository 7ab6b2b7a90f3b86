"""Draws the interception cannot see (inside TorchScript) are detected, never passed in silence.

The interception pass wraps torch's Python entry points; a ``@torch.jit.script`` function calls the
kernels directly. The pass runs a scripted function it finds in the sampler's module as the Python it
was compiled from (:mod:`specsample.host.eager`), so its draws are seen and its ``<=`` is caught. One it
cannot find (held inside a container) stays compiled: after the recording call, the intercepted draws
are replayed from the generators' states before it, a generator that then ends elsewhere advanced
unseen, and the pass reads "partly reached" with what to do. With TorchScript off (``PYTORCH_JIT=0``)
that sampler's draws are reached too, and its ``<=`` is caught.
"""

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

SAMPLER = textwrap.dedent('''
    import torch

    @torch.jit.script
    def accept(px: torch.Tensor, qx: torch.Tensor) -> torch.Tensor:
        u = torch.rand_like(px)  # drawn inside TorchScript: from the global generator, unseen
        return u * qx <= px

    def accept_python(px, qx):
        return torch.rand_like(px) * qx < px

    def _rule(drafts, q, p, ok_of):
        b, k = drafts.shape
        qx = q.gather(-1, drafts[..., None])[..., 0]
        px = p[:, :k].gather(-1, drafts[..., None])[..., 0]
        ok = ok_of(px, qx)
        j = torch.where(ok.all(1), torch.full((b,), k), torch.argmin(ok.int(), 1))
        rows = torch.arange(b)
        jq = j.clamp(max=k - 1)
        w = torch.clamp(p[rows, j] - torch.where((j < k)[:, None], q[rows, jq], torch.zeros_like(p[:, 0])), min=0)
        w = torch.where(w.sum(-1, keepdim=True) > 0, w, p[rows, j])
        out = torch.cat([drafts, torch.zeros(b, 1, dtype=drafts.dtype)], 1)
        out[rows, j] = torch.multinomial(w, 1)[:, 0]
        return out, j + 1

    def scripted_le(drafts, q, p, generator):
        return _rule(drafts, q, p, accept)

    HIDDEN = {"accept": accept}  # a scripted function the eager pass does not look for

    def hidden_le(drafts, q, p, generator):
        return _rule(drafts, q, p, HIDDEN["accept"])

    def python_lt(drafts, q, p, generator):
        return _rule(drafts, q, p, accept_python)
''')

CHECK = textwrap.dedent('''
    import sys
    from specsample.host import HostSampler
    from specsample.host.boundary import host_intercept_check
    from specsample.schemes import _load_object
    fn = _load_object(sys.argv[1])
    r = host_intercept_check(HostSampler(fn, rng="torch-global", arrays="torch"), k=3)
    print(r.violations, r.reached)
    print(r.detail)
''')


def _check(tmp_path, name, env=None):
    (tmp_path / "twins.py").write_text(SAMPLER)
    out = subprocess.run([sys.executable, "-c", CHECK, f"{tmp_path / 'twins.py'}:{name}"], capture_output=True,
                         text=True, timeout=300, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-2000:]
    counts, detail = out.stdout.split("\n", 1)
    violations, reached = map(int, counts.split())
    return violations, reached, detail


@pytest.mark.long  # a process of its own (4.5 s); tests/test_compiled_draws.py shows the same in this one
def test_a_scripted_function_in_the_samplers_module_runs_as_python_and_is_caught(tmp_path):
    violations, reached, detail = _check(tmp_path, "scripted_le")
    assert violations > 0 and "compiled code run as Python for this pass: TorchScript accept" in detail, detail


def test_draws_inside_torchscript_it_cannot_find_read_partly_reached(tmp_path):
    violations, reached, detail = _check(tmp_path, "hidden_le")
    assert violations == 0 and reached == 0, detail  # its `<=` was not forced: not a pass
    assert "partly reached" in detail and "PYTORCH_JIT=0" in detail


def test_draws_in_python_are_reached(tmp_path):
    violations, reached, detail = _check(tmp_path, "python_lt")
    assert violations == 0 and reached > 0 and "partly" not in detail, detail


def test_with_torchscript_off_the_same_sampler_is_caught(tmp_path):
    violations, _, detail = _check(tmp_path, "hidden_le", env={"PYTORCH_JIT": "0"})
    assert violations > 0 and "probability 0" in detail, detail
