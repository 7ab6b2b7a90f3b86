"""The model interface: what a round function may ask of a target or draft model.

Every built-in round over probability tables (``standard``, ``block``, ``greedy``, the multi-draft
rules, the trees and every negative control) reads its two models through the methods of
:class:`Model` alone. The engine hands a round :class:`~specsample.models.tables.TableModel` objects,
which also carry *fast-path attributes* (below); a round reads those with ``getattr`` and a default,
and falls back to the required methods without them, with the same law. So a user's scheme may wrap
the models it is given (a temperature wrapper, a logit bias, a mask) in any object that has the
required methods, and pass the wrapper to ``speculative_round`` or any other built-in round.

Required (all jittable and vmappable; ``tokens`` is an int32 array whose windows of ``order``
tokens give the rows):

========================  =========================================================================
``order``                 int, the number of preceding tokens a distribution depends on (static)
``probs(tokens)``         every window's next-token distribution, shape ``[len(tokens) - order + 1, V]``
``prob_of(tokens, nxt)``  ``probs(tokens)[t, nxt[t]]`` for each ``t < len(nxt)``
``row(tokens, t)``        ``probs(tokens)[t]``, ``t`` possibly traced
``sample(tokens, u)``     a token drawn from the last window's distribution with a uniform ``u``
========================  =========================================================================

Optional fast paths (what happens without them):

================  ===================================================================================
``table``         the probability table. Read as a fence's trip count (``leading_true``'s anchor) and,
                  for a context-free table of at most 16 entries, by selects instead of a gather.
                  Without it: the fence counts from the acceptance mask, lookups go through
                  ``prob_of``. Same values.
``paired``,       set by :func:`~specsample.models.tables.pair_for_device` on the engine's own pair:
``residuals``     residual alias tables and acceptance thresholds. Without them (``paired`` false or
                  absent) a round builds the residual from ``row`` and samples it by inverse CDF,
                  and tests ``u * q(x) < p(x)`` from ``prob_of``. A wrapper must *not* forward them:
                  they describe the engine's pair, not the wrapped law.
``chains``        residual chains of the table trees (``Scheme.prepare``). Without them the tree
                  rules walk their nodes from ``row``.
``vocab_size``    V; read only on the fast paths above.
================  ===================================================================================

Rounds over KV caches (``cached``, ``tree-cached`` and their controls) take the transformer's
interface instead (:mod:`specsample.models.transformer`), described in the KV-cache docs.

Changes to this contract are listed in ``CHANGELOG.md``; the conformance table
(``tests/test_model_contract.py``) runs every registered table round with a duck-typed wrapper.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

REQUIRED = ("order", "probs", "prob_of", "row", "sample")
OPTIONAL = ("table", "paired", "residuals", "chains", "vocab_size")


@runtime_checkable
class Model(Protocol):
    """What a round function may ask of a model (see the module docstring for the whole contract).

    Examples
    --------
    >>> import numpy as np
    >>> from specsample.models import context_free
    >>> isinstance(context_free(np.array([0.25, 0.75])), Model)
    True
    """

    order: int

    def probs(self, tokens):
        """Every window's next-token distribution."""

    def prob_of(self, tokens, nxt):
        """``probs(tokens)[t, nxt[t]]`` for each ``t < len(nxt)``."""

    def row(self, tokens, t):
        """``probs(tokens)[t]``."""

    def sample(self, tokens, u):
        """A token from the last window's distribution, drawn with the uniform ``u``."""


def missing(model) -> list[str]:
    """The required names ``model`` lacks (empty when it honours the contract).

    >>> missing(object())
    ['order', 'probs', 'prob_of', 'row', 'sample']
    """
    return [name for name in REQUIRED if not hasattr(model, name)]
