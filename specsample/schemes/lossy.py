"""Lossy acceptance rules that serving engines ship on purpose, with their parameters.

They trade exactness for accepted drafts. ``specsample verify`` expects them to fail (their
``lossless`` flag is false and the report says so); ``specsample measure`` says by how much, next to
their tokens per round. Each rule is written once as numpy functions of one target row (what the
exact laws of :mod:`specsample.laws.exact` enumerate) and as a JAX round (what the engine samples).

``typical``
    Typical acceptance (Medusa, Cai et al. 2024; vLLM's ``TypicalAcceptanceSampler``): draft x is
    accepted when ``p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p)))``, deterministically;
    at the first rejection the token comes from p (``recovery="sample"``, Medusa's sampling fallback) or
    is p's argmax (``recovery="argmax"``, vLLM's recovered token); the bonus comes from p. Lossy at
    every threshold below p's largest probability.
``relaxed``
    SGLang's relaxed acceptance for EAGLE (``--speculative-accept-threshold-single`` and
    ``-threshold-acc``, the ``tree_speculative_sampling_target_only`` kernel), on a chain: draft x is
    accepted when ``u < p(x) / threshold_acc`` or ``p(x) >= threshold_single``; at a rejection the
    token comes from p with x removed, renormalised; the bonus from p. At both thresholds 1 the rule
    is exact for any draft law (the output is ``q(y) p(y) + sum_{x != y} q(x) p(y) = p(y)``); below 1 it
    accepts more and is lossy. The kernel compares ``coin <= p / threshold_acc``, which at ``coin = 0``
    accepts a token the target forbids (``verify``'s boundary pass names that form); this round is
    strict.

A parameterised rule is named with its parameters: ``relaxed[threshold_single=0.8,threshold_acc=0.5]``
(:func:`parse`); ``verify``, ``measure`` and :func:`specsample.schemes.make_scheme` take that name.

References
----------
Cai, T., Li, Y., Geng, Z., Peng, H., Lee, J. D., Chen, D. and Dao, T. (2024). Medusa: simple LLM
inference acceleration framework with multiple decoding heads. ICML. arXiv:2401.10774.
Li, Y., Wei, F., Zhang, C. and Zhang, H. (2024). EAGLE: speculative sampling requires rethinking feature
uncertainty. ICML. arXiv:2401.15077.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from typing import Callable

import jax.numpy as jnp
import numpy as np

from .base import Scheme, UniformStep, sample_weights
from .standard import Verification, speculative_round


@dataclasses.dataclass(frozen=True)
class LossyRule:
    """A lossy acceptance rule: its parameters, and its law in numpy and its round in JAX.

    ``accept_np(p_row, x) -> probability`` that draft x is accepted at a position whose target row is
    ``p_row``; ``reject_np(p_row, x) -> law`` of the token emitted when it is rejected. ``accept`` and
    ``final`` are the stages of :func:`specsample.schemes.standard.speculative_round` they replace.
    """

    name: str
    params: tuple  # ((name, value), ...) in the factory's order
    accept_np: Callable
    reject_np: Callable
    accept: Callable
    final: Callable
    description: str
    exact: bool = False  # the parameters at which the rule is lossless (relaxed at thresholds 1)

    @property
    def spec(self) -> str:
        """The rule's name with its parameters, as :func:`parse` reads it."""
        return f"{self.name}[{','.join(f'{k}={_fmt(v)}' for k, v in self.params)}]"


def _fmt(v) -> str:
    return v if isinstance(v, str) else f"{v:g}"


# --- typical acceptance --------------------------------------------------------------------------


def typical_threshold(p_row, eps: float, delta: float):
    """``min(eps, delta exp(-H(p)))`` of a target row (numpy or jnp, whichever ``p_row`` is)."""
    xp = jnp if isinstance(p_row, jnp.ndarray) else np
    logp = xp.log(xp.where(p_row > 0, p_row, 1.0))
    entropy = -xp.sum(xp.where(p_row > 0, p_row * logp, 0.0), axis=-1)
    return xp.minimum(eps, delta * xp.exp(-entropy))


def typical_rule(posterior_threshold: float = 0.09, posterior_alpha: float = 0.3,
                 recovery: str = "sample") -> LossyRule:
    """Typical acceptance with vLLM's parameter names (defaults: Medusa's 0.09 and 0.3)."""
    eps, delta = float(posterior_threshold), float(posterior_alpha)
    if not eps >= 0 or not delta >= 0:
        raise ValueError(f"typical: posterior_threshold and posterior_alpha must be >= 0, got {eps:g}, {delta:g}")
    if recovery not in ("sample", "argmax"):
        raise ValueError(f"typical: recovery must be 'sample' or 'argmax', got {recovery!r}")

    def accept_np(p_row, x):
        return float(p_row[x] > typical_threshold(p_row, eps, delta))

    def reject_np(p_row, x):
        if recovery == "sample":
            return p_row
        return np.eye(p_row.size)[int(np.argmax(p_row))]

    def accept(v: Verification):
        thr = jnp.stack([typical_threshold(v.p_row(i), eps, delta) for i in range(v.k)])
        return v.p_draft() > thr

    def final(v: Verification, j):
        row = v.p_row(j)
        if recovery == "argmax":  # the bonus (j = k) is sampled; a rejection takes the argmax
            row = jnp.where(j < v.k, jnp.zeros_like(row).at[jnp.argmax(row)].set(1.0), row)
        return sample_weights(row, v.u_final)

    return LossyRule("typical", (("posterior_threshold", eps), ("posterior_alpha", delta), ("recovery", recovery)),
                     accept_np, reject_np, accept, final,
                     f"lossy: typical acceptance p(x) > min({eps:g}, {delta:g} exp(-H(p))), rejection {recovery}s p")


# --- relaxed acceptance --------------------------------------------------------------------------


def relaxed_rule(threshold_single: float = 1.0, threshold_acc: float = 1.0) -> LossyRule:
    """SGLang's relaxed acceptance (defaults 1 and 1: the exact end)."""
    ts, ta = float(threshold_single), float(threshold_acc)
    if not (0 <= ts <= 1 and 0 < ta <= 1):
        raise ValueError(f"relaxed: threshold_single must lie in [0, 1] and threshold_acc in (0, 1], got {ts:g}, {ta:g}")

    def accept_np(p_row, x):
        px = float(p_row[x])
        return 1.0 if px >= ts else min(1.0, px / ta)

    def reject_np(p_row, x):
        w = np.array(p_row, np.float64)
        w[x] = 0.0
        return w / w.sum() if w.sum() > 0 else np.asarray(p_row, np.float64)

    def accept(v: Verification):
        px = v.p_draft()
        return (v.u_accept * ta < px) | (px >= ts)

    def final(v: Verification, j):
        row = v.p_row(j)
        x = v.drafts[jnp.minimum(j, v.k - 1)]
        removed = jnp.where(jnp.arange(row.shape[-1]) == x, 0.0, row)
        w = jnp.where((j < v.k) & (removed.sum() > 0), removed, row)  # the bonus, or nothing left: p itself
        return sample_weights(w, v.u_final)

    return LossyRule("relaxed", (("threshold_single", ts), ("threshold_acc", ta)), accept_np, reject_np, accept,
                     final, f"{'exact' if ts == ta == 1 else 'lossy'}: relaxed acceptance u < p(x) / {ta:g} or "
                            f"p(x) >= {ts:g} (SGLang), rejection from p without x", exact=ts == ta == 1)


RULES: dict[str, Callable[..., LossyRule]] = {"typical": typical_rule, "relaxed": relaxed_rule}

_SPEC = re.compile(r"^([a-z][a-z0-9_-]*)\[(.*)\]$")


def parse(spec: str):
    """``"relaxed[threshold_acc=0.5]"`` -> ``("relaxed", {"threshold_acc": 0.5})``; None when ``spec`` has no
    brackets. An unknown rule or parameter, or a value that is not a number, raises one line naming the
    valid ones."""
    m = _SPEC.match(spec.strip())
    if not m:
        return None
    name, body = m.group(1), m.group(2)
    if name not in RULES:
        raise ValueError(f"unknown lossy rule {name!r} in {spec!r}; lossy rules with parameters: {', '.join(RULES)}")
    known = list(inspect.signature(RULES[name]).parameters)
    params = {}
    for item in filter(None, (s.strip() for s in body.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in known:
            raise ValueError(f"{name}: cannot read {item!r} in {spec!r}; parameters: {', '.join(known)} "
                             f"(e.g. {name}[{known[0]}=0.5])")
        value = value.strip()
        try:
            params[key] = float(value)
        except ValueError:
            params[key] = value
    return name, params


def lossy_scheme(rule: LossyRule, k: int) -> Scheme:
    """The standard round with the rule's acceptance and last-token stages: one registered scheme."""
    k = int(k)
    return Scheme(
        name=rule.spec,
        k=k,
        max_tokens=k + 1,
        step=UniformStep(functools.partial(speculative_round, k=k, accept=rule.accept, final=rule.final), 2 * k + 1),
        lossless=rule.exact,  # relaxed at thresholds 1 is exact, and verify must pass it
        description=rule.description,
    )


def _factory(name: str):
    def make(k: int = 4, **params) -> Scheme:
        return lossy_scheme(RULES[name](**params), k)

    make.__name__ = name
    make.__doc__ = f"Lossy rule {name!r} (parameters as :func:`{RULES[name].__name__}`)."
    return make


LOSSY = {name: _factory(name) for name in RULES}


def rule_of(scheme_name: str) -> LossyRule | None:
    """The :class:`LossyRule` a scheme name denotes (``typical``, ``relaxed[...]``), or None."""
    if scheme_name in RULES:
        return RULES[scheme_name]()
    parsed = parse(scheme_name) if "[" in scheme_name else None
    return None if parsed is None else RULES[parsed[0]](**parsed[1])
