"""Host tree samplers: the convention for tree verification written in torch, a reference, and its battery.

The convention (beside the chain convention of :class:`~specsample.host.sampler.HostSampler`)::

    fn(tokens, parents, draft_rows, target_rows, generator) -> (path, final)

* ``tokens`` int64 [B, N + 1]: the flattened tree of each of B rounds, node 0 the root (the last
  context token), then the drafted nodes in level order;
* ``parents`` int64 [N + 1]: each node's parent index (-1 for the root; a parent before its
  children); one tree shape for the batch, any shape (static or not);
* ``draft_rows``, ``target_rows`` float64 [B, N + 1, V]: the draft's and the target's next-token
  distribution after each node's root-to-node path (probabilities, or log-probabilities with
  ``inputs="logits"``);
* ``generator``: a seeded ``torch.Generator`` (draw from it: counts then reproduce);
* returns ``path`` int64 [B, D] (D the tree's depth): the accepted nodes from the root down, padded
  with -1, and ``final`` int64 [B]: the token emitted after them (from the residual where the walk
  stopped, or the bonus from the target's row at an accepted leaf).

The round emits ``tokens[path]`` then ``final``. specsample drafts the trees on table pairs by the
rule the sampler claims (``rrs``: children i.i.d. from q; ``rrs-wor``: distinct children; ``topk``: the
draft's b most likely tokens), and tests, per context, the emitted tokens against the claimed rule's
exact round law (:mod:`specsample.laws.tree_exact`) and the first emitted token against p: a tree round
that is lossless emits its first token from p whatever the tree.

:func:`tree_reference` is a vectorised torch implementation of all three rules (loops over depth and
sibling slots only); its ``bug=`` twins are what the tests show the battery rejects.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import numpy as np

import stats

from ..models.tables import TableModel
from ..battery.report import CaseResult, TestResult
from ..models.tree_attention import depths, flat_tree
from ..laws.tree_exact import tree_law
from .run import _as_int, _draw
from .sampler import HostSamplerError, _derive, _torch_available

TREE_RULES = ("rrs", "rrs-wor", "topk")
TREE_BUGS = ("bonus-parent", "no-renorm")
TREE_CAPS = {"quick": 1 << 14, "default": 1 << 17, "thorough": 1 << 20, "certify": 1 << 18}  # rounds per case at most
TREE_TV = {"quick": 0.05, "default": 0.02, "thorough": 0.01, "certify": 0.014}  # TV of the first token the plan aims to detect
TREE_CASES = (  # name, pair family, vocab, order
    ("ngram-1", "ngram-1", 4, 1),
    ("ngram-1-peaked", "ngram-1-peaked", 4, 1),
    ("dirichlet", "dirichlet", 8, 0),
)
BATCH = 1024  # rounds per call


@dataclasses.dataclass(frozen=True)
class TreeSampler:
    """A host tree sampler and the rule it claims (module docstring)."""

    fn: Callable
    rule: str = "rrs"
    name: str = "tree-host"
    inputs: str = "probs"
    layout: str = "batch"

    def __post_init__(self):
        if not callable(self.fn):
            raise TypeError(f"a tree sampler needs a callable, got {type(self.fn).__name__}")
        if self.rule not in TREE_RULES:
            raise ValueError(f"tree sampler rule must be one of {', '.join(TREE_RULES)}, got {self.rule!r}")
        if self.inputs not in ("probs", "logits"):
            raise ValueError(f"tree sampler inputs must be probs or logits, got {self.inputs!r}")
        if self.layout not in ("batch", "ragged"):
            raise ValueError(f"tree sampler layout must be batch (one shape) or ragged (a tree per request), "
                             f"got {self.layout!r}")
        if not _torch_available():
            raise ValueError("a host tree sampler is called with torch tensors: pip install torch")


# --- the reference ------------------------------------------------------------------------------


def children_table(parents) -> np.ndarray:
    """[N + 1, max children] node indices of each node's children in order, padded with -1."""
    parents = np.asarray(parents, np.int64)
    kids = [[] for _ in parents]
    for i, par in enumerate(parents):
        if par >= i:
            raise ValueError(f"node {i}'s parent {par} does not come before it: flatten the tree in level order")
        if par >= 0:
            kids[par].append(i)
    width = max(1, max(len(k) for k in kids))
    return np.array([k + [-1] * (width - len(k)) for k in kids], np.int64)


def tree_reference(rule: str = "rrs", bug: Optional[str] = None) -> TreeSampler:
    """A vectorised torch tree sampler of ``rule`` (``bug``: a broken twin, see :data:`TREE_BUGS`).

    ``bug="bonus-parent"``: at an accepted leaf the bonus comes from the leaf's parent row;
    ``bug="no-renorm"`` (topk): the residual is not renormalised after a candidate is removed.
    """
    if rule not in TREE_RULES:
        raise ValueError(f"unknown tree rule {rule!r}; valid rules: {', '.join(TREE_RULES)}")
    if bug not in (None,) + TREE_BUGS:
        raise ValueError(f"unknown bug {bug!r}; valid: {', '.join(TREE_BUGS)}")

    def sample(tokens, parents, draft_rows, target_rows, generator):
        import torch

        def norm(w, fallback):
            s = w.sum(-1, keepdim=True)
            return torch.where(s > 0, w / torch.where(s > 0, s, torch.ones_like(s)), fallback)

        b, _, v = target_rows.shape
        par = torch.as_tensor(parents, dtype=torch.long)
        kids = torch.as_tensor(children_table(par.numpy()))
        depth = int(depths(par.numpy()).max())
        lanes = torch.arange(b)
        cur = torch.zeros(b, dtype=torch.long)
        alive = torch.ones(b, dtype=torch.bool)
        path = torch.full((b, depth), -1, dtype=torch.long)
        final = torch.zeros(b, dtype=torch.long)
        for d in range(depth):
            r = target_rows[lanes, cur]
            q = draft_rows[lanes, cur]
            used = torch.zeros(b, v, dtype=torch.bool)
            hit = torch.zeros(b, dtype=torch.bool)
            nxt = cur.clone()
            for i in range(kids.shape[1]):
                node = kids[cur, i]
                live = alive & ~hit & (node >= 0)
                c = tokens[lanes, node.clamp(min=0)]
                u = torch.rand(b, generator=generator, dtype=r.dtype)
                if rule == "topk":
                    ok = u < r[lanes, c]
                    removed = r.clone()
                    removed[lanes, c] = 0.0
                    reduced = removed if bug == "no-renorm" else norm(removed, r)
                else:
                    qi = q if rule == "rrs" else norm(q * ~used, q)
                    ok = u * qi[lanes, c] < r[lanes, c]
                    reduced = norm((r - qi).clamp(min=0.0), r)
                    used[lanes, c] |= live
                take = live & ok
                nxt = torch.where(take, node, nxt)
                hit |= take
                r = torch.where((live & ~ok)[:, None], reduced, r)
            stop = alive & ~hit  # every child rejected (or none): the last token from the residual
            draw = torch.multinomial(norm(r, target_rows[lanes, cur]), 1, generator=generator)[:, 0]
            final = torch.where(stop, draw, final)
            path[:, d] = torch.where(alive & hit, nxt, -1)
            alive &= hit
            cur = nxt
        row = target_rows[lanes, par[cur].clamp(min=0)] if bug == "bonus-parent" else target_rows[lanes, cur]
        final = torch.where(alive, torch.multinomial(row, 1, generator=generator)[:, 0], final)
        return path, final

    name = f"tree_reference[{rule}{', ' + bug if bug else ''}]"
    return TreeSampler(sample, rule=rule, name=name)


# --- drafting the trees on a table pair ------------------------------------------------------------


def static_parents(branching: tuple) -> np.ndarray:
    """Parents of a static tree with the root (level order): :func:`specsample.models.tree_attention.flat_tree`."""
    return flat_tree(tuple(branching))


def _rows(model: TableModel, nodes: np.ndarray) -> np.ndarray:
    table = np.asarray(model.table, np.float64)
    return table[nodes] if model.order == 1 else np.broadcast_to(table[0], nodes.shape + table.shape[-1:])


def draft_trees(rule: str, branching: tuple, draft: TableModel, roots: np.ndarray, rng) -> np.ndarray:
    """Flattened trees [R, N + 1] under ``roots`` [R] (order-1 draft: the root's token is its context)."""
    r = roots.shape[0]
    tokens = [roots.astype(np.int64)[:, None]]
    level = roots[:, None].astype(np.int64)
    for b in branching:
        q = _rows(draft, level)  # [R, m, V]
        m, v = level.shape[1], q.shape[-1]
        if rule == "topk":
            top = np.argsort(-q.astype(np.float32), axis=-1, kind="stable")[..., :b]
            kids = top.reshape(r, m * b)
        else:
            flat_q = q.reshape(r * m, v).copy()
            out = np.zeros((r * m, b), np.int64)
            for i in range(b):
                w = flat_q
                out[:, i] = _draw(np.cumsum(w, axis=-1), w > 0, rng.random(r * m))
                if rule == "rrs-wor":
                    flat_q = flat_q.copy()
                    flat_q[np.arange(r * m), out[:, i]] = 0.0
            kids = out.reshape(r, m * b)
        tokens.append(kids)
        level = kids
    return np.concatenate(tokens, axis=1)


# --- the battery ------------------------------------------------------------------------------------


def _pair(family: str, vocab: int, order: int, seed: int):
    from ..models.pairs import make_pair, ngram_pair

    if order:
        conc = 0.2 if family.endswith("peaked") else 1.0
        return ngram_pair(seed, vocab, 1, conc, 0.5)
    return make_pair(family, seed, vocab)


def _call(s: TreeSampler, tokens, parents, q_rows, p_rows, generator, depth: int):
    import torch

    def rows(x):
        x = torch.as_tensor(np.array(x))  # a writable copy: broadcast rows are read-only views
        return torch.log(x) if s.inputs == "logits" else x

    try:
        path, final = s.fn(torch.as_tensor(tokens), torch.as_tensor(parents), rows(q_rows), rows(p_rows), generator)
    except Exception as e:  # the user's code: one line, where it raised
        from ..schemes import user_location

        raise HostSamplerError(f"tree sampler {s.name!r} raised {type(e).__name__}: {e}{user_location(e)}") from e
    path, final = _as_int(path, "the path"), _as_int(final, "the final token")
    b = tokens.shape[0]
    if path.shape != (b, depth) or final.shape != (b,):
        raise HostSamplerError(f"tree sampler {s.name!r} returned path {path.shape} and final {final.shape}; "
                               f"expected ({b}, {depth}) and ({b},)")
    return path, final


def _walk(path: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """Accepted nodes per round, or -1 where the path is not a root-down chain of the tree."""
    n_acc = (path >= 0).sum(1)
    ok = np.all((path >= 0) == (np.arange(path.shape[1]) < n_acc[:, None]), axis=1)  # -1 only at the end
    prev = np.zeros(path.shape[0], np.int64)
    for d in range(path.shape[1]):
        node = path[:, d]
        on = d < n_acc
        inside = (node >= 0) & (node < parents.size)
        ok &= ~on | (inside & (parents[np.clip(node, 0, parents.size - 1)] == prev))
        prev = np.where(on & inside, node, prev)
    return np.where(ok, n_acc, -1)


def _case(s: TreeSampler, name: str, family: str, vocab: int, order: int, branching: tuple, rounds: int, seed: int,
          level: float, power: float) -> CaseResult:
    import torch

    t0 = time.perf_counter()
    pair = _pair(family, vocab, order, _derive(seed, "tree-pair", name))
    target, draft = pair.target, pair.draft
    parents = static_parents(branching)
    depth = len(branching)
    rng = np.random.default_rng(_derive(seed, "tree-draft", name))
    gen = torch.Generator().manual_seed(_derive(seed, "tree-sampler", name))
    n_ctx = vocab if order else 1
    laws = [tree_law(s.rule, target, draft, branching)((c,) if order else ()) for c in range(n_ctx)]
    cells = sorted(set().union(*laws))
    index = {o: i for i, o in enumerate(cells)}
    probs = np.array([[law.get(o, 0.0) for o in cells] for law in laws])
    counts = np.zeros((n_ctx, len(cells)), np.int64)
    first = np.zeros((n_ctx, vocab), np.int64)
    malformed = outside = 0
    done = 0
    while done < rounds:
        b = min(BATCH, rounds - done)
        roots = rng.integers(0, vocab, b) if order else np.zeros(b, np.int64)
        tokens = draft_trees(s.rule, branching, draft, roots, rng)
        p_rows, q_rows = _rows(target, tokens), _rows(draft, tokens)
        path, final = _call(s, tokens, parents, q_rows, p_rows, gen, depth)
        n_acc = _walk(path, parents)
        good = (n_acc >= 0) & (final >= 0) & (final < vocab)
        malformed += int((~good).sum())
        ctx = roots if order else np.zeros(b, np.int64)
        for i in np.flatnonzero(good):
            emitted = tuple(int(tokens[i, x]) for x in path[i, : n_acc[i]]) + (int(final[i]),)
            j = index.get(emitted)
            if j is None:
                outside += 1
            else:
                counts[ctx[i], j] += 1
            first[ctx[i], emitted[0]] += 1
        done += b
    tests, mtv = case_tests(s.rule, target, n_ctx, counts, probs, first, malformed, outside, rounds, level, power,
                            tree="the tree", law=f"the exact {s.rule} round law, {len(cells)} outcomes, {{rows}} contexts")
    expected = [sum(p * len(o) for o, p in law.items()) for law in laws]  # tokens per round, per context
    observed = float((counts * np.array([len(o) for o in cells])).sum() / max(1, counts.sum()))
    return CaseResult(name=name, scheme=s.name, family=family, model=f"tree {branching}", vocab=vocab, k=depth,
                      length=depth + 1, sequences=rounds, rounds=rounds, tests=tests, min_detectable_tv=mtv,
                      tokens_per_round=observed, acceptance_theory=float(np.mean(expected)),
                      seconds=time.perf_counter() - t0)


def case_tests(rule: str, target: TableModel, n_ctx: int, counts, probs, first, malformed: int, outside: int,
               rounds: int, level: float, power: float, *, tree: str, law: str) -> tuple:
    """A tree case's four tests (both conventions) and its min detectable TV: ``valid-paths`` and ``support``
    (hard), ``first-token`` against p, ``round-law`` (``counts`` rows against ``probs`` rows; rows no round
    drew are left out). ``tree`` says whose tree a path must follow; ``law`` names the law, ``{rows}`` its rows."""
    vocab = target.vocab_size
    p_first = np.asarray(target.table, np.float64)[:n_ctx]
    live = counts.sum(1) > 0
    round_t = stats.transition_test(counts[live], probs[live])
    first_t = stats.transition_test(first, p_first)
    zero_first = int(first[p_first == 0].sum())
    mtv = stats.min_detectable_tv(int(rounds / n_ctx), vocab - 1, level, power).tv
    return [
        TestResult("valid-paths", float(malformed), float(malformed == 0), hard=True,
                   detail=f"{malformed} rounds whose path is not a root-down chain of {tree} or whose final token "
                          f"is outside [0, {vocab})"),
        TestResult("support", float(outside + zero_first), float(outside + zero_first == 0), hard=True,
                   detail=f"{outside} rounds emitted what the {rule} rule never emits ({zero_first} first tokens "
                          "of target probability 0)"),
        TestResult("first-token", first_t.statistic, first_t.pvalue, first_t.dof,
                   detail=f"the first emitted token against p, {first_t.contexts} contexts", min_detectable_tv=mtv,
                   law=(first, p_first)),
        TestResult("round-law", round_t.statistic, round_t.pvalue, round_t.dof,
                   detail=f"emitted tokens against {law.format(rows=round_t.contexts)}", law=(counts, probs)),
    ], mtv
