"""The edge-row pass: adversarial (drafts, q, p) rows where float32 lands exactly on a boundary.

No statistical budget reaches a situation that arises once in 10^8 draws, yet some do arise in
serving: a draft q that equals p in float32 except a 1e-8 mass on a token p forbids makes
``max(0, p - q)`` exactly zero, and a sampler that draws from that all-zero row (argmax over
``residual / noise``, or a residual clamped to the smallest float) emits a forbidden token every
time the draft is drafted. This pass builds such rows on purpose and hands them to the sampler
with the hazardous token already drafted, at every slot a safe prefix can reach, over many
seeds. Each edge has a known right answer, so every check is exact:

- every emitted token is one the target allows (p > 0), ids in [0, V), 1 <= n_emitted <= k + 1;
- under the standard rule the tokens before the last are the drafts;
- where the law is a point mass, the exact token (a one-hot p: its token after a rejection);
- p == q: every draft accepted.

Ways in: JAX schemes (a draft model whose sampler is forced onto the chosen drafts while its
table, which the ratio reads, is the edge's q; see :func:`jax_edge_check`), host samplers given
drafts, and self-drafting host samplers, which draft for themselves from the edge's q (both in
:mod:`specsample.host.edges`).
A round counts as *reached* when the hazard was drafted at its slot after accepted drafts; a pass
that reached nothing says so (``reached == 0``), never "pass".
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import numpy as np

from .. import program_cache

LANES = 32  # rounds per (edge, slot): each with its own seed


class Edge(NamedTuple):
    """One adversarial row pair (float32) and where to probe it.

    ``hazard`` is the drafted token the edge is about; ``safe`` a token accepted whatever the
    uniform (p >= q, q > 0), drafted before the hazard to reach later slots (-1: slot 0 only);
    ``expect`` the only right token where the hazard is rejected (a point mass), or -1.
    """

    name: str
    description: str
    p: np.ndarray
    q: np.ndarray
    hazard: int
    safe: int = -1
    expect: int = -1
    all_accepted: bool = False  # p == q: every draft must be accepted


def _f32(x) -> np.ndarray:
    return np.asarray(x, np.float32)


def _softmax32(logits) -> np.ndarray:
    z = _f32(logits)
    e = np.exp(z - z.max())
    return (e / e.sum(dtype=np.float32)).astype(np.float32)


@functools.lru_cache(maxsize=None)
def catalogue() -> tuple:
    """The edges, built once (float32 rows; the comments say what float32 does to them)."""
    rng = np.random.default_rng(20261130)
    out = []
    # the vanishing residual: softmax([0, -18.42]) = (1.0, 1e-8) exactly in float32
    logits = np.full(8, -np.inf, np.float32)
    logits[3], logits[5] = 0.0, -18.42
    q = _softmax32(logits)
    assert q[3] == 1.0 and 0 < q[5] < 1e-7
    out.append(Edge("vanishing-residual", "p one-hot on 3; q = softmax([0 at 3, -18.42 at 5]) = (1.0, 1e-8): "
                    "max(0, p - q) is all zeros in float32, the right output is 3", _f32(np.eye(8)[3]), q, 5, 3, 3))
    p = np.zeros(8, np.float32)
    p[[1, 4, 6]] = [0.25, 0.5, 0.25]
    q = p.copy()
    q[2] = 1e-8
    out.append(Edge("vanishing-residual-spread", "p on {1, 4, 6}; q = p plus 1e-8 on 2: a zero residual, the "
                    "right output follows p", p, q, 2, 4))
    p = np.zeros(512, np.float32)
    p[[500, 509]] = 0.5
    q = p.copy()
    q[7] = 1e-8
    out.append(Edge("vanishing-residual-large-V", "V = 512, p on {500, 509}; q = p plus 1e-8 on 7: a zero "
                    "residual far from token 0", p, q, 7, 500))
    p = _f32(rng.dirichlet(np.ones(8)))
    out.append(Edge("p-equals-q", "q == p exactly: every draft accepted, the bonus from p", p, p.copy(),
                    int(np.argmax(p)), int(np.argmax(p)), all_accepted=True))
    p = _f32(np.r_[rng.dirichlet(np.ones(7)), 0.0])
    out.append(Edge("certain-forbidden-draft", "q one-hot on 7, p(7) = 0: the draft must be rejected",
                    p, _f32(np.eye(8)[7]), 7))
    q = _f32(rng.dirichlet(np.ones(8)))
    q[2] = max(q[2], 0.3)
    q = _f32(q / q.sum())
    out.append(Edge("one-hot-p", "p one-hot on 2, q spread: a rejected draft must give exactly 2",
                    _f32(np.eye(8)[2]), q, 6, 2, 2))
    for name, tiny in (("tiny-draft-probability", 1e-30), ("subnormal-draft-probability", 1e-40)):
        q = _f32(rng.dirichlet(np.ones(8)))
        q[4] = tiny
        p = _f32(rng.dirichlet(np.ones(8)))
        p[4] = 0.0
        p = _f32(p / p.sum())
        safe = int(np.argmax(np.where(q > 1e-6, p - q, -np.inf)))
        out.append(Edge(name, f"q(4) = {tiny:g}{' (subnormal in float32)' if tiny < 1.2e-38 else ''}, p(4) = 0",
                        p, q, 4, safe if p[safe] >= q[safe] else -1))
    for name, ulps in (("sums-above-one", 4), ("sums-below-one", -4)):
        p = _f32(rng.dirichlet(np.ones(8)))
        p[0] = 0.0
        p = _f32(p / p.sum()) * _f32(1 + ulps * np.finfo(np.float32).eps)
        q = _f32(rng.dirichlet(np.ones(8))) * _f32(1 - ulps * np.finfo(np.float32).eps)
        safe = int(np.argmax(np.where(q > 0, p - q, -np.inf)))
        out.append(Edge(name, f"rows summing to 1 {'+' if ulps > 0 else '-'} {abs(ulps)} ulp, p(0) = 0",
                        _f32(p), _f32(q), 0, safe if p[safe] >= q[safe] else -1))
    raw = rng.dirichlet(np.ones(8))
    top = np.argsort(-raw)[:3]
    p = np.zeros(8)
    p[top] = raw[top]
    q = _f32(raw * 0.5 + 0.5 * rng.dirichlet(np.ones(8)))
    p = _f32(p / p.sum())
    hazard = int(np.argsort(-raw)[3])
    safe = int(np.argmax(np.where(q > 0, p - q, -np.inf)))
    out.append(Edge("top-k-masked-target", "p = the top 3 of a row, renormalised; q keeps the 4th most likely, "
                    "drafted", p, q, hazard, safe if p[safe] >= q[safe] else -1))
    return tuple(out)


class EdgeResult(NamedTuple):
    """Rounds given, rounds that reached their edge, violations, and the first one in words."""

    rounds: int
    reached: int
    violations: int
    detail: str

    @property
    def passed(self) -> bool:
        return self.violations == 0 and self.reached > 0

    @property
    def verdict(self) -> str:
        return "FAIL" if self.violations else ("not reached" if self.reached == 0 else "pass")


def round_violation(tokens, n, drafts, edge: Edge, k: int, slot: int, rule: Optional[str]) -> str:
    """What one round broke on this edge (``""``: nothing). ``slot``: where the hazard was drafted."""
    v = edge.p.size
    m = int(n)
    if not 1 <= m <= k + 1:
        return f"n_emitted = {m} outside [1, {k + 1}]"
    out = np.asarray(tokens)[:m]
    if np.any((out < 0) | (out >= v)):
        return f"token ids {out.tolist()} outside [0, {v})"
    zero = [int(t) for t in out if edge.p[t] == 0]
    if zero:
        return f"emitted token {zero[0]}, which the target gives probability 0"
    if rule == "standard" and np.any(out[: m - 1] != np.asarray(drafts)[: m - 1]):
        return f"emitted {out.tolist()}, whose first {m - 1} are not the drafts {np.asarray(drafts).tolist()}"
    if rule == "standard" and edge.all_accepted and m != k + 1:
        return f"emitted {m} tokens where p == q accepts all {k} drafts"
    if edge.expect >= 0 and m - 1 == slot and out[slot] != edge.expect:
        return f"emitted {int(out[slot])} after rejecting the hazard; the only right token is {edge.expect}"
    return ""


def hazard_slots(edge: Edge, k: int) -> list:
    return list(range(k)) if edge.safe >= 0 else [0]


def hazard_drafts(edge: Edge, k: int, slot: int) -> np.ndarray:
    return np.array([edge.safe] * slot + [edge.hazard] * (k - slot), np.int64)


def as_test(r: EdgeResult):
    """The edge pass as a hard test of a report: failed on any violation; ``reached`` False when it
    reached no edge (the case then reads "not reached", never "pass")."""
    from .report import TestResult

    return TestResult("edge-rows", float(r.violations), 0.0 if r.violations else 1.0, hard=True, detail=r.detail,
                      reached=r.reached > 0)


class Tally:
    """Rounds, reached rounds and violations of an edge pass, with the first violation in words."""

    def __init__(self):
        self.rounds = self.reached = self.violations = 0
        self.first = ""
        self.edges = set()
        self.sites: dict = {}  # draw site -> violations where a forced value of it broke the round

    def add(self, edge: Edge, slot: int, tokens, n, drafts, k: int, rule, reached: bool, forced: str = "",
            site: str = ""):
        """One round; ``forced`` names the value forced into it (``torch.rand draw 0 element 1 = 0``) and
        ``site`` the draw site it belongs to, so that a violation says which draw broke the round."""
        self.rounds += 1
        self.reached += bool(reached)
        bad = round_violation(tokens, n, drafts, edge, k, slot, rule)
        if bad:
            self.violations += 1
            self.edges.add(edge.name)
            if site:
                self.sites[site] = self.sites.get(site, 0) + 1
            where = f"hazard at slot {slot}" if slot >= 0 else "a round of safe drafts (its bonus)"
            by = f" with {forced} forced" if forced else ""
            self.first = self.first or f"{edge.name}, {where}{by}: {bad}"

    def raised(self, edge: Edge, slot: int, rounds: int, message: str):
        self.rounds += rounds
        self.reached += rounds
        self.violations += rounds
        self.edges.add(edge.name)
        self.first = self.first or f"{edge.name}, hazard at slot {slot}: {message}"

    def result(self, how: str) -> EdgeResult:
        if self.violations:
            sites = (f"; broken by draw site: {', '.join(f'{s} ({n})' for s, n in self.sites.items())}"
                     if self.sites else "")
            detail = (f"{self.violations} of {self.rounds} edge rounds broken ({', '.join(sorted(self.edges))}); "
                      f"first: {self.first}{sites}")
        elif self.reached == 0:
            detail = f"not reached: none of {self.rounds} edge rounds drafted its hazard ({how})"
        else:
            detail = f"{self.rounds} edge rounds ({self.reached} reached their edge; {how}): no violation"
        return EdgeResult(self.rounds, self.reached, self.violations, detail)


# --- JAX schemes --------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _jax_player(step):
    """(keys [E, B], stacked target and draft of E edges, contexts [E, B, W]) -> the rounds, [E, B, ...].

    One ``vmap`` over all E B lanes, each reading its edge's rows of the flattened tables (the engine's
    layout, :meth:`~specsample.models.tables.TableModel.flat_pairs`), not one over edges and one over
    lanes: a doubly batched tree walk took a third longer to trace and half again as long to compile,
    for the same rounds to the bit."""
    import jax
    import jax.numpy as jnp

    def one(key, edge, ctx, target, draft):
        return step(key, target.at_pair(edge), draft.at_pair(edge), ctx)

    def play(keys, target, draft, ctx):
        n_edges, lanes = keys.shape[:2]
        edge = jnp.repeat(jnp.arange(n_edges, dtype=jnp.int32), lanes)
        out = jax.vmap(one, in_axes=(0, 0, 0, None, None))(
            keys.reshape(n_edges * lanes), edge, ctx.reshape((n_edges * lanes,) + ctx.shape[2:]),
            target.flat_pairs(), draft.flat_pairs())
        return jax.tree.map(lambda x: x.reshape((n_edges, lanes) + x.shape[1:]), out)

    return jax.jit(play)


_MODELS: dict = {}


def _forced_models(edge: Edge, slot: int):
    """:func:`_build_forced_models`, built once per process (alias tables of V^2 rows cost ~1 s at V = 1024)."""
    key = (edge.name, slot)
    if key not in _MODELS:
        _MODELS[key] = _build_forced_models(edge, slot)
    return _MODELS[key]


def _build_forced_models(edge: Edge, slot: int):
    """Order-1 device models: the target's rows are p everywhere; the draft's table (which the ratio
    reads) is q everywhere, but its sampler drafts ``safe`` after token c0 (slot 0) and the hazard
    after ``safe`` (slot 1), or the hazard straight after c0 (slot 0)."""
    from ..models.tables import PackedAlias, TableModel, pair_for_device

    v = edge.p.size
    c0 = next(t for t in range(v) if t not in (edge.hazard, edge.safe))
    t1 = TableModel(np.tile(edge.p.astype(np.float64), (v, 1)), 1)
    d1 = TableModel(np.tile(edge.q.astype(np.float64), (v, 1)), 1)
    t, d = pair_for_device(t1, d1)
    forced = np.tile(edge.q.astype(np.float64), (v, 1))
    if slot == 0:
        forced[c0] = np.eye(v)[edge.hazard]
    else:
        forced[c0], forced[edge.safe] = np.eye(v)[edge.safe], np.eye(v)[edge.hazard]
    d = TableModel(d.table, 1, PackedAlias.build(forced.astype(np.float32)), paired=d.paired)
    return t, d, c0


def _prepared(prepare, edge: Edge, slot: int, models):
    """The forced models after a scheme's ``prepare`` (built once per process and preparation)."""
    key = (edge.name, slot, prepare)
    if key not in _MODELS:
        t, d, c0 = models
        _MODELS[key] = (*prepare(t, d), c0)
    return _MODELS[key]


def jax_edge_check(scheme, k: Optional[int] = None, lanes: int = LANES, seed: int = 0) -> EdgeResult:
    """The edges for a JAX scheme on table models (not stateful ones), hazard at slots 0 and 1."""
    import jax
    import jax.numpy as jnp

    from ..schemes import StatefulStep, program_identity

    if isinstance(scheme.step, StatefulStep):
        return EdgeResult(0, 0, 0, "not reached: a stateful scheme runs on neural models, not edge rows")
    k = scheme.k if k is None else k
    rule = getattr(scheme, "rule", None)
    tally = Tally()
    by_vocab: dict = {}
    for edge in catalogue():
        for slot in ([0, 1] if edge.safe >= 0 and k > 1 else [0]):
            by_vocab.setdefault(edge.p.size, []).append((edge, slot))
    # where a round reports the drafts of a path: a chain's first k; a tree the first child at each
    # depth, of the visited node in the walk layout (table trees), of the first node in the node layout
    from ..schemes.tree import report_cuts
    from .tree_stages import tree_rule

    tree = tree_rule(scheme)
    identity = program_identity(scheme, "edge-rows")  # specsample's own: the program loads in a new process
    for v, jobs in by_vocab.items():
        models = [_forced_models(edge, slot) for edge, slot in jobs]
        if scheme.prepare is not None:  # the tables the scheme's rounds read, as the engine gives them
            models = [_prepared(scheme.prepare, edge, slot, m) for (edge, slot), m in zip(jobs, models)]
        t = jax.tree.map(lambda *xs: jnp.stack(xs), *[m[0] for m in models])
        d = jax.tree.map(lambda *xs: jnp.stack(xs), *[m[1] for m in models])
        ctx = jnp.asarray(np.array([[m[2]] for m in models], np.int32))[:, None, :].repeat(lanes, axis=1)
        keys = jax.random.split(jax.random.key(seed), len(jobs) * lanes).reshape(len(jobs), lanes)
        out = jax.device_get(program_cache.call(_jax_player(scheme.step), identity, keys, t, d, ctx))
        for e, (edge, slot) in enumerate(jobs):
            want = np.array([edge.safe] * slot + [edge.hazard], np.int64)
            n_drafts = out.drafts.shape[-1]
            path = (report_cuts(tree[1], n_drafts)[1] if tree else list(range(n_drafts + 1)))[: slot + 1]
            for b in range(lanes):
                drafts = np.asarray(out.drafts[e, b], np.int64)
                reached = drafts.size > slot and np.array_equal(drafts[path], want[: len(path)])
                tally.add(edge, slot, out.tokens[e, b], out.n_emitted[e, b], drafts, scheme.max_tokens - 1,
                          rule, reached)
    return tally.result("drafts forced through the draft's sampler")
