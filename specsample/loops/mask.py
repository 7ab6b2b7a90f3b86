"""A target that forbids tokens, so that a loop's boundary pass can reach a ``<=`` acceptance.

A forced uniform of 0 exposes ``u <= p / q`` only where the target gives a drafted token
probability 0. A trained target rarely does (softmax is positive everywhere), and then the loop's
boundary pass reports "not reached" however wrong the comparison. Masking the target to its top-k
tokens (or removing given tokens) makes zeros the draft still drafts; the masked model is as valid
a target as any, and a correct loop stays exact under it.

Mask the model the loop samples from *and* the ``next_token`` specsample scores with, the same way:

* :func:`mask_logits` wraps a plain callable returning logits or probabilities (numpy or torch);
* :func:`mask_module` hooks a ``torch.nn.Module`` in place, a Hugging Face model included (its
  ``generate`` then runs on masked logits); the returned handle's ``remove()`` (or a ``with``
  block) undoes it.

Examples
--------
>>> import numpy as np
>>> f = mask_logits(lambda tokens: np.log([0.1, 0.2, 0.3, 0.4]), top_k=2)
>>> np.exp(f([0])).round(3).tolist()
[0.0, 0.0, 0.3, 0.4]
"""

from __future__ import annotations

import numpy as np


def _mask(x, top_k, remove, inputs: str):
    """``x`` (..., V) with every token outside its row's top ``top_k`` and every ``remove``d token
    set to -inf (logits) or 0 (probabilities, then renormalised)."""
    torch_like = hasattr(x, "detach")
    fill = float("-inf") if inputs == "logits" else 0.0
    if torch_like:
        import torch

        keep = torch.ones_like(x, dtype=torch.bool)
        if top_k is not None and top_k < x.shape[-1]:
            kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
            keep &= x >= kth
        if remove:
            idx = torch.as_tensor(list(remove), device=x.device)
            keep[..., idx] = False
        out = torch.where(keep, x, torch.full_like(x, fill))
        return out if inputs == "logits" else out / out.sum(-1, keepdim=True)
    a = np.asarray(x)
    keep = np.ones(a.shape, bool)
    if top_k is not None and top_k < a.shape[-1]:
        kth = np.sort(a, axis=-1)[..., -top_k][..., None]
        keep &= a >= kth
    if remove:
        keep[..., list(remove)] = False
    out = np.where(keep, a, fill)
    return out if inputs == "logits" else out / out.sum(-1, keepdims=True)


def _check(top_k, remove):
    if top_k is None and not remove:
        raise ValueError("give top_k (keep each row's k most likely tokens) or remove (token ids to forbid)")
    if top_k is not None and int(top_k) < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")


def mask_logits(fn, *, top_k=None, remove=(), inputs: str = "logits"):
    """``fn`` (any callable returning rows over the vocabulary on its last axis) with tokens masked.

    Parameters
    ----------
    fn : callable
        ``fn(*args) -> rows [..., V]``, numpy or torch; ``inputs`` says whether they are logits
        (masked to -inf) or probabilities (masked to 0 and renormalised).
    top_k : int, optional
        Keep each row's ``top_k`` largest entries (ties at the k-th are kept).
    remove : sequence of int
        Token ids given probability 0 in every row.
    """
    _check(top_k, remove)
    if inputs not in ("logits", "probs"):
        raise ValueError(f"inputs must be 'logits' or 'probs', got {inputs!r}")

    def masked(*args, **kwargs):
        return _mask(fn(*args, **kwargs), top_k, tuple(remove), inputs)

    masked.__name__ = f"{getattr(fn, '__name__', 'target')}_masked"
    return masked


def _mask_output(output, top_k, remove):
    """A module's output with its logits masked: a tensor; a tuple or list whose first element is the logits
    (a Hugging Face model with ``return_dict=False``, most hand-written models); a named tuple, dataclass or
    mapping with a ``logits`` field (a Hugging Face ``ModelOutput`` is both)."""
    if hasattr(output, "detach"):
        return _mask(output, top_k, remove, "logits")
    if hasattr(output, "_fields") and "logits" in output._fields:  # a named tuple: replaced, not mutated
        return output._replace(logits=_mask(output.logits, top_k, remove, "logits"))
    if isinstance(output, dict) and "logits" in output:
        output["logits"] = _mask(output["logits"], top_k, remove, "logits")  # a ModelOutput's attribute follows
        return output
    if hasattr(output, "logits") and hasattr(output.logits, "detach"):
        output.logits = _mask(output.logits, top_k, remove, "logits")
        return output
    if isinstance(output, (tuple, list)) and output and hasattr(output[0], "detach"):
        first = _mask(output[0], top_k, remove, "logits")
        return type(output)((first, *output[1:])) if isinstance(output, list) else (first, *output[1:])
    kind = type(output).__name__
    raise TypeError(f"specsample.loops.mask_module: the module returned a {kind}; it masks a logits tensor, a "
                    "tuple or list whose first element is the logits, or an output with a 'logits' field. Mask the "
                    "function that returns the logits with specsample.loops.mask_logits instead")


def mask_module(module, *, top_k=None, remove=()):
    """Mask a torch module's output logits in place (a forward hook).

    The output may be a logits tensor, a tuple or list whose first element is the logits (a Hugging
    Face model called with ``return_dict=False``), or a named tuple, mapping or object with a
    ``logits`` field (a Hugging Face ``ModelOutput``); anything else raises a ``TypeError`` that names
    this helper and what it takes, at the first forward call. Returns the hook's handle:
    ``handle.remove()``, or use it as a context manager."""
    _check(top_k, remove)

    def hook(_module, _args, output):
        return _mask_output(output, top_k, tuple(remove))

    return module.register_forward_hook(hook)
