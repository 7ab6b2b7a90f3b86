"""specsample.decode: greedy, brute-force MAP and the DP over windows agree where they must."""

import json
from fractions import Fraction

import numpy as np
import pytest

from specsample.battery import suite as battery
from specsample import decode
from specsample.cli import main
from specsample.models.tables import context_free, exact_joint, ngram, random_ngram


def _tied_ngram(rng, vocab, order):
    """Rows drawn from a few dyadic laws: many exact ties and zeros."""
    laws = [np.full(vocab, 1 / vocab)]
    half = np.zeros(vocab)
    half[:2] = 0.5
    laws.append(half)
    q = np.zeros(vocab)
    q[-1], q[0] = 0.75, 0.25
    laws.append(q)
    rows = [rng.permutation(laws[rng.integers(len(laws))]) for _ in range(vocab**order)]
    return ngram(np.array(rows), order)


def _random_models(count):
    rng = np.random.default_rng(2026)
    for i in range(count):
        vocab, order = int(rng.integers(2, 7)), int(rng.integers(0, 4))
        length = int(rng.integers(1, 9))
        while vocab**length > 20_000:
            length -= 1
        kind = i % 3
        if kind == 0:
            model = random_ngram(i, vocab, order, float(rng.choice([0.2, 1.0, 5.0])))
        elif kind == 1:  # zeros: Dirichlet rows with entries cut, then renormalised
            t = rng.dirichlet(np.ones(vocab), size=vocab**order)
            t[rng.random(t.shape) < 0.4] = 0.0
            t[np.arange(t.shape[0]), rng.integers(0, vocab, t.shape[0])] += 0.1
            model = ngram(t / t.sum(1, keepdims=True), order)
        else:
            model = _tied_ngram(rng, vocab, order)
        yield vocab, order, length, model


def test_dp_equals_brute_force_on_hundreds_of_models():
    checked = 0
    for vocab, order, length, model in _random_models(360):
        bf = decode.brute_force_map(model, length)
        dp = decode.dp_map(model, length)
        assert dp.sequence == bf.sequence, (vocab, order, length)
        assert dp.log_prob == bf.log_prob
        assert dp.updates == length * vocab ** (order + 1)
        # a larger window gives the same answer
        if vocab ** (order + 2) <= 4096:
            assert decode.dp_map(model, length, order=order + 1).sequence == bf.sequence
        checked += 1
    assert checked == 360


def test_map_is_the_argmax_of_the_exact_joint():
    for seed in range(20):
        model = random_ngram(seed, 3, 2)
        joint = exact_joint(model, 5)
        best = np.unravel_index(np.argmax(joint), joint.shape)
        assert decode.dp_map(model, 5).sequence == tuple(int(x) for x in best)
        assert np.exp(decode.dp_map(model, 5).log_prob) == pytest.approx(joint.max(), rel=1e-12)


def test_ties_go_to_the_lowest_ids():
    uniform = context_free(np.full(4, 0.25))
    for fn in (decode.greedy, decode.brute_force_map, decode.dp_map):
        assert fn(uniform, 5).sequence == (0, 0, 0, 0, 0)
    # two tied MAP sequences that differ only after the first token: (1, 0) and (1, 1)... and (0, x)
    t = np.array([[0.5, 0.5], [0.5, 0.5]])
    assert decode.dp_map(ngram(t, 1), 3).sequence == (0, 0, 0)


def test_greedy_is_map_for_context_free_models():
    for seed in range(50):
        model = random_ngram(seed, 6, 0, 0.5)
        assert decode.greedy(model, 7) == decode.dp_map(model, 7)[:2]


def test_long_sequences_do_not_underflow():
    model = random_ngram(1, 8, 1)
    res = decode.dp_map(model, 1000)
    assert np.isfinite(res.log_prob) and res.log_prob < -500
    assert res.log_prob >= decode.greedy(model, 1000).log_prob
    assert res.log_prob == decode.sequence_log_prob(model, res.sequence)


def test_context_before_the_first_window():
    model = random_ngram(7, 3, 2)
    for ctx in ([0, 0], [2, 1], [1, 2, 0]):
        bf = decode.brute_force_map(model, 4, context=ctx)
        assert decode.dp_map(model, 4, context=ctx) [:2] == bf
        assert decode.dp_map(model, 4, order=3, context=ctx).sequence == bf.sequence


def test_two_letter_example_greedy_is_not_map():
    model = decode.two_letter_example()
    law = dict(decode.example_law(3))
    assert sum(law.values()) == 1
    # the Fractions are the model's float table, exactly enumerated
    joint = exact_joint(model, 3).ravel()
    assert np.allclose([float(p) for p in law.values()], joint, rtol=0, atol=1e-15)
    assert decode.greedy(model, 3).sequence == (0, 0, 0) and law["AAA"] == Fraction(27, 125)
    assert decode.dp_map(model, 3).sequence == (1, 1, 1) and law["BBB"] == Fraction(323, 1000)
    assert max(law.values()) == law["BBB"]
    assert decode.brute_force_map(model, 3).sequence == (1, 1, 1)


def test_greedy_vs_map_study():
    r = decode.greedy_vs_map(60, vocab=4, order=1, length=6)
    assert r.models == 60 and 0 < r.differ < 60
    assert np.all(r.ratio <= 1 + 1e-12) and np.all(r.ratio > 0)


def test_the_battery_greedy_case_is_not_map():
    """The greedy scheme reproduces greedy decoding, which on this battery case is not MAP."""
    case = next(c for c in battery.default_cases(battery.BUDGETS["quick"], ks=(4,))
                if c.name == "ngram-1-identical/V4/k4")
    target = case.pair(0).target
    g, mp = decode.greedy(target, case.length), decode.dp_map(target, case.length)
    assert g.sequence != mp.sequence and mp.log_prob - g.log_prob > 1.0


@pytest.mark.parametrize("call, match", [
    (lambda: decode.dp_map(random_ngram(0, 3, 2), 4, order=1), "order 2.*m >= 2"),
    (lambda: decode.dp_map(random_ngram(0, 3, 1), 0), "T must be an integer >= 1"),
    (lambda: decode.greedy(random_ngram(0, 3, 1), -2), "T must be an integer >= 1"),
    (lambda: decode.dp_map(random_ngram(0, 40, 1), 10, order=5), r"V\^m = 40\^5 .* GiB"),
    (lambda: decode.brute_force_map(random_ngram(0, 8, 1), 12), "V\\^T = 8\\^12"),
    (lambda: decode.dp_map(random_ngram(0, 3, 1), 3, context=[5]), r"context tokens must lie in \[0, 3\)"),
    (lambda: decode.greedy(np.ones(3), 3), "TableModel or a transformer"),
])
def test_bad_input_errors(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_scaling_fits_run(tmp_path):
    res = decode.scaling(repeats=1, small=True)
    assert set(s["axis"] for s in res.values()) == {"T", "V", "base"}
    assert all(np.isfinite(s["fit"]) for s in res.values())


def test_cli_example(capsys):
    assert main(["decode", "--example"]) == 0
    out = capsys.readouterr().out
    assert "AAA     27/125 = 0.2160  <- greedy" in out and "BBB   323/1000 = 0.3230  <- MAP" in out
    assert "Greedy commits at step 1" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_cli_random_json(tmp_path, capsys):
    path = tmp_path / "d.json"
    assert main(["decode", "--order", "2", "--vocab", "3", "--length", "6", "--seed", "4", "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    dec = res["decoders"]
    assert dec["dp-map"]["sequence"] == dec["brute-force-map"]["sequence"]
    assert dec["dp-map"]["updates"] == 6 * 3**3
    assert "dp-map" in capsys.readouterr().out


def test_cli_bad_decode_input(capsys):
    assert main(["decode", "--length", "0"]) == 2
    assert "--length must be an integer >= 1" in capsys.readouterr().err


def test_transformers_decode_greedily_and_by_brute_force():
    from specsample.models import transformer as tr

    model = tr.Transformer.create(3, vocab=4, width=16, layers=1, heads=1, max_len=8)
    g = decode.greedy(model, 4, context=[2])
    assert g.sequence == tr.generate_cached(model, [2], 4).tokens  # the cache's greedy loop agrees
    bf = decode.brute_force_map(model, 4, context=[2])
    seqs = np.array(list(np.ndindex(4, 4, 4, 4)))
    rows = model.probs_np(np.concatenate([np.full((len(seqs), 1), 2), seqs], axis=1))  # row i follows tokens[:i+1]
    joint = np.prod(rows[np.arange(len(seqs))[:, None], np.arange(4), seqs], axis=1)
    assert joint.sum() == pytest.approx(1.0, abs=1e-5)
    assert bf.sequence == tuple(int(x) for x in np.unravel_index(np.argmax(joint), (4,) * 4))
    assert bf.log_prob >= g.log_prob
    with pytest.raises(TypeError, match="depends on the whole prefix"):
        decode.dp_map(model, 4)
