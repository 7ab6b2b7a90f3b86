"""The benchmark and its baselines: right answers first, then the report's shape (no timings asserted)."""

import functools
import json

import numpy as np
import pytest

import stats
from specsample import bench, cli
from specsample.models.pairs import make_pair
from specsample.laws.reference import numpy_rounds, torch_rounds


def _check_baseline(fn):
    pair = make_pair("dirichlet", 3, 16)
    p, q = (np.asarray(m.table[0], np.float64) for m in (pair.target, pair.draft))
    k, n = 3, 400_000
    accepted, tokens = fn(p, q, k, n, seed=1)
    law = stats.accepted_drafts_law(stats.acceptance_probability(p, q), k)
    assert accepted.sum() == n
    assert stats.goodness_of_fit(accepted, law).pvalue > 1e-4
    # pooled over whole rounds the expected count of x is proportional to p(x) (tokens per round times p)
    assert stats.total_variation(tokens, p).statistic < 0.01


def test_numpy_baseline_is_standard_speculative_sampling():
    _check_baseline(numpy_rounds)


def test_torch_baseline_is_standard_speculative_sampling():
    pytest.importorskip("torch")
    _check_baseline(torch_rounds)


@pytest.mark.parametrize("neural", [False, pytest.param(True, marks=pytest.mark.long)],
                         ids=["table", "with-transformer-pair"])  # the pair compiles two stateful engines: 8 s
def test_bench_reports_rates_and_ratios(neural, tmp_path, capsys, monkeypatch):
    # the report's shape, not the rates: every measurement once and small (the bench itself times each
    # rate as the best of three, on 2^24 uniforms and 2^20 baseline rounds)
    monkeypatch.setattr(bench, "random_rates", functools.partial(bench.random_rates, n=1 << 18, repeat=1))
    monkeypatch.setattr(bench, "bench_point", functools.partial(bench.bench_point, baseline_rounds=1 << 14, repeat=1))
    monkeypatch.setattr(bench, "neural_point", functools.partial(bench.neural_point, repeat=1))
    out = tmp_path / "bench.json"
    argv = ["bench", "--grid", "8:1", "--sequences", "65536", "--neural", "1024" if neural else "0"]
    assert cli.main(argv + ["--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "of ceiling" in printed and "x numpy" in printed
    doc = json.loads(out.read_text())
    # the transformer pair: cached and cache-free rounds/s, next to the table engine at the same V and k
    assert ("transformer pair (V=32" in printed and "recompute" in printed) == neural
    if neural:
        pair = doc["neural"]
        assert pair["vocab"] == 32 and pair["k"] == 4 and pair["layers"] == 2 and pair["width"] == 32
        assert min(pair["cached_rounds_per_s"], pair["recompute_rounds_per_s"], pair["table_rounds_per_s"]) > 0
    (point,) = doc["points"]
    for field in ("rounds_per_s", "ceiling_rounds_per_s", "numpy_rounds_per_s", "torch_rounds_per_s"):
        assert field in point
    assert point["ceiling_rounds_per_s"] == pytest.approx(doc["uniforms_per_s"] / 3)
    # the ceiling is the faster generator; jax.random's own is reported next to it
    rates = doc["generators_uniforms_per_s"]
    assert set(rates) == {"jax.random", "specsample.rng"}
    assert doc["uniforms_per_s"] == max(rates.values())
    assert point["jax_ceiling_rounds_per_s"] == pytest.approx(rates["jax.random"] / 3)
    assert point["rounds"] >= 65536 and point["rounds_per_s"] > 0
    assert (point["torch_rounds_per_s"] is None) == (not bench.torch_available())


def test_bench_grid_errors_are_one_line(capsys):
    assert cli.main(["bench", "--grid", "64"]) == 2
    assert "V:k" in capsys.readouterr().err


def _benchmark(monkeypatch, name: str = "bench_lanes"):
    """A script of benchmarks/ loaded as a module (with its folder on the path, as when it runs as a
    script): bench_lanes, the block-width benchmark the GPU script runs, by default."""
    import importlib.util
    import pathlib

    folder = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("scheme,grid,widths", [
    ("standard", "8:1", "256,512"),
    # rounds over transformers: two engines compiled, seconds each when cold
    pytest.param("cached", "8:1", "64,128", marks=pytest.mark.long),
])
def test_bench_lanes_prints_a_row_per_width(scheme, grid, widths, capsys, monkeypatch):
    # the report's shape, not the rates: one block per width, timed once (a GPU run cannot afford a
    # script that fails on its first call)
    lanes_bench = _benchmark(monkeypatch)
    monkeypatch.setattr(lanes_bench, "rate", functools.partial(lanes_bench.rate, sequences=1, repeat=1))
    lanes_bench.main(["--schemes", scheme, "--grid", grid, "--lanes", widths])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [(scheme, "8", "1", w) for w in widths.split(",")]
    assert float(rows[0][5]) == 1.0 and all(float(r[4]) > 0 for r in rows)


def test_tree_positions_are_what_the_two_networks_score(monkeypatch):
    trees = _benchmark(monkeypatch, "bench_trees")
    # the chain: k - 1 single-token draft extends (the k-th draft is drawn, never fed), k + 1 target rows
    assert trees.scored_positions((1, 1, 1, 1)) == 2 * 4
    # (3, 2, 1, 1): levels of 3, 6, 6, 6 nodes; the draft feeds 3 + 6 + 6, the target scores the root and 21
    assert trees.scored_positions((3, 2, 1, 1)) == 15 + 22
    assert trees.scored_positions((2,)) == 0 + 3


@pytest.mark.long  # a cached and a tree-cached engine compiled: seconds each when cold
def test_bench_trees_prints_a_row_per_branching(capsys, monkeypatch):
    trees = _benchmark(monkeypatch, "bench_trees")
    monkeypatch.setattr(trees, "rate", functools.partial(trees.rate, repeat=1))
    trees.by_branching(((1, 1, 1, 1), (2, 1, 1, 1)), sequences=1)
    rows = [[x.strip() for x in line.split("|")[1:-1]] for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [("cached (chain, KV caches)", "8"), ("tree-cached (1, 1, 1, 1)", "8"),
                                           ("tree-cached (2, 1, 1, 1)", "15")]
    assert rows[0][4:] == ["1", "1"] and all(float(r[2]) > 0 for r in rows)
