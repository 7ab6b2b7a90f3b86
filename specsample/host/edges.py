"""The edge-row pass (:mod:`specsample.battery.edges`) for host samplers.

Two ways in: a sampler given drafts gets every edge's rows with the hazard drafted at every slot a
safe prefix can reach (:func:`host_edge_check`); a self-drafting sampler drafts from each edge's q
itself (:func:`self_drafting_edge_check`; only edges whose q drafts the hazard often).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..battery.edges import LANES, EdgeResult, Tally, catalogue, hazard_drafts, hazard_slots
from .run import _HostModel
from .sampler import HostSamplerError


def host_edge_check(call, k: int, rule: Optional[str] = "standard", lanes: int = LANES) -> EdgeResult:
    """Every edge at every reachable slot, ``lanes`` rounds a call, for a sampler given drafts.

    ``call(drafts [B, k], q_rows [B, k, V], p_rows [B, k + 1, V]) -> (tokens, n_emitted)``: a
    :class:`specsample.host.run._Caller` (any convention: logits, flat layout, a given bonus).
    """
    tally = Tally()
    for edge in catalogue():
        v = edge.p.size
        q_rows = np.broadcast_to(edge.q, (lanes, k, v)).astype(np.float32)
        p_rows = np.broadcast_to(edge.p, (lanes, k + 1, v)).astype(np.float32)
        for slot in hazard_slots(edge, k):
            d = hazard_drafts(edge, k, slot)
            try:
                tokens, n = call(np.broadcast_to(d, (lanes, k)).copy(), q_rows, p_rows)
            except HostSamplerError as e:  # raising on a valid input is this edge's failure; the others still run
                tally.raised(edge, slot, lanes, str(e))
                continue
            for b in range(lanes):
                tally.add(edge, slot, tokens[b], n[b], d, k, rule, reached=True)
    return tally.result("drafts given")


def self_drafting_edge_check(call, k: int, rule: Optional[str] = "standard", lanes: int = LANES,
                             logits: bool = False, torch_arrays: bool = False) -> EdgeResult:
    """The edges whose q drafts the hazard for a self-drafting sampler (it drafts from the edge's q).

    ``call`` is a :class:`specsample.host.run._Caller`; its ``call_self(context, draft, target, k)``
    gets order-0 models of the edge's rows. A round reached its edge when the hazard was drafted
    after accepted drafts; the edges whose hazard q gives under 1% are skipped (never drafted).
    """
    tally = Tally()
    for edge in catalogue():
        if edge.q[edge.hazard] < 0.01:
            continue
        draft = _HostModel(edge.q[None], 0, 1, logits, torch_arrays)
        target = _HostModel(edge.p[None], 0, 1, logits, torch_arrays)
        tokens, n, drafts = call.call_self(np.zeros((lanes, 1), np.int64), draft, target, k)
        for b in range(lanes):
            m = int(n[b])
            d = np.asarray(drafts[b])[:k]
            hit = np.flatnonzero(d == edge.hazard)
            slot = int(hit[0]) if hit.size else k
            # reached: the hazard was drafted and every draft before it accepted (tokens = drafts there)
            reached = hit.size > 0 and m - 1 >= slot and np.array_equal(np.asarray(tokens[b])[:slot], d[:slot])
            tally.add(edge, slot if hit.size else -1, tokens[b], n[b], d, k, rule, reached)
    return tally.result("drafted by the sampler from each edge's q")
