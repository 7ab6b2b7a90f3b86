"""A host sampler: the callable and how to call it (inputs, layout, randomness), loaded by name."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Callable, Optional


INPUTS = ("probs", "logits")
RNGS = ("numpy", "torch", "torch-global")
ARRAYS = ("numpy", "torch")


class HostSamplerError(RuntimeError):
    """The user's sampler raised, or returned something that is not (tokens, n_emitted)."""


class HostNondeterminismWarning(UserWarning):
    """The sampler drew from a global generator that specsample does not seed: counts will not reproduce."""


@dataclasses.dataclass(frozen=True)
class HostSampler:
    """A sampler callable and how to call it (see the module docstring).

    Attributes
    ----------
    fn : callable
        ``fn(drafts, draft_rows, target_rows, rng) -> (tokens, n_emitted)``.
    name : str
    inputs : {"probs", "logits"} or "DRAFT,TARGET"
        What the rows are: probabilities, or log-probabilities (``-inf`` where p = 0); two kinds
        separated by a comma give the draft's rows and the target's apart (``"probs,logits"``: draft
        probabilities and target logits, as serving engines pass them).
    batched : bool
        False: ``fn`` takes one round (``drafts [k]``, rows ``[k, V]``, ``[k + 1, V]``) and
        returns ``(tokens [k + 1], n_emitted)``; specsample loops over the batch.
    rng : {"numpy", "torch", "torch-global"}
    arrays : {"numpy", "torch"}
        The array type passed in (outputs may be either: they go through ``np.asarray``).
    rule : str or None
        ``"standard"`` (default) claims the standard rule, which adds the tests of accepted
        drafts per round and per-token acceptance on context-free pairs, and requires every
        emitted token but the last to be the draft at its position. None: output law only.
    drafts : {"given", "self"}
        "self": the sampler drafts too. It is then called as ``fn(context int[B, W], draft, target,
        rng) -> (tokens [B, k + 1], n_emitted [B], drafts [B, k])`` where ``draft`` and ``target``
        are models: ``model(tokens [..., W + t]) -> rows [..., t + 1, V]``, row i following the
        context and the first i tokens after it (probs or logits, as ``inputs`` says). A function
        that takes a keyword ``k`` is told the draft length.
    layout : {"rounds", "flat"}
        "flat": the serving engines' ragged batch. Each request gets its own draft count in
        0..k (drawn by specsample, uniformly, so that indexing bugs that show only with unequal
        counts are reached), and the call is ``fn(draft_token_ids [T], num_draft_tokens [B],
        draft_rows [T, V], target_rows [T + B, V], rng) -> tokens [B, max + 1]`` padded with -1:
        requests one after another (request b's drafts start at ``cumsum(num_draft_tokens)[b] -
        num_draft_tokens[b]``), its target rows at each draft and then its bonus row. Accepted
        drafts per round are then not tested against a fixed-k law; per-token acceptance still is.
    device : str
        The torch device the rows, the sampler's inputs and its generator live on (``"cuda"``,
        ``"cuda:1"``; default ``"cpu"``), so that GPU kernels run natively; needs ``arrays="torch"``.
    bonus : {"sampled", "given"}
        "given": specsample samples the bonus token from p's row after each request's drafts and
        passes the ids in (``bonus_token_ids [B]``, just before ``rng``), as engines that sample it
        outside the rejection sampler do; the target's bonus rows are then not passed (flat layout:
        ``target_rows [T, V]``).
    """

    fn: Callable
    name: str = "host"
    inputs: str = "probs"
    batched: bool = True
    rng: str = "numpy"
    arrays: str = "numpy"
    rule: Optional[str] = "standard"
    drafts: str = "given"
    layout: str = "rounds"
    bonus: str = "sampled"
    device: str = "cpu"

    @property
    def draft_inputs(self) -> str:
        return self.inputs.split(",")[0]

    @property
    def target_inputs(self) -> str:
        return self.inputs.split(",")[-1]

    def __post_init__(self):
        if self.rule == "none":  # the command line's spelling of "no rule"
            object.__setattr__(self, "rule", None)
        if self.rule not in (None, "standard"):
            raise ValueError(f"host sampler rule must be 'standard' or None ('none'), got {self.rule!r}")
        if not callable(self.fn):
            raise TypeError(f"a host sampler needs a callable, got {type(self.fn).__name__}")
        kinds = [x.strip() for x in str(self.inputs).split(",")]
        if not 1 <= len(kinds) <= 2 or any(x not in INPUTS for x in kinds):
            raise ValueError(f"host sampler inputs must be probs, logits, or DRAFT,TARGET such as probs,logits; "
                             f"got {self.inputs!r}")
        object.__setattr__(self, "inputs", kinds[0] if len(set(kinds)) == 1 else ",".join(kinds))
        for field, allowed in (("rng", RNGS), ("arrays", ARRAYS), ("drafts", ("given", "self")),
                               ("layout", ("rounds", "flat")), ("bonus", ("sampled", "given"))):
            if getattr(self, field) not in allowed:
                raise ValueError(f"host sampler {field} must be one of {', '.join(allowed)}, "
                                 f"got {getattr(self, field)!r}")
        if self.drafts == "self" and (self.layout == "flat" or self.bonus == "given"):
            raise ValueError("a self-drafting sampler draws its own drafts and bonus: layout='flat' and "
                             "bonus='given' are for samplers given the drafts")
        if self.layout == "flat" and not self.batched:
            raise ValueError("layout='flat' is a batch of requests; it cannot be unbatched")
        if self.device != "cpu":
            _check_device(self.device, self.arrays)
        if (self.rng != "numpy" or self.arrays == "torch") and not _torch_available():
            raise ValueError(f"host sampler rng={self.rng!r} / arrays={self.arrays!r} needs torch, which is "
                             "not installed (pip install torch), or use rng='numpy', arrays='numpy'")


def _check_device(device: str, arrays: str) -> None:
    if arrays != "torch":
        raise ValueError(f"device {device!r} puts torch tensors on it: give arrays='torch' (--arrays torch)")
    if not _torch_available():
        raise ValueError(f"device {device!r} needs torch, which is not installed (pip install torch)")
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"unknown torch device {device!r}: {str(e).splitlines()[0]}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: torch finds no CUDA device here (torch.cuda.is_available() is False)")
    if dev.type not in ("cpu", "cuda", "mps", "xpu"):
        raise ValueError(f"device {device!r}: specsample passes rows to cpu, cuda, mps or xpu devices")


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _derive(seed: int, *labels) -> int:
    h = hashlib.sha256(repr((int(seed),) + labels).encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


def load_sampler(spec, **options) -> HostSampler:
    """A :class:`HostSampler` from a callable, a HostSampler, or ``path.py:attr`` / ``module:attr``.

    ``options`` (inputs, batched, rng, arrays, rule, name) apply to a plain callable; a
    HostSampler loaded from a file keeps its own, and an option given here overrides it (None means
    "not given"; ``rule="none"`` drops the rule).
    """
    obj = spec
    if isinstance(spec, str):
        from ..schemes import SchemeLoadError, _load_object

        if ":" not in spec:
            raise SchemeLoadError(f"a sampler is given as path.py:function or module:function, got {spec!r}")
        obj = _load_object(spec)
    options = {k: v for k, v in options.items() if v is not None}
    if callable(obj) and not isinstance(obj, HostSampler) and _is_factory(obj):
        obj = obj()  # a factory such as specsample.host.adapters:torch_batched
    if isinstance(obj, HostSampler):
        return dataclasses.replace(obj, **options)
    if not callable(obj):
        raise TypeError(f"{spec!r} is a {type(obj).__name__}, not a callable sampler")
    options.setdefault("name", getattr(obj, "__name__", "host"))
    return HostSampler(obj, **options)


def _is_factory(fn) -> bool:
    """A callable that takes no required argument (an adapter factory), not a sampler."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return not any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
