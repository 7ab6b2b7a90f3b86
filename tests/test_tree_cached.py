"""Tree attention, KV compaction and the stateful tree scheme (`tree-cached`) on the transformer.

The battery side (tree-cached passes, its three controls fail) is in the conformance table; here:
tree rows equal chain rows along every path, compaction leaves the cache a chain would have built,
each control's bug moves the rows, and a one-child tree plays exactly the chain scheme.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsample.models import tree_attention as ta
from specsample.models.pairs import neural_pair
from specsample.schemes import CONTROLS, SCHEMES, make_scheme
from specsample.schemes.tree_cached import tree_cached
from specsample.models.transformer import Transformer, cache_entries, empty_cache

TOL = 2e-5  # float32 rounding between one masked pass and a teacher-forced one


@pytest.fixture(scope="module")
def model():
    return Transformer.create(0, vocab=8, max_len=64)


def tree_path_rows(model, history, tokens, parents) -> np.ndarray:
    """Chain rows along every root-to-node path (teacher-forced): row i follows history then node i's path."""
    seqs = []
    for i in range(len(parents)):
        path, j = [], i
        while j >= 0:
            path.append(int(tokens[j]))
            j = parents[j]
        seqs.append(list(history) + path[::-1])
    padded = np.zeros((len(seqs), max(map(len, seqs))), np.int64)
    for i, s in enumerate(seqs):
        padded[i, : len(s)] = s
    rows = np.asarray(model.probs(padded), np.float64)  # a causal row does not see the padding after it
    return rows[np.arange(len(seqs)), [len(s) - 1 for s in seqs]]


def _prefilled(model, history):
    _, cache, _ = model.extend(empty_cache(model.config), np.asarray(history[:-1], np.int32))
    return cache


def test_flat_tree_layout():
    assert ta.flat_tree((2, 2)).tolist() == [-1, 0, 0, 1, 1, 2, 2]
    assert ta.flat_tree((2, 2), root=False).tolist() == [-1, -1, 0, 0, 1, 1]
    assert ta.depths(ta.flat_tree((3, 2, 1))).tolist() == [0] + [1] * 3 + [2] * 6 + [3] * 6
    a = ta.ancestors([-1, 0, 0, 1])
    assert a[3].tolist() == [True, True, False, True] and not a[1, 2]
    assert ta.ancestors([-1, 0, 0, 1], siblings=True)[1, 2]
    with pytest.raises(ValueError, match="level order"):
        ta.depths([1, -1])


@pytest.mark.parametrize("branching", [(3, 2, 1), (2, 2, 2), (4,), (1, 1, 1)])
@pytest.mark.parametrize("rotary", [True, False])
def test_tree_rows_equal_chain_rows_along_every_path(branching, rotary):
    model = Transformer.create(3, vocab=8, max_len=64, rotary=rotary)
    rng = np.random.default_rng(len(branching))
    history = rng.integers(0, 8, 5)
    parents = ta.flat_tree(branching)
    tokens = rng.integers(0, 8, parents.size).astype(np.int32)
    tokens[0] = history[-1]  # the root is the last history token
    rows, cache = ta.extend_tree(model, _prefilled(model, history), tokens, parents)
    want = tree_path_rows(model, history[:-1], tokens, parents)
    assert np.max(np.abs(np.asarray(rows) - want)) < TOL
    assert int(cache.length) == len(history) - 1 + parents.size


def test_a_tree_grown_level_by_level_equals_one_pass(model):
    """The draft appends one level at a time after its history (no root): same rows as the chain."""
    branching = (3, 2, 2)
    parents = ta.flat_tree(branching, root=False)
    history = np.array([1, 5, 2, 7])
    _, cache, _ = model.extend(empty_cache(model.config), history)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 8, parents.size).astype(np.int32)
    start, got, first = int(cache.length), [], 0
    for size in (3, 6, 12):
        r, cache = ta.extend_tree(model, cache, tokens[first : first + size], parents, tree_start=start, first=first)
        got.append(np.asarray(r))
        first += size
    want = tree_path_rows(model, history, tokens, parents)
    assert np.max(np.abs(np.concatenate(got) - want)) < TOL


@pytest.mark.parametrize("path", [(0, 0, 0), (2, 5, 5), (1, 2)])
def test_compaction_leaves_the_chain_cache(model, path):
    """After gathering an accepted path, the next token's row is the chain's, and the kept K/V equal a
    chain prefill's entries."""
    branching = (3, 2, 1)
    parents = ta.flat_tree(branching)
    offsets = [0, 3, 9]
    history = np.array([4, 0, 6])
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 8, parents.size).astype(np.int32)
    tokens[0] = history[-1]
    cache = _prefilled(model, history)
    t_start = int(cache.length)
    _, cache = ta.extend_tree(model, cache, tokens, parents)
    flat = [1 + offsets[d] + path[d] for d in range(len(path))]  # nodes of the accepted path, root excluded
    cache = ta.compact(cache, t_start + 1, np.array([t_start + f for f in flat]), len(path))
    assert int(cache.length) == t_start + 1 + len(path)
    seq = np.concatenate([history, tokens[flat]])
    _, chain, _ = model.extend(empty_cache(model.config), seq)
    n = len(seq)
    for got, want in zip(cache_entries(cache), cache_entries(chain)):  # keys, then values
        assert np.max(np.abs(np.asarray(got[:, :n]) - np.asarray(want[:, :n]))) < TOL
    nxt = np.array([3], np.int32)
    row, _, _ = model.extend(cache, nxt)
    assert np.max(np.abs(np.asarray(row[0]) - np.asarray(model.probs(np.concatenate([seq, nxt]))[-1]))) < TOL


def test_each_tree_attention_bug_moves_the_rows(model):
    parents = ta.flat_tree((3, 2))
    history = np.array([2, 2, 5])
    tokens = np.array([5, 1, 3, 6, 0, 7, 2, 4, 1, 1], np.int32)
    cache = _prefilled(model, history)
    good, _ = ta.extend_tree(model, cache, tokens, parents)
    # nodes the bug leaves alone: the root (no sibling); the root and the first child (flat index = depth)
    for bug, same in ((dict(siblings=True), 1), (dict(flat_positions=True), 2)):
        bad, _ = ta.extend_tree(model, cache, tokens, parents, **bug)
        assert np.max(np.abs(np.asarray(bad) - np.asarray(good))) > 0.01, bug
        assert np.max(np.abs(np.asarray(bad[:same]) - np.asarray(good[:same]))) < TOL, bug


def test_a_one_child_tree_plays_the_chain_scheme():
    """Branching (1, 1, 1, 1) with the same uniforms: token for token what `cached` emits, round after round."""
    pair = neural_pair("transformer-far", 5, 8, 1)
    k, lanes, length = 4, 128, 12
    chain, tree = make_scheme("cached", k), tree_cached(k, branching=(1,) * k)
    assert tree.step.n == chain.step.n

    def lanes_of(s):
        x = s.step.init(pair.target, pair.draft, jnp.asarray(pair.prompt), length)
        return jax.tree.map(lambda a: jnp.broadcast_to(a, (lanes,) + a.shape), x)

    sa, sb = lanes_of(chain), lanes_of(tree)
    fa, fb = (jax.jit(jax.vmap(s.step.round, in_axes=(0, None, None, 0))) for s in (chain, tree))
    for r in range(3):
        u = jax.random.uniform(jax.random.key(r), (lanes, 2 * k + 1))
        oa, sa = fa(u, pair.target, pair.draft, sa)
        ob, sb = fb(u, pair.target, pair.draft, sb)
        np.testing.assert_array_equal(oa.n_emitted, ob.n_emitted)
        mask = np.arange(k + 1) < np.asarray(oa.n_emitted)[:, None]
        np.testing.assert_array_equal(np.where(mask, oa.tokens, -1), np.where(mask, ob.tokens, -1))


def test_tree_cached_is_registered_with_its_controls():
    assert "tree-cached" in SCHEMES
    assert {"control:tree-mask-siblings", "control:tree-compact-first-branch", "control:tree-flat-positions"} <= set(
        CONTROLS)
    s = make_scheme("tree-cached", 3)
    assert s.k == 3 and s.max_tokens == 4 and s.step.n == (3 + 6 + 6) + (3 + 2 + 1) + 1
    with pytest.raises(ValueError, match="unknown tree rule"):
        tree_cached(3, rule="nope")
    for rule in ("rrs-wor", "topk"):  # every tree rule runs over the caches
        t = tree_cached(2, rule=rule)
        pair = neural_pair("transformer-close", 1, 8, 2)
        st = t.step.init(pair.target, pair.draft, jnp.asarray(pair.prompt), 4)
        out, _ = jax.jit(t.step.round)(jax.random.uniform(jax.random.key(0), (t.step.n,)), pair.target, pair.draft,
                                        st)
        assert 1 <= int(out.n_emitted) <= 3


@pytest.mark.long  # two stage passes of 1,024 transformer lanes, 12 s (the conformance table
# runs tree-cached, and every control is rejected, under -m long too)
def test_tree_cached_rounds_against_the_exact_tree_law():
    """Issue 33, item 4: rounds from the commonest histories against the exact tree law of the two
    transformers' rows there (`tree-round-law`); a mispositioned tree (flat indices) fails it on the
    small vocabulary, where the round's first token alone does not."""
    from specsample.battery import stages
    from specsample.battery.cases import default_cases
    from specsample.battery.suite import resolve_budget

    case = next(c for c in default_cases(resolve_budget("quick")[0], (4,)) if c.name == "transformer-close/V2/k4")
    pair = case.pair(0)
    results = {}
    for name in ("tree-cached", "control:tree-flat-positions"):
        # the conformance run's lanes: its compiled steps serve here too
        tests, _ = stages.stateful_stage_tests(make_scheme(name, 4), pair, seed=3, n_lanes=1024)
        results[name] = {t.name: t for t in tests}
    good, bad = results["tree-cached"], results["control:tree-flat-positions"]
    assert set(good) == {"round-first-token", "tree-round-law"}
    assert good["tree-round-law"].pvalue > 1e-3 and "against the exact rrs-wor tree law" in good["tree-round-law"].detail
    assert bad["tree-round-law"].pvalue < 1e-6 and bad["round-first-token"].pvalue > 1e-3


def test_tree_round_law_reads_a_near_certain_history_by_its_exact_tail(monkeypatch):
    # one history whose law is a near-certain block: 64 rounds, the rare block (expected 0.032 times) seen once.
    # Its exact tail is 1 - 0.9995^64 = 0.031; its raw Pearson statistic (about 30 on 1 dof) read 1e-7
    import numpy as np

    from specsample.battery import tree_round_law as trl
    from specsample.battery.diagnosis import Rounds

    law = {(0, 0): 0.9995, (1, 0): 0.0005}
    monkeypatch.setattr(trl, "tree_law", lambda *a: lambda history: law)
    monkeypatch.setattr(trl, "_Rows", lambda *a: None)

    class Pair:
        class target:
            vocab_size = 2

        draft = target

    tokens = np.zeros((64, 2), np.int64)
    tokens[5, 0] = 1
    n_acc = np.ones(64, np.int64)  # every round emits two tokens: (0, 0), once (1, 0)
    rounds = Rounds(tokens[:, :1], tokens, n_acc, None, None, None, None, history=[(0,)] * 64)
    t = trl.tree_round_law_test(rounds, Pair, "rrs", (1,))
    assert t.dof == 1 and abs(t.pvalue - (1 - 0.9995 ** 64)) < 1e-9
    tokens[:8, 0] = 1  # eight rare blocks: a wrong law, rejected
    assert trl.tree_round_law_test(rounds, Pair, "rrs", (1,)).pvalue < 1e-6
