"""What the chain and tree laws share: a round law's type, the steps every enumeration takes, and each
rule's acceptance probability averaged over the draft.

A *round law* maps a context (a tuple of tokens) to ``{emitted tokens: probability}``: the exact law
of what one round of a scheme emits from there. :mod:`.exact` builds them for chain schemes and
:mod:`.tree_exact` for token trees; both import this module and neither imports the other's
internals, so the two stay free of import cycles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:  # annotations only: the audit's workers import ACCEPTANCE from here without JAX
    from ..models.tables import TableModel

RoundLaw = Callable[[tuple], dict]


def round_starts(from_draft: np.ndarray) -> np.ndarray:
    """(n, L) bool from a loop's provenance (True: an accepted draft): where its rounds start, at
    position 0 and after every token that is not an accepted draft."""
    start = np.ones(np.shape(from_draft), bool)
    start[:, 1:] = ~np.asarray(from_draft, bool)[:, :-1]
    return start


# P(a draft is accepted | the slot's rows p, q), averaged over the draft's law q, by acceptance rule
ACCEPTANCE = {
    "standard": lambda p, q: np.minimum(p, q).sum(-1),  # accept x with min(1, p(x) / q(x))
    "exact-match": lambda p, q: (p * q).sum(-1),  # the target samples; a draft is kept when equal
}


def model_rows(model: TableModel, context: tuple, drafts: tuple) -> np.ndarray:
    """The model's k + 1 rows after context + drafts[:i], float64."""
    toks = np.array(context + drafts, dtype=np.int64)
    w = len(context)
    return model.probs_np(toks[w - model.order :] if model.order else toks[w:])


def last_row(model: TableModel, context: tuple, drafts: tuple) -> np.ndarray:
    """The model's row after context + drafts (float64): ``model_rows(...)[-1]``, without the others
    where the model can give one row alone (``last_np``)."""
    last = getattr(model, "last_np", None)
    if last is None:
        return model_rows(model, context, drafts)[-1]
    toks = np.array(context + drafts, dtype=np.int64)
    w = len(context)
    return last(toks[w - model.order :] if model.order else toks[w:])


def add_emissions(out: dict, prefix: tuple, mass: float, last: np.ndarray) -> None:
    """Add ``prefix`` followed by each token y of ``last`` with probability ``mass * last[y]``."""
    ys = np.flatnonzero(last > 0)
    for y, w in zip(ys.tolist(), (mass * last[ys]).tolist()):  # Python scalars: a law is many small dict updates
        key = prefix + (y,)
        out[key] = out.get(key, 0.0) + w
