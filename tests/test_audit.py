"""specsample audit: recorded rounds, verified from what an engine logs (both ways)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("pyarrow")

from specsample.audit import audit, compact_fields, record_sampler, tally  # noqa: E402
from specsample.audit import records  # noqa: E402
from test_host import residual_from_p_np, standard_np  # noqa: E402

ROUNDS = 40_000


def bonus_from_q(drafts, q, p, rng):
    p = p.copy()
    p[:, -1] = q[:, -1]
    return standard_np(drafts, q, p, rng)


class _SharedRows:
    """A generator whose (b, k) uniforms repeat one value along each row: one uniform for all k tests."""

    def __init__(self, rng):
        self.rng = rng

    def random(self, shape):
        if isinstance(shape, tuple) and len(shape) == 2:
            return np.repeat(self.rng.random((shape[0], 1)), shape[1], 1)
        return self.rng.random(shape)


def shared_uniform(drafts, q, p, rng):
    return standard_np(drafts, q, p, _SharedRows(rng))


def exact_match_np(drafts, q, p, rng, *, keep_draft=False):
    """The target samples every slot; a draft is kept while it equals that sample (mlx-lm's rule).
    ``keep_draft``: the broken twin redraws a rejection from all of p, the rejected draft included."""
    b, k = drafts.shape
    cdf = np.cumsum(p, -1)
    y = (rng.random((b, k + 1, 1)) * cdf[..., -1:] > cdf).sum(-1)
    match = y[:, :k] == drafts
    j = np.where(match.all(1), k, np.argmin(match, 1))
    out = np.concatenate([drafts, np.zeros((b, 1), np.int64)], 1)
    rows = np.arange(b)
    stop = y[rows, j]
    if keep_draft:
        redraw = (rng.random(b)[:, None] * cdf[rows, j, -1:] > cdf[rows, j]).sum(-1)
        stop = np.where(j < k, redraw, stop)
    out[rows, j] = stop
    return out, j + 1


def _other_requests(t, prefix: str):
    """The same rounds under other request ids: a second file of distinct rounds (a copy is refused)."""
    import pyarrow as pa

    ids = pa.array([prefix + x for x in t.column("request_id").to_pylist()], pa.string())
    return t.set_column(t.schema.get_field_index("request_id"), t.schema.field("request_id"), ids)


def _record(tmp_path, fn, name="r.parquet", **kw):
    return record_sampler(fn, str(tmp_path / name), rounds=kw.pop("rounds", ROUNDS), **kw)


def test_compact_fields_by_hand():
    q = np.array([[[0.5, 0.25, 0.25], [0.2, 0.2, 0.6]]])
    p = np.array([[[0.1, 0.6, 0.3], [0.3, 0.3, 0.4], [0.2, 0.5, 0.3]]])
    # drafts 1 (accepted: p >= q), 2 (rejected); token 1 emitted at the stop
    f = compact_fields([[1, 2]], [[1, 1, 0]], [2], q, p)
    np.testing.assert_allclose(f["q_draft"], [[0.25, 0.6]])
    np.testing.assert_allclose(f["p_draft"], [[0.6, 0.4]])
    np.testing.assert_allclose(f["q_cdf_lo"], [[0.5, 0.4]])
    # slot 1's residual max(0, p - q) = (0.1, 0.1, 0) -> (0.5, 0.5, 0): token 1 at [0.5, 1.0)
    np.testing.assert_allclose([f["stop_cdf_lo"][0], f["stop_cdf_hi"][0]], [0.5, 1.0])
    # the bonus: all accepted, token 2 from p's row k = 2 -> [0.7, 1.0)
    g = compact_fields([[1, 0]], [[1, 0, 2]], [3], q, p)
    np.testing.assert_allclose([g["stop_cdf_lo"][0], g["stop_cdf_hi"][0]], [0.7, 1.0])
    # logits give the same fields
    h = compact_fields([[1, 2]], [[1, 1, 0]], [2], np.log(q) + 3.0, np.log(p) - 1.0, logits=True)
    for key in f:
        np.testing.assert_allclose(h[key], f[key], atol=1e-12)


def test_torch_fields_match_numpy():
    torch = pytest.importorskip("torch")
    from specsample.audit import compact_fields_torch

    rng = np.random.default_rng(0)
    b, k, v = 64, 3, 11
    ql, pl = rng.normal(size=(b, k, v)), rng.normal(size=(b, k + 1, v))
    drafts = rng.integers(0, v, (b, k))
    n = rng.integers(1, k + 2, b)
    tokens = np.where(np.arange(k + 1)[None] < (n - 1)[:, None], np.pad(drafts, ((0, 0), (0, 1))),
                      rng.integers(0, v, (b, k + 1)))
    for rule in ("standard", "exact-match"):
        ref = compact_fields(drafts, tokens, n, ql, pl, rule=rule, logits=True)
        got = compact_fields_torch(drafts, tokens, n, torch.tensor(ql), torch.tensor(pl), rule=rule)
        for key in ref:
            np.testing.assert_allclose(got[key].cpu().numpy(), ref[key], atol=1e-12, err_msg=f"{rule} {key}")


def test_a_correct_sampler_passes(tmp_path):
    report = audit(_record(tmp_path, standard_np))
    assert report.passed, report.table()
    c = report.cases[0]
    # no token-law claim from binned PITs: the binned claim is in each test's detail, the case says why
    assert c.rounds == ROUNDS and np.isnan(c.min_detectable_tv) and "no token-law claim" in c.min_tv_note
    assert "min detectable TV of the 20-bin PIT law" in c.test("stage:bonus").detail
    assert {t.name for t in c.tests} == {"valid-records", "support", "stage:drafting", "stage:acceptance",
                                          "stage:rejection", "stage:bonus", "stage:drafting[rank]",
                                          "stage:rejection[rank]", "stage:bonus[rank]"}


@pytest.mark.parametrize("fn, stage", [(residual_from_p_np, "rejection"), (bonus_from_q, "bonus"),
                                       (shared_uniform, "acceptance")],
                         ids=["resample-from-p", "bonus-from-q", "shared-uniform"])
def test_broken_twins_fail_at_their_stage(tmp_path, fn, stage):
    report = audit(_record(tmp_path, fn))
    assert not report.passed
    assert list(report.broken_stages()) == [stage], report.diagnosis()
    assert f"Broken stage: {stage}" in " ".join(report.headline().split())


def test_exact_match_rule(tmp_path):
    ok = audit(_record(tmp_path, exact_match_np, "ok.parquet", rule="exact-match"))
    assert ok.passed, ok.table()
    assert ok.cases[0].name == "records/exact-match/k4"

    def broken(drafts, q, p, rng):
        return exact_match_np(drafts, q, p, rng, keep_draft=True)

    # given that it differs from the draft, the redraw has the right law: what gives it away is the
    # rejected draft emitted again, a token of probability 0 under the law at the stop
    bad = audit(_record(tmp_path, broken, "bad.parquet", rule="exact-match"))
    support = bad.cases[0].test("support")
    assert support.rejected and "tokens emitted where their law is 0" in support.detail, bad.table()


def test_accepting_a_forbidden_draft_is_a_hard_failure(tmp_path):
    def le_acceptance(drafts, q, p, rng):  # u <= p / q with u = 0 somewhere: p(x) = 0 accepted
        class Zeros:
            def random(self, shape):
                u = rng.random(shape)
                if isinstance(shape, tuple) and len(shape) == 2:
                    u[::50] = 0.0
                return u

        b, k = drafts.shape
        px = np.take_along_axis(p[:, :k], drafts[..., None], 2)[..., 0]
        qx = np.take_along_axis(q, drafts[..., None], 2)[..., 0]
        u = Zeros().random((b, k))
        ok = u * qx <= px
        j = np.where(ok.all(1), k, np.argmin(ok, 1))
        out, _ = standard_np(drafts, q, p, rng)
        out[:, :k] = np.where(np.arange(k)[None] < j[:, None], drafts, out[:, :k])
        return out, np.minimum(j + 1, k + 1)

    report = audit(_record(tmp_path, le_acceptance, family="zeros-in-p", rounds=8000))
    support = report.cases[0].test("support")
    assert support.rejected and "acceptance decisions of probability 0" in support.detail
    assert "first: " in support.detail and "request pair" in support.detail


def test_full_rows_and_compact_fields_audit_identically(tmp_path):
    full = _record(tmp_path, standard_np, "full.parquet", rows="probs", rounds=8000)
    compact = _record(tmp_path, standard_np, "compact.parquet", rounds=8000)
    a, b = tally(full), tally(compact)
    assert a.keys() == b.keys()
    for key in a:
        for field in ("rounds", "invalid", "draft_zero", "stop_zero", "impossible"):
            assert getattr(a[key], field) == getattr(b[key], field)
        np.testing.assert_array_equal(a[key].accepted, b[key].accepted)
        for stage in a[key].pit:
            np.testing.assert_array_equal(a[key].pit[stage], b[key].pit[stage])


def test_counts_merge_exactly_across_files_batches_and_formats(tmp_path):
    one = _record(tmp_path, standard_np, "one.parquet", rounds=12_000, seed=5)
    whole = tally(one)
    t = records._pa().parquet.read_table(one)
    folder = tmp_path / "parts"
    folder.mkdir()
    records.write_records(str(folder / "a.parquet"), t.slice(0, 5000))
    records.write_records(str(folder / "b.arrow"), t.slice(5000))  # Arrow IPC for the rest
    for parts in (tally(str(folder)), tally(one, batch_size=777)):
        for key in whole:
            assert parts[key].rounds == whole[key].rounds
            np.testing.assert_array_equal(parts[key].accepted, whole[key].accepted)
            for stage in whole[key].pit:
                np.testing.assert_array_equal(parts[key].pit[stage], whole[key].pit[stage])


WRITER = textwrap.dedent('''
    # A writer that follows docs/records.md with pyarrow and numpy alone (no specsample).
    import sys
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = np.load(sys.argv[1])
    drafts, tokens, n, q, p = d["drafts"], d["tokens"], d["n"], d["q"], d["p"]
    b, k = drafts.shape
    rows = np.arange(b)

    def cdf(row, y):  # F(y-) and F(y) in token order
        lo = np.cumsum(row, -1) - row
        return np.take_along_axis(lo, y[..., None], -1)[..., 0], np.take_along_axis(lo + row, y[..., None], -1)[..., 0]

    def rank(row, y):  # the same in the row's probability-rank order (most probable first, ties by id)
        py = np.take_along_axis(row, y[..., None], -1)
        before = (row > py) | ((row == py) & (np.arange(row.shape[-1]) < y[..., None]))
        lo = np.where(before, row, 0.0).sum(-1)
        return lo, lo + py[..., 0]

    stop = n - 1
    res = np.maximum(p[rows, np.minimum(stop, k)] - q[rows, np.minimum(stop, k - 1)], 0)
    res = np.where(res.sum(-1, keepdims=True) > 0, res / np.maximum(res.sum(-1, keepdims=True), 1e-300),
                   p[rows, np.minimum(stop, k)])
    law = np.where((stop < k)[:, None], res, p[rows, np.minimum(stop, k)])
    s_lo, s_hi = cdf(law, tokens[rows, stop])
    q_lo, q_hi = cdf(q, drafts)
    r_lo, r_hi = rank(law, tokens[rows, stop])
    qr_lo, qr_hi = rank(q, drafts)
    lists = lambda a: pa.array([list(map(float, r)) for r in a], pa.list_(pa.float64()))
    t = pa.table({
        "request_id": pa.array([str(r) for r in d["request_id"]], pa.string()),
        "round": pa.array(d["round"].astype(np.int64)),
        "k": pa.array(np.full(b, k, np.int32)),
        "drafts": pa.array([list(map(int, r)) for r in drafts], pa.list_(pa.int32())),
        "emitted": pa.array([list(map(int, tokens[j, :n[j]])) for j in range(b)], pa.list_(pa.int32())),
        "q_draft": lists(np.take_along_axis(q, drafts[..., None], -1)[..., 0]),
        "p_draft": lists(np.take_along_axis(p[:, :k], drafts[..., None], -1)[..., 0]),
        "q_cdf_lo": lists(q_lo), "q_cdf_hi": lists(q_hi),
        "stop_cdf_lo": pa.array(s_lo), "stop_cdf_hi": pa.array(s_hi),
        "q_rank_lo": lists(qr_lo), "q_rank_hi": lists(qr_hi),
        "stop_rank_lo": pa.array(r_lo), "stop_rank_hi": pa.array(r_hi),
    })
    t = t.replace_schema_metadata({"specsample.record": "2", "specsample.rule": "standard"})
    pq.write_table(t, sys.argv[2])
''')


def test_a_file_written_with_pyarrow_alone_audits_identically(tmp_path):
    path = _record(tmp_path, standard_np, "ours.parquet", rows="probs", rounds=6000, seed=2)
    (_, _, batch), = list(records.read_batches(path, batch_size=10 ** 9))
    t = records._pa().parquet.read_table(path)
    q = np.array(t.column("q_rows").to_pylist())
    p = np.array(t.column("p_rows").to_pylist())
    np.savez(tmp_path / "rounds.npz", drafts=batch["drafts"], tokens=np.maximum(batch["tokens"], 0),
             n=batch["n_emitted"], q=q.astype(np.float64), p=p.astype(np.float64),
             request_id=np.array(batch["request_id"].to_pylist()), round=batch["round"])
    (tmp_path / "writer.py").write_text(WRITER)
    theirs = tmp_path / "theirs.parquet"
    out = subprocess.run([sys.executable, str(tmp_path / "writer.py"), str(tmp_path / "rounds.npz"), str(theirs)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    a, b = audit(path, name="r").to_dict(), audit(str(theirs), name="r").to_dict()
    for d in (a, b):
        d.pop("seconds")
        d.pop("engine")
        for c in d["cases"]:
            c.pop("seconds")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_bad_files_get_one_line(tmp_path):
    pa = records._pa()
    plain = tmp_path / "plain.parquet"
    pa.parquet.write_table(pa.table({"x": [1, 2]}), plain)
    with pytest.raises(records.RecordError, match="no 'specsample.record' in the schema's metadata"):
        audit(str(plain))
    t = pa.table({"request_id": ["a"], "round": [0]}).replace_schema_metadata({"specsample.record": "1"})
    pa.parquet.write_table(t, tmp_path / "short.parquet")
    with pytest.raises(records.RecordError, match="missing columns k, drafts, emitted"):
        audit(str(tmp_path / "short.parquet"))
    with pytest.raises(records.RecordError, match="does not exist"):
        audit(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(records.RecordError, match="no record files"):
        audit(str(tmp_path / "empty"))
    (tmp_path / "junk.arrow").write_text("not arrow")
    with pytest.raises(records.RecordError, match="junk.arrow: neither an Arrow IPC file or stream nor Parquet"):
        audit(str(tmp_path / "junk.arrow"))
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(records.RecordError, match="junk.parquet: not a readable Parquet file"):
        audit(str(tmp_path / "junk.parquet"))


def test_command_line(tmp_path, capsys):
    from specsample.cli import main

    good = _record(tmp_path, standard_np, "good.parquet", rounds=8000)
    assert main(["audit", good, "--json", str(tmp_path / "a.json"), "--html", str(tmp_path / "a.html")]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "audited 8,000 rounds" in out
    assert json.loads((tmp_path / "a.json").read_text())["verdict"] == "pass"
    assert '<header class="pass"' in (tmp_path / "a.html").read_text()
    bad = _record(tmp_path, bonus_from_q, "bad.parquet", rounds=20_000)
    assert main(["audit", bad, "--html", str(tmp_path / "b.html")]) == 1
    assert "Broken stage: bonus" in " ".join(capsys.readouterr().out.split())
    assert main(["audit", str(tmp_path / "missing.parquet")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_verify_and_audit_take_the_same_report_options(tmp_path, capsys):
    # one meaning each: what a script passes to verify it can pass to audit (--no-progress included)
    from specsample.cli import SHARED_REPORT_OPTIONS, _parser

    subs = _parser()._subparsers._group_actions[0].choices
    for command in ("verify", "audit"):
        flags = {o: a for a in subs[command]._actions for o in a.option_strings}
        assert set(SHARED_REPORT_OPTIONS) <= set(flags), command
    for o in SHARED_REPORT_OPTIONS:
        assert subs["verify"]._option_string_actions[o].help == subs["audit"]._option_string_actions[o].help
    from specsample.cli import main

    good = _record(tmp_path, standard_np, "good.parquet", rounds=2000)
    assert main(["audit", good, "--no-progress", "--seed", "3", "--alpha", "0.05"]) == 0
    seen = []
    audit(good, progress=lambda *a: seen.append(a))
    assert seen == [("audit good.parquet", 1, 1)]


def test_no_pyarrow_says_how_to_install(monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **kw):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(records.RecordError, match=r"pip install -e \".\[audit\]\""):
        records._pa()
    assert os.environ is not None


def test_workers_give_the_serial_counts(tmp_path):
    from specsample.audit import records as rec

    path = _record(tmp_path, standard_np, "w.parquet", rounds=20_000, seed=9)
    rec.write_records(str(tmp_path / "w2.parquet"), _other_requests(rec._pa().parquet.read_table(path), "b"))
    old, rec.ROW_GROUP = rec.ROW_GROUP, 3000
    try:  # several row groups, so that one file is shared out too
        rec.write_records(str(tmp_path / "w3.parquet"), _other_requests(rec._pa().parquet.read_table(path), "c"))
    finally:
        rec.ROW_GROUP = old
    serial, parallel = tally(str(tmp_path)), tally(str(tmp_path), workers=2)
    for key in serial:
        for field in ("rounds", "tested", "accepted", "mean", "var"):
            np.testing.assert_array_equal(getattr(parallel[key], field), getattr(serial[key], field))
        for stage in serial[key].pit:
            np.testing.assert_array_equal(parallel[key].pit[stage], serial[key].pit[stage])


def test_workers_start_at_most_one_process_per_two_cores(tmp_path, monkeypatch, capsys):
    # a serial audit keeps two cores busy (its reader thread decodes while it counts): on two cores a second
    # process only shares them, so --workers 2 counts in one and says so; with cores to spare it starts them
    from specsample.audit import counting
    from specsample.cli import main

    path = _record(tmp_path, standard_np, "w.parquet", rounds=3000, seed=9)
    asked = []
    real = counting._tally_parallel
    monkeypatch.setattr(counting, "_tally_parallel", lambda *a, **kw: asked.append(a[3]) or real(*a, **kw))
    monkeypatch.setattr(counting, "cores", lambda: 2)
    assert [counting.processes(w) for w in (1, 2, 8)] == [1, 1, 1]
    report = audit(path, workers=2)
    assert asked == [] and report.engine["audit"]["workers"] == 1 and report.engine["audit"]["workers_asked"] == 2
    assert main(["audit", path, "--workers", "2", "--no-progress"]) == 0
    assert "NOTE: --workers 2 on 2 cores: counted in 1 process" in capsys.readouterr().out
    monkeypatch.setattr(counting, "cores", lambda: 8)
    assert [counting.processes(w) for w in (1, 2, 8)] == [1, 2, 4]
    assert audit(path, workers=2).engine["audit"]["workers"] == 2 and asked == [2]
    assert main(["audit", path, "--workers", "2", "--no-progress"]) == 0
    assert "NOTE" not in capsys.readouterr().out


@pytest.mark.parametrize("fn, stage", [("standard_np", None), ("residual_from_p_np", "rejection")])
def test_verify_records_what_audit_then_verifies(tmp_path, capsys, fn, stage):
    """verify --sampler ... --record DIR keeps the battery's random rounds (not the boundary or edge
    passes' forced ones); auditing them gives the same verdict and names the same stage."""
    from specsample.cli import main

    folder = tmp_path / "rec"
    sampler = f"{os.path.dirname(__file__)}/test_host.py:{fn}"
    code = main(["verify", "--sampler", sampler, "--budget", "4000", "--k", "4", "--cases",
                 "dirichlet/V8/k4,ngram-2/V4/k4", "--no-progress", "--record", str(folder)])
    out = capsys.readouterr().out
    assert code == (0 if stage is None else 1)
    assert f"specsample audit {folder}" in out and list(folder.glob("*.parquet"))
    report = audit(str(folder))
    assert report.passed == (stage is None), report.table()
    assert {c.name for c in report.cases} == {"records/standard/k4"}
    ids = set(records._pa().parquet.read_table(str(folder)).column("request_id").to_pylist())
    assert not any("boundary" in i or "edge" in i or "intercept" in i for i in ids), ids
    if stage:
        assert stage in report.broken_stages()


def test_record_is_refused_where_it_cannot_record(tmp_path, capsys):
    from specsample.cli import main

    assert main(["verify", "--record", str(tmp_path / "r")]) == 2
    assert "--record writes the rounds of a host sampler" in capsys.readouterr().err
    sampler = f"{os.path.dirname(__file__)}/test_host.py:standard_np"
    assert main(["verify", "--sampler", sampler, "--rule", "none", "--record", str(tmp_path / "r")]) == 2
    assert "--rule none claims no rule" in capsys.readouterr().err
    assert main(["verify", "--sampler", sampler, "--tree", "2,1", "--record", str(tmp_path / "r")]) == 2
    assert "tree rounds have no record format yet" in capsys.readouterr().err


def test_a_local_dask_cluster_gives_the_serial_counts(tmp_path):
    pytest.importorskip("distributed")
    from specsample.audit import records as rec
    from specsample.audit.fleet import tally_dask

    old, rec.ROW_GROUP = rec.ROW_GROUP, 2500
    try:
        path = _record(tmp_path, standard_np, "d.parquet", rounds=10_000, seed=4)
        _record(tmp_path, shared_uniform, "e.parquet", rounds=5_000, seed=6, request_prefix="e-")
    finally:
        rec.ROW_GROUP = old
    serial, cluster = tally(str(tmp_path)), tally_dask(str(tmp_path), "local", workers=2)
    assert serial.keys() == cluster.keys() and path
    for key in serial:
        for field in ("rounds", "tested", "accepted", "mean", "var"):
            np.testing.assert_array_equal(getattr(cluster[key], field), getattr(serial[key], field))
        for stage in serial[key].pit:
            np.testing.assert_array_equal(cluster[key].pit[stage], serial[key].pit[stage])


def test_token_ids_outside_the_vocabulary_fail_the_support_check():
    q = np.full((1, 1, 3), 1 / 3)
    p = np.full((1, 2, 3), 1 / 3)
    f = compact_fields([[1]], [[1, 7]], [2], q, p)  # a bonus token id 7 with V = 3
    assert f["stop_cdf_lo"][0] == f["stop_cdf_hi"][0] == 0.0
    g = compact_fields([[5]], [[0, 0]], [1], q, p)  # a draft id 5
    assert g["q_draft"][0, 0] == 0.0 and g["p_draft"][0, 0] == 0.0


def _verify_recorded(tmp_path, fn, **kw):
    """Run verify_host on ``fn`` while a RecordSink keeps its random rounds; audit what it kept."""
    from specsample import host
    from specsample.audit.recorder import RecordSink
    from specsample.host.observe import observe

    sink = RecordSink(str(tmp_path / "rec"))
    with observe(sink):
        verified = host.verify_host(fn, seed=3, **kw)
    sink.close()
    return verified, audit(str(tmp_path / "rec"))


def test_ragged_rounds_are_recorded_one_draft_count_at_a_time(tmp_path):
    """A flat-layout sampler's requests carry 0..k drafts: each round is recorded with its own k (k = 0:
    the bonus alone), and an indexing bug that shows only when counts differ fails the audit too."""
    from test_serving import FLAT, flat_np, flat_np_equal_counts_bug

    kw = dict(budget=3000, k=4, cases="dirichlet/V8/k4,zeros-in-p/V8/k4", **FLAT)
    verified, report = _verify_recorded(tmp_path / "ok", flat_np, **kw)
    assert verified.passed and report.passed, report.table()
    assert {c.name for c in report.cases} == {f"records/standard/k{k}" for k in range(5)}
    k0 = next(c for c in report.cases if c.k == 0)
    assert k0.rounds > 1000 and next(s for s in k0.stages if s.stage == "bonus").n == k0.rounds
    verified, report = _verify_recorded(tmp_path / "bad", flat_np_equal_counts_bug, **kw)
    assert not verified.passed and not report.passed


def test_self_drafting_rounds_are_recorded_with_the_models_rows(tmp_path):
    """A self-drafting sampler's rounds carry the draft and target models' rows at its own drafts, so
    drafting is audited too: drafts drawn from a stale row fail there."""
    from test_host import self_drafting_np

    def stale(c, d, t, rng):
        return self_drafting_np(c, d, t, rng, stale_rows=True)

    kw = dict(drafts="self", budget=4000, k=4, cases="ngram-2/V4/k4")
    verified, report = _verify_recorded(tmp_path / "ok", self_drafting_np, **kw)
    assert verified.passed and report.passed, report.table()
    assert [c.name for c in report.cases] == ["records/standard/k4"] and report.cases[0].rounds > 4000
    verified, report = _verify_recorded(tmp_path / "bad", stale, **kw)
    assert not verified.passed and "drafting" in report.broken_stages(), report.table()


def test_verify_records_a_self_drafting_sampler_from_the_command_line(tmp_path, capsys):
    from specsample.cli import main

    folder = tmp_path / "rec"
    sampler = f"{os.path.dirname(__file__)}/test_host.py:self_drafting_np"
    assert main(["verify", "--sampler", sampler, "--self-drafting", "--budget", "2000", "--k", "4", "--cases",
                 "ngram-2/V4/k4", "--no-progress", "--record", str(folder)]) == 0
    assert f"specsample audit {folder}" in capsys.readouterr().out
    assert audit(str(folder)).passed
