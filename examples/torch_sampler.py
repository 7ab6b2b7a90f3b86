"""Three torch speculative samplers in specsample's host-sampler convention, one right and two wrong.

    specsample verify --sampler examples/torch_sampler.py:standard --rng torch --arrays torch --budget quick
    specsample verify --sampler examples/torch_sampler.py:resample_from_p --rng torch --arrays torch --budget quick
    specsample verify --sampler examples/torch_sampler.py:shared_uniform --rng torch --arrays torch --budget quick

``shared_uniform`` draws its acceptance uniforms per position, one row for the whole batch: each
request alone follows p, but requests batched together share their fate (the batch pass names it).

Each takes drafts [B, k], the draft rows [B, k, V] that drafted them, the target rows [B, k + 1, V]
and a torch.Generator, and returns (tokens [B, k + 1], n_emitted [B]).
"""

import torch


def _round(drafts, q, p, generator, *, from_p: bool, shared: bool = False):
    b, k = drafts.shape
    rows = torch.arange(b)
    px = torch.gather(p[:, :k], 2, drafts[..., None])[..., 0]
    qx = torch.gather(q, 2, drafts[..., None])[..., 0]
    u = torch.rand((1, k), generator=generator).expand(b, k) if shared else torch.rand((b, k), generator=generator)
    ok = u * qx < px  # strict: u = 0 never accepts p(x) = 0
    j = torch.where(ok.all(1), k, torch.argmin(ok.to(torch.int8), 1))
    q_j = torch.where((j < k)[:, None], q[rows, j.clamp(max=k - 1)], 0.0)
    w = p[rows, j] if from_p else torch.clamp(p[rows, j] - q_j, min=0)  # the bug: p instead of the residual
    w = torch.where(w.sum(1, keepdim=True) > 0, w, p[rows, j])
    out = torch.cat([drafts, torch.zeros((b, 1), dtype=drafts.dtype)], 1)
    out[rows, j] = torch.multinomial(w, 1, generator=generator)[:, 0]
    return out, j + 1


def standard(drafts, q, p, generator):
    return _round(drafts, q, p, generator, from_p=False)


def resample_from_p(drafts, q, p, generator):
    return _round(drafts, q, p, generator, from_p=True)


def shared_uniform(drafts, q, p, generator):
    return _round(drafts, q, p, generator, from_p=False, shared=True)
