"""Seeded families of target/draft pairs covering the edge cases of speculative sampling.

Each family maps ``(rng, V)`` to a context-free pair ``(p, q)`` of float64 vectors and has
a name the battery and the report show. Regimes that matter to the acceptance rule:

* q = p: every draft is accepted and the residual is 0/0;
* p >= q on a token: that token is always accepted;
* p << q on a token: it is rarely accepted, so the residual carries the weight;
* zeros in p (must never be emitted), zeros in q (never drafted), disjoint supports
  (nothing accepted), one-hot p, entries near 1e-30, and a 32k vocabulary.

Note that p >= q on *every* token forces p = q, so "always accepted" is a per-token regime.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from .. import program_cache
from .tables import TableModel, context_free, random_ngram, warp_probs


class Family(NamedTuple):
    name: str
    description: str
    make: Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]]
    default_vocab: int = 8


class Pair(NamedTuple):
    """A target and a draft model, with the family name that produced them."""

    name: str
    target: TableModel
    draft: TableModel


def _norm(x):
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum(axis=-1, keepdims=True)


def _dirichlet(conc):
    return lambda rng, v: (rng.dirichlet(np.full(v, conc)), rng.dirichlet(np.full(v, conc)))


ZIPF_EXPONENT, ZIPF_TEMPERATURE, ZIPF_DRAFT_NOISE = 1.1, 0.8, 0.5


def _zipf_softmax(rng, v):
    """A tokenizer-like pair: softmax of Zipf logits (``-s log rank`` over a random order of the ids, plus unit
    normal noise) at temperature 0.8, so that a few tokens dominate and most are near zero (at V = 32,768
    the median token has probability about 5e-7, the largest about 0.3); the draft's logits are the
    target's plus normal noise of 0.5, as a small model trained on the same data."""
    logits = -ZIPF_EXPONENT * np.log1p(rng.permutation(v)) + rng.standard_normal(v)

    def softmax(z):
        e = np.exp((z - z.max()) / ZIPF_TEMPERATURE)
        return e / e.sum()

    return softmax(logits), softmax(logits + ZIPF_DRAFT_NOISE * rng.standard_normal(v))


def _identical(rng, v):
    p = rng.dirichlet(np.ones(v))
    return p, p.copy()


def _perturbed(rng, v):
    p = rng.dirichlet(np.ones(v))
    return p, _norm(p * np.exp(0.05 * rng.standard_normal(v)))


def _rare_accept(rng, v):
    # q piles mass on tokens where p is tiny: those drafts are almost always rejected
    p = rng.dirichlet(np.ones(v))
    rare = rng.choice(v, size=max(1, v // 4), replace=False)
    p[rare] = 1e-4 * rng.random(rare.size) + 1e-6
    p = _norm(p)
    q = rng.dirichlet(np.ones(v)) * 0.2
    q[rare] += 0.8 / rare.size
    return p, _norm(q)


def _mostly_below(rng, v):
    # q <= p on most tokens (always accepted there); the rest of q's mass sits on two tokens
    p = rng.dirichlet(np.ones(v))
    q = 0.7 * p
    heavy = rng.choice(v, size=2, replace=False)
    q[heavy] += 0.15
    return p, _norm(q)


def _disjoint(rng, v):
    h = v // 2
    p = np.concatenate([rng.dirichlet(np.ones(h)), np.zeros(v - h)])
    q = np.concatenate([np.zeros(h), rng.dirichlet(np.ones(v - h))])
    return p, q


def _zeros_in_p(rng, v):
    p = rng.dirichlet(np.ones(v))
    p[rng.choice(v, size=v // 2, replace=False)] = 0.0
    return _norm(p), rng.dirichlet(np.ones(v))


def _zeros_in_q(rng, v):
    q = rng.dirichlet(np.ones(v))
    q[rng.choice(v, size=v // 2, replace=False)] = 0.0
    return rng.dirichlet(np.ones(v)), _norm(q)


def _one_hot_p(rng, v):
    p = np.zeros(v)
    p[rng.integers(v)] = 1.0
    return p, rng.dirichlet(np.ones(v))


def _tiny(rng, v):
    p = rng.dirichlet(np.ones(v))
    q = rng.dirichlet(np.ones(v))
    p[rng.choice(v, size=v // 4, replace=False)] = 1e-30
    q[rng.choice(v, size=v // 4, replace=False)] = 1e-30
    return _norm(p), _norm(q)


def _warped(**kw):
    # the same warp on both models: losslessness is then with respect to the warped target
    def make(rng, v):
        p, q = rng.dirichlet(np.ones(v)), rng.dirichlet(np.ones(v))
        return warp_probs(p, **kw), warp_probs(q, **kw)

    return make


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("dirichlet-peaked", "Dirichlet(0.1) pair: a few dominant tokens", _dirichlet(0.1)),
        Family("dirichlet", "Dirichlet(1) pair: uniform on the simplex", _dirichlet(1.0)),
        Family("dirichlet-flat", "Dirichlet(10) pair: both close to uniform", _dirichlet(10.0)),
        Family("identical", "q = p: every draft accepted, residual 0/0", _identical),
        Family("perturbed", "q a 5% log-normal perturbation of p (near-identical)", _perturbed),
        Family("rare-accept", "q heavy where p ~ 1e-4 (p << q: rarely accepted)", _rare_accept),
        Family("mostly-below", "q <= p on most tokens (always accepted there)", _mostly_below),
        Family("disjoint", "p and q on disjoint supports: nothing accepted", _disjoint),
        Family("zeros-in-p", "half of p's tokens have probability 0", _zeros_in_p),
        Family("zeros-in-q", "half of q's tokens have probability 0", _zeros_in_q),
        Family("one-hot-p", "p puts all its mass on one token", _one_hot_p),
        Family("tiny", "a quarter of the entries of p and of q are 1e-30", _tiny),
        Family("warp-temperature", "Dirichlet(1) pair, both at temperature 0.5", _warped(temperature=0.5)),
        Family("warp-top-k", "Dirichlet(1) pair, both cut to their top 3 tokens", _warped(top_k=3)),
        Family("warp-top-p", "Dirichlet(1) pair, both cut to top-p 0.8", _warped(top_p=0.8)),
        Family("large-vocab", "Dirichlet(1) pair over V = 32768", _dirichlet(1.0), 32768),
        Family("large-vocab-zipf", "tokenizer-like pair over V = 32768: softmax of noisy Zipf(1.1) logits at "
               "temperature 0.8 (most tokens near zero), q the target's logits plus noise", _zipf_softmax, 32768),
    ]
}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown pair family {name!r}; valid families: {', '.join(FAMILIES)}") from None


def make_pair(family: str, seed: int, vocab: int | None = None) -> Pair:
    """One context-free pair from a family, reproducible from ``seed``."""
    fam = get_family(family)
    p, q = fam.make(np.random.default_rng(seed), vocab or fam.default_vocab)
    return Pair(fam.name, context_free(p), context_free(q))


def make_pairs(family: str, seed: int, n_pairs: int, vocab: int | None = None) -> Pair:
    """A batch of ``n_pairs`` pairs (tables with a leading batch axis) for one vectorised run."""
    fam = get_family(family)
    rng = np.random.default_rng(seed)
    ps, qs = zip(*(fam.make(rng, vocab or fam.default_vocab) for _ in range(n_pairs)))
    return Pair(fam.name, TableModel(np.stack([context_free(p).table for p in ps]), 0),
                TableModel(np.stack([context_free(q).table for q in qs]), 0))


def replicate(pair: Pair, copies: int) -> Pair:
    """``copies`` of one pair as a batch: one engine call then gives independent runs of it."""
    tile = lambda m: TableModel(np.repeat(np.asarray(m.table)[None], copies, axis=0), m.order)  # noqa: E731
    return Pair(pair.name, tile(pair.target), tile(pair.draft))


def ngram_pair(seed: int, vocab: int = 4, order: int = 1, concentration: float = 1.0,
               mix: float = 0.5) -> Pair:
    """A random order-m target and a draft that mixes it with an independent random table.

    p and q differ per context, so only such pairs expose bugs in which position's
    distribution is used (off-by-one between draft and target rows).
    """
    p = random_ngram(seed, vocab, order, concentration)
    other = random_ngram(seed + 1_000_003, vocab, order, concentration)
    q = TableModel((1 - mix) * np.asarray(p.table) + mix * np.asarray(other.table), order)
    return Pair(f"ngram-{order}", p, q)


# --- neural pairs: small causal transformers with KV caches ------------------------------------

CLOSE_PERTURBATION = 0.05
NEURAL_FAMILIES = {
    # name: description (the target is a 2-layer, width-32, 2-head rotary transformer)
    "transformer-close": f"draft = the target with every weight moved by {CLOSE_PERTURBATION:g} std (alpha ~ 0.9)",
    "transformer-far": "draft = an independent 1-layer transformer of width 16 (alpha ~ 0.05-0.5)",
}


class NeuralPair(NamedTuple):
    """Two transformers sharing a vocabulary, and the prompt every sequence starts after."""

    name: str
    target: object  # specsample.models.transformer.Transformer
    draft: object
    prompt: tuple


def neural_pair(family: str, seed: int, vocab: int = 8, prompt_len: int = 1, max_len: int = 64) -> NeuralPair:
    """A target transformer and a close or far draft, and a prompt, all reproducible from ``seed``."""
    if family not in NEURAL_FAMILIES:
        raise ValueError(f"unknown neural family {family!r}; valid: {', '.join(NEURAL_FAMILIES)}")
    # the weights come from a few hundred small eager ops (a tenth of a second a pair): a command keeps them
    return program_cache.value(lambda: _neural_pair(family, seed, vocab, prompt_len, max_len),
                               ("neural-pair", family, seed, vocab, prompt_len, max_len))


def _neural_pair(family: str, seed: int, vocab: int, prompt_len: int, max_len: int) -> NeuralPair:
    from .transformer import Transformer  # neural models are an optional layer over the tables

    target = Transformer.create(seed, vocab=vocab, width=32, layers=2, heads=2, max_len=max_len)
    if family == "transformer-close":
        draft = target.perturbed(seed + 1, CLOSE_PERTURBATION)
    else:
        draft = Transformer.create(seed + 1, vocab=vocab, width=16, layers=1, heads=2, max_len=max_len)
    prompt = tuple(int(x) for x in np.random.default_rng(seed).integers(vocab, size=prompt_len))
    return NeuralPair(family, target, draft, prompt)
