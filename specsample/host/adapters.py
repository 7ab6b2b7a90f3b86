"""Host samplers for real libraries' calling conventions (optional dependencies, imported on use).

* :func:`hf_speculative_sampling`: Hugging Face transformers' ``_speculative_sampling`` (what
  assisted generation runs with ``do_sample=True``), in its own convention: logits after the
  logits processors, batch size 1, randomness from torch's global generator.
* :func:`rejection_sample` / :func:`torch_batched`: a vectorized torch implementation of the
  standard rule written here, in the convention batched serving engines use: every request's
  drafts flattened into one vector with per-request draft counts, and outputs padded with -1.
* :func:`torch_ragged`: the same in the engines' full convention: ragged draft counts handed to the
  sampler flat, draft probabilities with target logits, and the bonus token given as an input.
* :func:`residual_from_p`: the same implementation with one deliberate bug (a rejection resamples
  from p instead of the residual), which the battery must reject.
"""

from __future__ import annotations

import numpy as np

from . import HostSampler

PAD = -1  # output slots past a request's emitted tokens


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError("this adapter needs torch (pip install torch)") from None
    return torch


BUGS = ("resample-from-p", "float64-ge", "exponential-race")  # the broken twins' one-place changes


def rejection_sample(draft_token_ids, num_draft_tokens, draft_probs, target_probs, generator=None, *,
                     resample_from_p: bool = False, bonus_token_ids=None, bug=None):
    """The standard rule for a batch of requests with ragged draft counts, in torch, without a Python loop
    over requests.

    Parameters
    ----------
    draft_token_ids : int64[T]
        All requests' drafts, one request after another (T = sum of ``num_draft_tokens``).
    num_draft_tokens : list of int or int64[B]
        Drafts of each request (0 allowed: the request then emits one token from p).
    draft_probs : float[T, V]
        The draft distribution each draft was sampled from.
    target_probs : float[T + B, V]
        Per request, its target rows at each draft position, then its bonus row; float[T, V]
        (no bonus rows) when ``bonus_token_ids`` is given.
    generator : torch.Generator, optional
    bonus_token_ids : int64[B], optional
        Bonus tokens sampled outside (as serving engines do), emitted when all drafts are accepted.

    Returns
    -------
    int64[B, max_k + 1]
        Emitted tokens per request (accepted drafts, then a resampled or bonus token), padded with -1.

    Accepts with ``u * q < p`` (strict: at u = 0 a draft with p = 0 is still rejected), resamples from
    ``norm(max(0, p - q))`` (p itself where that vanishes, when p = q). ``bug`` (tests only) makes
    one of the broken twins: ``"resample-from-p"``; ``"float64-ge"`` (float64 uniforms, accept when
    ``p / q >= u``: at u = 0 a forbidden draft passes); ``"exponential-race"`` (the residual drawn as
    ``argmax(max(0, p - q) / E)``, E exponential, without the fallback: an all-zero residual gives 0).
    """
    if bug is not None and bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; choose from {', '.join(BUGS)}")
    resample_from_p = resample_from_p or bug == "resample-from-p"
    torch = _torch()
    counts = torch.as_tensor(num_draft_tokens, dtype=torch.int64)
    b, kmax = counts.numel(), int(counts.max()) if counts.numel() else 0
    v = target_probs.shape[-1]
    # scatter the flat drafts into a padded [B, kmax] grid
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(kmax)
    valid = slot[None] < counts[:, None]  # [B, kmax]
    flat = (starts[:, None] + slot[None]).clamp(max=max(0, draft_token_ids.numel() - 1))
    drafts = torch.where(valid, draft_token_ids[flat] if draft_token_ids.numel() else flat, 0)
    q = torch.where(valid[..., None], draft_probs[flat] if draft_probs.shape[0] else 0.0, 0.0)
    given = bonus_token_ids is not None
    t_rows = starts if given else starts + torch.arange(b)  # the first target row of each request
    p_all = target_probs[(t_rows[:, None] + torch.arange(kmax + 1)[None]).clamp(min=0, max=max(0, target_probs.shape[0] - 1))]
    p = p_all[:, :kmax]
    px = torch.gather(p, 2, drafts[..., None])[..., 0]
    qx = torch.gather(q, 2, drafts[..., None])[..., 0]
    if bug == "float64-ge":
        u = torch.rand((b, kmax), generator=generator, dtype=torch.float64)
        ok = (px.double() / qx.double().clamp(min=1e-300) >= u) & valid
    else:
        u = torch.rand((b, kmax), generator=generator, dtype=px.dtype)
        ok = (u * qx < px) & valid
    j = torch.where(ok.all(1), counts, torch.argmin(ok.to(torch.int8), 1))  # first failure, or all accepted
    j = torch.minimum(j, counts)
    rows = torch.arange(b)
    p_j = p_all[rows, j]
    q_j = torch.where((j < counts)[:, None], q[rows, j.clamp(max=max(0, kmax - 1))] if kmax else 0.0, 0.0)
    if resample_from_p:  # the deliberate bug of residual_from_p
        weights = p_j
    else:
        res = torch.clamp(p_j - q_j, min=0)
        weights = torch.where(res.sum(1, keepdim=True) > 0, res, p_j)
    if given:  # all accepted: the bonus given; its row (past the request's rows) is never read
        weights = torch.where((j < counts)[:, None], weights, 1.0)
    if bug == "exponential-race":  # an exponential race over the residual, without its fallback
        res = torch.where((j < counts)[:, None], torch.clamp(p_j - q_j, min=0), p_j)
        last = torch.argmax(res / torch.empty_like(res).exponential_(generator=generator), dim=1)
    else:
        last = torch.multinomial(weights, 1, generator=generator)[:, 0]
    if given:
        last = torch.where(j < counts, last, torch.as_tensor(bonus_token_ids, dtype=torch.int64))
    out = torch.full((b, kmax + 1), PAD, dtype=torch.int64)
    keep = slot[None] < j[:, None]
    out[:, :kmax] = torch.where(keep, drafts, PAD)
    out[rows, j] = last
    del v
    return out


def _from_specsample(drafts, draft_rows, target_rows, generator, **kw):
    """specsample's call (every request has k drafts, rows [B, k, V] and [B, k + 1, V]) in the flat convention."""
    torch = _torch()
    b, k = drafts.shape
    out = rejection_sample(drafts.reshape(-1), [k] * b, draft_rows.reshape(b * k, -1),
                           target_rows.reshape(b * (k + 1), -1), generator, **kw)
    return out.clamp(min=0), (out != PAD).sum(1)


def torch_batched() -> HostSampler:
    """:func:`rejection_sample` as a host sampler (torch arrays, a seeded torch Generator)."""
    return HostSampler(_from_specsample, "torch-batched", rng="torch", arrays="torch")


def _ragged(draft_token_ids, num_draft_tokens, draft_probs, target_logits, bonus_token_ids, generator):
    """The flat layout with target logits and the bonus given: what a serving engine's sampler receives."""
    torch = _torch()
    target_probs = torch.softmax(target_logits.to(torch.float32), dim=-1)
    return rejection_sample(draft_token_ids, num_draft_tokens, draft_probs, target_probs, generator,
                            bonus_token_ids=bonus_token_ids)


def torch_ragged() -> HostSampler:
    """:func:`rejection_sample` in the serving engines' full convention: ragged draft counts (0..k per
    request, flattened), draft probabilities with target logits, the bonus token given as an input."""
    return HostSampler(_ragged, "torch-ragged", inputs="probs,logits", rng="torch", arrays="torch", layout="flat",
                       bonus="given")


def _from_p(drafts, draft_rows, target_rows, generator):
    return _from_specsample(drafts, draft_rows, target_rows, generator, resample_from_p=True)


def residual_from_p() -> HostSampler:
    """A broken twin of :func:`torch_batched`: a rejection resamples from p, not the residual."""
    return HostSampler(_from_p, "torch-residual-from-p", rng="torch", arrays="torch")


def _float64_ge(drafts, draft_rows, target_rows, generator):
    return _from_specsample(drafts, draft_rows, target_rows, generator, bug="float64-ge")


def float64_ge() -> HostSampler:
    """A broken twin of :func:`torch_batched`: float64 acceptance uniforms and ``p / q >= u`` (a forbidden
    draft passes at u = 0, once in 2^53 draws: only the interception pass reaches it)."""
    return HostSampler(_float64_ge, "torch-float64-ge", rng="torch", arrays="torch")


def _exponential_race(drafts, draft_rows, target_rows, generator):
    return _from_specsample(drafts, draft_rows, target_rows, generator, bug="exponential-race")


def exponential_race_residual() -> HostSampler:
    """A broken twin of :func:`torch_batched`: the residual drawn by ``argmax(residual / exponential)``
    with no fallback for an all-zero residual (the vanishing-residual edge emits token 0)."""
    return HostSampler(_exponential_race, "torch-exponential-race", rng="torch", arrays="torch")


def _hf_round(drafts, draft_logits, target_logits, generator):
    from transformers.generation.utils import _speculative_sampling

    k = drafts.shape[0]
    valid, _ = _speculative_sampling(drafts[None], draft_logits[None], k, target_logits[None])
    return valid[0], valid.shape[1]


def hf_speculative_sampling() -> HostSampler:
    """Hugging Face transformers' ``_speculative_sampling`` in its own calling convention.

    Logits ``[1, k, V]`` and ``[1, k + 1, V]`` (after logits processors: -inf where a token is
    masked), batch size 1 (specsample loops over rounds), global torch generator (specsample
    seeds it before each call). Needs ``pip install transformers``.
    """
    try:
        import transformers.generation.utils as hf
    except ImportError:
        raise ImportError("this adapter needs Hugging Face transformers (pip install transformers)") from None
    if not hasattr(hf, "_speculative_sampling"):
        raise ImportError(f"transformers {getattr(__import__('transformers'), '__version__', '?')} has no "
                          "generation.utils._speculative_sampling")
    return HostSampler(_hf_round, "hf-speculative-sampling", inputs="logits", batched=False, rng="torch-global",
                       arrays="torch")


def hf_next_token(model, processors=None):
    """A transformers causal LM's teacher-forced logits as ``next_token(tokens [N, T]) -> [N, T, V]``.

    ``processors`` (a ``LogitsProcessorList``, or a list of processors): applied at every position t
    with the history ``tokens[:, : t + 1]``, as ``generate`` applies them one step at a time, so
    processors that read the history (a repetition penalty, say) are part of the target's law.
    """
    torch = _torch()

    def next_token(tokens):
        ids = torch.as_tensor(tokens, dtype=torch.long)
        with torch.no_grad():
            logits = model(ids).logits.double()
            if processors:
                logits = torch.stack([_apply(processors, ids[:, : t + 1], logits[:, t]) for t in range(ids.shape[1])],
                                     dim=1)
        return logits

    return next_token


def _apply(processors, ids, scores):
    for proc in processors:
        scores = proc(ids, scores)
    return scores


def hf_generate(model, assistant=None, **generate_kwargs):
    """``generate(prompt, n, seed)`` sampling n tokens with ``model.generate`` (assisted generation when
    ``assistant`` is given), torch's global generator seeded with ``seed``. ``top_k`` defaults to 0 (no
    top-k cut: the teacher-forced rows are the raw softmax); pass the same processors to both sides."""
    torch = _torch()
    kwargs = dict(do_sample=True, top_k=0, pad_token_id=0, **generate_kwargs)
    if assistant is not None:
        kwargs["assistant_model"] = assistant

    def generate(prompt, n, seed):
        torch.manual_seed(seed)
        ids = torch.as_tensor(np.asarray(prompt), dtype=torch.long)[None]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs)
        return out[0, ids.shape[1]:]

    return generate


ADAPTERS = {"torch-batched": torch_batched, "torch-ragged": torch_ragged, "hf": hf_speculative_sampling,
            "torch-residual-from-p": residual_from_p, "torch-float64-ge": float64_ge,
            "torch-exponential-race": exponential_race_residual}
