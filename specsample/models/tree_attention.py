"""Tree attention and KV-cache compaction for :class:`specsample.models.transformer.Transformer`.

A token tree is scored in one pass over its *flattened* nodes (level order: the root, then every
node of depth 1, then depth 2, ...), each node given by its token and its parent's flat index.
Three things make the pass equal to a chain pass along every root-to-node path:

* the **tree mask**: a node attends to the cached history and to its own ancestors (and itself),
  never to a sibling or a cousin (:func:`ancestors`);
* **depth positions**: a node at depth d sits at position ``start + d``, the position it will have
  once its path is accepted, not at ``start + flat index`` (:func:`depths`);
* **compaction** (:func:`compact`): after acceptance, the accepted path's keys and values are
  gathered into contiguous cache slots right after the history and everything else is dropped, so the
  next round's cache is exactly the cache a chain would have built.

Rotary keys are cached already rotated, so a key written at depth position ``start + d`` in flat
slot ``start + m`` is correct once moved to slot ``start + d``; with flat-index positions it is not.

References
----------
Miao, X. et al. (2024). SpecInfer: accelerating large language model serving with tree-based
speculative inference and verification. ASPLOS (tree attention, topology-aware causal mask).
Cai, T. et al. (2024). Medusa: simple LLM inference acceleration framework with multiple decoding
heads. ICML (tree attention over candidate paths).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from .transformer import KVCache, _embed, _head, cache_slots, cached_layers


def flat_tree(branching: tuple, root: bool = True) -> np.ndarray:
    """Parent flat index of every node of a static tree in level order (-1 for the root).

    ``branching[d]`` children under every node of depth d; with ``root=False`` the root is left
    out (depth-1 nodes get parent -1 and indices shift down by one), as a draft that grows the tree
    after its own cached history needs.
    """
    parents = [-1] if root else []
    level_start, level_size = (0, 1) if root else (-1, 1)
    for b in branching:
        first_child = len(parents)
        for i in range(level_size * b):
            parents.append(level_start + i // b if level_start >= 0 else -1)
        level_start, level_size = first_child, level_size * b
    return np.array(parents, np.int64)


def depths(parents) -> np.ndarray:
    """Depth of every node (0 for a node whose parent is -1); parents must come before children."""
    parents = np.asarray(parents)
    d = np.zeros(parents.size, np.int64)
    for i, par in enumerate(parents):
        if par >= i:
            raise ValueError(f"node {i}'s parent {par} does not come before it: flatten the tree in level order")
        d[i] = 0 if par < 0 else d[par] + 1
    return d


def ancestors(parents, *, siblings: bool = False) -> np.ndarray:
    """``A[i, j]``: node i may attend to node j (j is i or one of its ancestors).

    ``siblings=True`` is the bug the ``control:tree-mask-siblings`` scheme carries: nodes of one
    parent also see each other.
    """
    parents = np.asarray(parents)
    n = parents.size
    a = np.eye(n, dtype=bool)
    for i in range(n):
        if parents[i] >= 0:
            a[i] |= a[parents[i]]
    if siblings:
        a |= parents[:, None] == parents[None, :]
    return a


def tree_visible(size: int, tree_start, mask: np.ndarray, rows) -> jax.Array:
    """Attention mask [len(rows), size] over a cache of ``size`` slots for tree nodes ``rows``.

    The history (slots before ``tree_start``, traced) is visible to every node; slot
    ``tree_start + j`` holds tree node j and is visible to node i where ``mask[i, j]``.
    """
    n = mask.shape[0]
    j = jnp.arange(size)
    rel = j - tree_start
    inside = (rel >= 0) & (rel < n)
    m = jnp.asarray(mask[np.asarray(rows)])[:, jnp.clip(rel, 0, n - 1)]  # the rows picked in numpy: a constant
    return (j < tree_start)[None, :] | (inside[None, :] & m)


@functools.partial(jax.jit, static_argnums=1)
def _extend_masked(params, c, cache: KVCache, tokens, pos, visible):
    h = _embed(params, c, tokens, jnp.minimum(pos, c.max_len - 1))
    h, keys, values = cached_layers(params, c, cache, h, pos, visible)
    return _head(params, c, h), KVCache(keys, values, cache.length + tokens.shape[0])


def extend_tree(model, cache: KVCache, tokens, parents, *, tree_start=None, first: int = 0,
                siblings: bool = False, flat_positions: bool = False):
    """Append tree nodes ``first .. first + len(tokens) - 1`` to ``cache`` in one pass.

    Parameters
    ----------
    model : Transformer
    cache : KVCache
        Holds the history, then the tree nodes ``0 .. first - 1`` already appended (in flat order).
    tokens : int32 [n]
        The new nodes' tokens.
    parents : array of int
        Static parent flat index of every node of the whole tree (:func:`flat_tree`).
    tree_start : int or traced, optional
        Cache slot of tree node 0 (default: ``cache.length - first``). Node j's position is
        ``tree_start + depth(j)``, which is also where it lands after :func:`compact`.
    siblings, flat_positions : bool
        The controls' bugs: a mask that lets siblings see each other; position ``tree_start + j``.

    Returns
    -------
    rows : [n, V]
        Next-token distribution after each new node's root-to-node path.
    cache : KVCache
    """
    parents = np.asarray(parents)
    n = int(np.shape(tokens)[0])
    if first + n > parents.size:
        raise ValueError(f"nodes {first}..{first + n - 1} are not all in a tree of {parents.size} nodes")
    start = cache.length - first if tree_start is None else jnp.asarray(tree_start, jnp.int32)
    nodes = np.arange(first, first + n)
    offset = nodes if flat_positions else depths(parents)[nodes]
    pos = start + jnp.asarray(offset, jnp.int32)
    visible = tree_visible(cache_slots(cache), start, ancestors(parents, siblings=siblings), nodes)
    return _extend_masked(model.params, model.config, cache, jnp.asarray(tokens, jnp.int32), pos, visible)


def compact(cache: KVCache, dest, slots, count) -> KVCache:
    """Move the entries at cache ``slots`` [m] to slots ``dest .. dest + m - 1``; keep ``dest + count``.

    ``slots`` lists the accepted path's flat slots in path order (traced; entries past ``count`` are
    ignored). Everything from ``dest + count`` on is dropped, as a rollback drops a rejected draft.
    """
    slots = jnp.asarray(slots, jnp.int32)
    m = slots.shape[0]
    if m == 0:
        return cache.rollback(dest)
    if cache_slots(cache) < m:
        raise ValueError(f"cannot compact {m} entries into a cache of {cache_slots(cache)} slots")
    dest = jnp.asarray(dest, jnp.int32)
    keys = tuple(jax.lax.dynamic_update_slice(k, k[:, :, slots], (0, 0, dest)) for k in cache.keys)
    values = tuple(jax.lax.dynamic_update_slice(v, v[:, slots], (0, dest, 0)) for v in cache.values)
    return KVCache(keys, values, dest + jnp.asarray(count, jnp.int32))


def tree_nodes(branching: tuple) -> int:
    """Nodes of a static tree below the root: sum over depths of the product of branchings."""
    return sum(math.prod(branching[: d + 1]) for d in range(len(branching)))
