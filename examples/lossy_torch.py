"""The lossy acceptance rules engines ship, as torch host samplers (specsample's host-sampler convention).

    specsample verify --sampler examples/lossy_torch.py:relaxed --rng torch --arrays torch --rule none --budget quick
    specsample measure --sampler examples/lossy_torch.py:typical --rng torch --arrays torch --rule none --budget quick

``typical``: typical acceptance as vLLM's TypicalAcceptanceSampler does it (Medusa, Cai et al. 2024): a
draft is accepted when p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p))), and the first
rejected position takes p's argmax. ``relaxed``: SGLang's relaxed acceptance on a chain, accept when
u < p(x) / threshold_acc or p(x) >= threshold_single, a rejection sampled from p without x; at both
thresholds 1 (``relaxed``) it is exact, below (``relaxed_half``) lossy. Neither follows the standard
rule's acceptance law, so they are verified with ``--rule none`` (the output law only).

Each takes drafts [B, k], the draft rows [B, k, V], the target rows [B, k + 1, V] and a torch.Generator,
and returns (tokens [B, k + 1], n_emitted [B]).
"""

import torch


def _finish(drafts, p, ok, rejected_rows, generator):
    b, k = drafts.shape
    rows = torch.arange(b)
    j = torch.where(ok.all(1), k, torch.argmin(ok.to(torch.int8), 1))
    w = torch.where((j < k)[:, None], rejected_rows[rows, j.clamp(max=k - 1)], p[rows, j])
    w = torch.where(w.sum(1, keepdim=True) > 0, w, p[rows, j])
    out = torch.cat([drafts, torch.zeros((b, 1), dtype=drafts.dtype)], 1)
    out[rows, j] = torch.multinomial(w, 1, generator=generator)[:, 0]
    return out, j + 1


def _typical(drafts, q, p, generator, posterior_threshold=0.09, posterior_alpha=0.3):
    k = drafts.shape[1]
    pk = p[:, :k]
    px = torch.gather(pk, 2, drafts[..., None])[..., 0]
    entropy = -torch.where(pk > 0, pk * torch.log(torch.where(pk > 0, pk, 1.0)), 0.0).sum(-1)
    ok = px > torch.clamp(posterior_alpha * torch.exp(-entropy), max=posterior_threshold)
    argmax = torch.nn.functional.one_hot(pk.argmax(-1), p.shape[-1]).to(p.dtype)  # vLLM's recovered token
    return _finish(drafts, p, ok, argmax, generator)


def _relaxed(drafts, q, p, generator, threshold_single=1.0, threshold_acc=1.0):
    b, k = drafts.shape
    px = torch.gather(p[:, :k], 2, drafts[..., None])[..., 0]
    u = torch.rand((b, k), generator=generator, dtype=p.dtype)
    ok = (u * threshold_acc < px) | (px >= threshold_single)  # strict: u = 0 never accepts p(x) = 0
    without = p[:, :k].scatter(2, drafts[..., None], 0.0)  # a rejection samples p without the draft
    return _finish(drafts, p, ok, without, generator)


def typical(drafts, q, p, generator):
    return _typical(drafts, q, p, generator)


def relaxed(drafts, q, p, generator):
    return _relaxed(drafts, q, p, generator)


def relaxed_half(drafts, q, p, generator):
    return _relaxed(drafts, q, p, generator, threshold_single=0.5, threshold_acc=0.5)
