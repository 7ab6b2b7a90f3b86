"""The model interface is a contract (`specsample.models.interface`): every built-in table round runs
on a duck-typed model that has the required methods and none of the fast-path attributes, with the
same tokens as on the engine's own (unpaired) table model; and a user's temperature wrapper, the
interface docs/writing-a-scheme.md describes, verifies end to end through the standard round."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specsample
from specsample import schemes
from specsample.models import pairs, tables
from specsample.models.interface import OPTIONAL, Model, missing
from specsample.schemes import base
from specsample.schemes.standard import speculative_round

TABLE_ROUNDS = [n for n, f in schemes.registered().items() if not isinstance(f(3).step, base.StatefulStep)]
# the default run takes the rounds with a fast path of their own and one of each family; every other
# registered round (controls included) runs with the conformance table (`pytest -m long`)
DEFAULT_ROUNDS = {"standard", "block", "greedy", "multidraft", "tree", "tree-dynamic"}


class Delegate:
    """The required methods, forwarded; no fast-path attribute (a user's pass-through wrapper)."""

    def __init__(self, inner):
        self._inner, self.order = inner, inner.order

    def probs(self, tokens):
        return self._inner.probs(tokens)

    def prob_of(self, tokens, nxt):
        return self._inner.prob_of(tokens, nxt)

    def row(self, tokens, t):
        return self._inner.row(tokens, t)

    def sample(self, tokens, u):
        return self._inner.sample(tokens, u)


class Tempered:
    """A temperature wrapper written from the interface alone: p ** (1 / T), renormalised."""

    def __init__(self, inner, temperature):
        self._inner, self._t, self.order = inner, temperature, inner.order

    def probs(self, tokens):
        w = self._inner.probs(tokens) ** (1.0 / self._t)
        return w / w.sum(axis=-1, keepdims=True)

    def prob_of(self, tokens, nxt):
        rows = self.probs(tokens)[: nxt.shape[-1]]
        return jnp.take_along_axis(rows, nxt[..., None], axis=-1)[..., 0]

    def row(self, tokens, t):
        return self.probs(tokens)[t]

    def sample(self, tokens, u):
        return base.sample_weights(self.probs(tokens)[-1], u)


def test_the_protocol_names_the_contract():
    pr = pairs.make_pair("dirichlet", 0, 8)
    assert isinstance(pr.target, Model) and not missing(pr.target)
    assert isinstance(Delegate(pr.target), Model) and not missing(Tempered(pr.target, 0.7))
    assert not any(hasattr(Delegate(pr.target), name) for name in OPTIONAL)
    assert missing(object()) == ["order", "probs", "prob_of", "row", "sample"]


@pytest.mark.parametrize("name", [n if n in DEFAULT_ROUNDS else pytest.param(n, marks=pytest.mark.long)
                                  for n in TABLE_ROUNDS])
def test_every_table_round_reads_a_duck_typed_model_as_it_reads_the_table_model(name):
    # the fast paths (a table for the fence and for selects, the pair's residual tables) are optional: without
    # them a round gives the tokens the plain table model gives, bit for bit, for the same uniforms
    s = schemes.registered()[name](3)
    # a context-free pair at V = 8 (a table read by selects) and an order-1 pair (window by window)
    free, ngram = pairs.make_pair("dirichlet", 2, 8), pairs.ngram_pair(2, vocab=4, order=1)
    models = [(pr.target.with_sampler(), pr.draft.with_sampler()) for pr in (free, ngram)]
    ctx = jnp.array([3, 1], jnp.int32)

    @jax.jit
    def both(us):
        def one(u):
            return [(s.step.round(u, t, d, ctx), s.step.round(u, Delegate(t), Delegate(d), ctx),
                     s.step.round(u, Tempered(t, 0.7), Tempered(d, 0.7), ctx)) for t, d in models]
        return jax.vmap(one)(us)

    for (plain, duck, tempered), vocab in zip(both(jax.random.uniform(jax.random.key(1), (64, s.step.n))), (8, 4)):
        for a, b in zip(plain, duck):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        # the temperature wrapper of the docs runs through the round too, and gives well-formed rounds
        n = np.asarray(tempered.n_emitted)
        assert np.all((n >= 1) & (n <= s.max_tokens))
        toks = np.asarray(tempered.tokens)
        assert np.all((toks >= 0) & (toks < vocab))


def _tempered_scheme(k, temperature, *, target=True, draft=True):
    def round_(u, tgt, drf, context):
        return speculative_round(u, Tempered(tgt, temperature) if target else tgt,
                                 Tempered(drf, temperature) if draft else drf, context, k=k)

    return specsample.Scheme(
        name=f"tempered-{temperature}", k=k, max_tokens=k + 1, step=base.UniformStep(round_, 2 * k + 1),
        target_law=functools.partial(tables.warp_probs, temperature=temperature))


def test_a_temperature_wrapper_through_the_standard_round_verifies_and_its_broken_twin_fails():
    # the user's scheme of the changelog's 0.2.0 entry: it tempers both models and declares the tempered law
    good = specsample.verify(_tempered_scheme(4, 0.6), budget="quick", k=4, cases="dirichlet/V8/k4")
    assert good.passed, good.table()
    # temperature on the draft alone, the tempered law declared: the output follows the untempered p
    bad = specsample.verify(_tempered_scheme(4, 0.6, target=False), budget="quick", k=4, cases="dirichlet/V8/k4")
    assert not bad.passed
