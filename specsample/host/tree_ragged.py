"""A tree per request: the serving engines' ragged tree batch, a reference, and its case.

Serving engines batch requests whose trees differ in size and shape. The ragged convention (a
:class:`~specsample.host.tree.TreeSampler` with ``layout="ragged"``, ``--tree B1,B2,... --ragged``)::

    fn(tokens, parents, num_nodes, draft_rows, target_rows, generator) -> (path, final)

* ``tokens`` int64 [T]: every request's flattened tree, one request after another; request b's
  nodes start at ``cumsum(num_nodes)[b] - num_nodes[b]``, its node 0 is its root (the last
  context token), the drafted nodes follow in level order;
* ``parents`` int64 [T]: each node's parent as an index *within its request* (-1 for the root);
* ``num_nodes`` int64 [B]: nodes per request, the root included;
* ``draft_rows``, ``target_rows`` float64 [T, V]: the distributions after each node's path;
* returns ``path`` int64 [B, D] (D the deepest tree's depth, padded with -1) of node indices
  within each request, and ``final`` int64 [B], as in the batch convention.

specsample drafts the static tree of the given branching for every request and keeps, per request,
one of a few *shapes*: each node keeps a prefix of its children (so the kept children were drafted
as that shape's rule drafts them), the full tree and the chain among them. Requests of every shape
share each call in random order, so a sampler that reads one request's shape or offsets for
another's is reached. Each (shape, context) row is tested against its own exact round law
(:func:`specsample.laws.tree_exact.shape_law`), and the first token against p.
"""

from __future__ import annotations

import time

import numpy as np

from ..battery.report import CaseResult
from ..laws.tree_exact import shape_law
from ..models.tree_attention import depths
from .run import _as_int
from .sampler import HostSamplerError, _derive
from .tree import BATCH, TREE_BUGS, TreeSampler, case_tests, _pair, _rows, _walk, draft_trees, static_parents, tree_reference

SHAPES = 6  # shapes per case: the full tree, the chain, and random prefix-closed subtrees


def shape_family(branching: tuple, n: int, rng) -> list:
    """``n`` shapes of the static tree ``branching``: kept node indices (level order) and their parents.

    Shape 0 is the whole tree and shape 1 the chain of first children; the rest keep, under each
    kept node, a random prefix (possibly empty, at least one child at the root) of its children.
    """
    full = static_parents(branching)
    kids = [[] for _ in full]
    for i, par in enumerate(full):
        if par >= 0:
            kids[par].append(i)

    def build(count):
        keep, stack = [0], [0]
        while stack:
            node = stack.pop(0)
            c = count(node, len(kids[node]))
            keep += kids[node][:c]
            stack += kids[node][:c]
        keep = sorted(keep)
        where = {old: new for new, old in enumerate(keep)}
        return np.array(keep), np.array([-1] + [where[full[i]] for i in keep[1:]], np.int64)

    out = [build(lambda node, b: b), build(lambda node, b: min(1, b))]
    while len(out) < n:
        out.append(build(lambda node, b: int(rng.integers(1 if node == 0 else 0, b + 1))))
    return out[:n]


def ragged_reference(rule: str = "rrs", bug=None) -> TreeSampler:
    """The batch reference (:func:`~specsample.host.tree.tree_reference`) in the ragged convention.

    Requests are grouped by shape, and each group is one call of the batch reference.
    ``bug="first-shape"``: every request is walked with the first request's parents, the old
    one-shape-per-batch assumption; the batch reference's bugs (:data:`~specsample.host.tree.TREE_BUGS`)
    pass through.
    """
    if bug not in (None, "first-shape") + TREE_BUGS:
        raise ValueError(f"unknown bug {bug!r}; valid: first-shape, {', '.join(TREE_BUGS)}")
    inner = tree_reference(rule, bug if bug in TREE_BUGS else None).fn

    def sample(tokens, parents, num_nodes, draft_rows, target_rows, generator):
        import torch

        counts = [int(x) for x in num_nodes]
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int)
        shapes = [tuple(int(x) for x in parents[s : s + n]) for s, n in zip(starts, counts)]
        if bug == "first-shape":
            shapes = [shapes[0]] * len(shapes)
            counts = [len(shapes[0])] * len(counts)
        depth = max(int(depths(np.array(sh)).max()) for sh in shapes)
        path = torch.full((len(counts), depth), -1, dtype=torch.long)
        final = torch.zeros(len(counts), dtype=torch.long)
        for shape in dict.fromkeys(shapes):
            idx = [b for b, sh in enumerate(shapes) if sh == shape]
            rows = torch.as_tensor(np.concatenate([np.arange(starts[b], starts[b] + counts[b]) for b in idx]))
            rows = rows.clamp(max=tokens.shape[0] - 1).reshape(len(idx), len(shape))
            p, f = inner(tokens[rows], np.array(shape), draft_rows[rows], target_rows[rows], generator)
            path[idx, : p.shape[1]] = p
            final[idx] = f
        return path, final

    return TreeSampler(sample, rule=rule, name=f"ragged_reference[{rule}{', ' + bug if bug else ''}]",
                       layout="ragged")


def ragged_case(s: TreeSampler, name: str, family: str, vocab: int, order: int, branching: tuple, rounds: int,
                seed: int, level: float, power: float) -> CaseResult:
    """One pair, requests of :data:`SHAPES` shapes batched together: the ragged twin of the batch case."""
    import torch

    t0 = time.perf_counter()
    pair = _pair(family, vocab, order, _derive(seed, "tree-pair", name))
    target, draft = pair.target, pair.draft
    rng = np.random.default_rng(_derive(seed, "tree-draft", name))
    shapes = shape_family(branching, SHAPES, np.random.default_rng(_derive(seed, "tree-shapes", name)))
    gen = torch.Generator().manual_seed(_derive(seed, "tree-sampler", name))
    n_ctx = vocab if order else 1
    laws = [shape_law(s.rule, target, draft, par)((c,) if order else ()) for _, par in shapes for c in range(n_ctx)]
    cells = sorted(set().union(*laws))
    index = {o: i for i, o in enumerate(cells)}
    probs = np.array([[law.get(o, 0.0) for o in cells] for law in laws])
    counts = np.zeros((len(laws), len(cells)), np.int64)
    first = np.zeros((n_ctx, vocab), np.int64)
    malformed = outside = 0
    depth = len(branching)
    done = 0
    while done < rounds:
        b = min(BATCH, rounds - done)
        roots = rng.integers(0, vocab, b) if order else np.zeros(b, np.int64)
        full = draft_trees(s.rule, branching, draft, roots, rng)
        which = rng.integers(0, len(shapes), b)
        keep = [shapes[w][0] for w in which]
        tokens = np.concatenate([full[i, kp] for i, kp in enumerate(keep)])
        parents = np.concatenate([shapes[w][1] for w in which])
        num = np.array([kp.size for kp in keep], np.int64)
        rows = (_rows(draft, tokens), _rows(target, tokens))
        if s.inputs == "logits":
            with np.errstate(divide="ignore"):
                rows = tuple(np.log(x) for x in rows)
        try:
            path, final = s.fn(torch.as_tensor(tokens), torch.as_tensor(parents), torch.as_tensor(num),
                               *(torch.as_tensor(np.array(x)) for x in rows), gen)
        except Exception as e:
            from ..schemes import user_location

            raise HostSamplerError(f"tree sampler {s.name!r} raised {type(e).__name__}: {e}{user_location(e)}") from e
        path, final = _as_int(path, "the path"), _as_int(final, "the final token")
        if path.ndim != 2 or path.shape[0] != b or path.shape[1] > depth or final.shape != (b,):
            raise HostSamplerError(f"tree sampler {s.name!r} returned path {path.shape} and final {final.shape}; "
                                   f"expected ({b}, deepest depth <= {depth}) and ({b},)")
        path = np.pad(path, ((0, 0), (0, depth - path.shape[1])), constant_values=-1)
        ctx = roots if order else np.zeros(b, np.int64)
        for i in range(b):
            kp, par = shapes[which[i]]
            n_acc = _walk(path[i : i + 1], par)[0]
            if n_acc < 0 or not 0 <= final[i] < vocab:
                malformed += 1
                continue
            emitted = tuple(int(full[i, kp[x]]) for x in path[i, :n_acc]) + (int(final[i]),)
            j = index.get(emitted)
            if j is None:
                outside += 1
            else:
                counts[which[i] * n_ctx + ctx[i], j] += 1
            first[ctx[i], emitted[0]] += 1
        done += b
    sizes = ", ".join(map(str, sorted({kp.size - 1 for kp, _ in shapes})))
    tests, mtv = case_tests(s.rule, target, n_ctx, counts, probs, first, malformed, outside, rounds, level, power,
                            tree="their own request's tree",
                            law=f"each request's exact {s.rule} round law: {len(shapes)} shapes of {sizes} drafted "
                                "nodes, {rows} (shape, context) rows")
    return CaseResult(name=name, scheme=s.name, family=family, model=f"ragged trees of {branching}", vocab=vocab,
                      k=depth, length=depth + 1, sequences=rounds, rounds=rounds, tests=tests, min_detectable_tv=mtv,
                      seconds=time.perf_counter() - t0)
