"""Every conforming record file audits, and every bad one is refused in one line naming the file, the
column and the first bad row (exit 2 from the command line, never a traceback nor a verdict)."""

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet  # noqa: E402,F401

from specsample.audit import audit, records  # noqa: E402
from specsample.audit.recorder import table  # noqa: E402
from specsample.models.pairs import make_pair  # noqa: E402
from test_host import standard_np  # noqa: E402


def _rounds(b=2000, k=4, vocab=8, seed=0, rows="probs", compact=True, fn=standard_np, request="req"):
    rng = np.random.default_rng(seed)
    pr = make_pair("dirichlet", seed, vocab)
    p_row, q_row = (np.asarray(m.table, np.float64)[0] for m in (pr.target, pr.draft))
    drafts = np.stack([rng.choice(vocab, size=b, p=q_row / q_row.sum()) for _ in range(k)], 1) if k \
        else np.zeros((b, 0), np.int64)
    q = np.broadcast_to(q_row, (b, k, vocab)).copy()
    p = np.broadcast_to(p_row, (b, k + 1, vocab)).copy()
    tokens, n = fn(drafts, q, p, rng) if k else (rng.choice(vocab, size=(b, 1), p=p_row), np.ones(b, np.int64))
    return table(request, np.arange(b), drafts, np.asarray(tokens), np.asarray(n), q, p, rows=rows, compact=compact)


def _write(tmp_path, t, name="r.parquet"):
    path = str(tmp_path / name)
    pa.parquet.write_table(t, path)
    return path


def _replace(t, name, values, typ=None):
    i = t.schema.get_field_index(name)
    arr = pa.array(values, type=typ or t.schema.field(name).type)
    return t.set_column(i, pa.field(name, arr.type), arr).replace_schema_metadata(t.schema.metadata)


def _refused(tmp_path, t, *words):
    from specsample.cli import main

    path = _write(tmp_path, t)
    with pytest.raises(records.RecordError) as e:
        audit(path)
    line = str(e.value)
    assert "\n" not in line and path in line, line
    for w in words:
        assert w in line, line
    assert main(["audit", path, "--no-progress"]) == 2
    return line


def test_k_zero_rounds_with_full_rows_audit(tmp_path):
    # every llama.cpp request starts with a round of no drafts: the bonus alone, under p
    mixed = pa.concat_tables([_rounds(k=0, b=3000, request="first"), _rounds(k=4, b=3000, seed=0)])
    report = audit(_write(tmp_path, mixed))
    assert report.passed, report.table()
    assert {c.name for c in report.cases} == {"records/standard/k0", "records/standard/k4"}


def test_drafts_not_logged_with_full_rows_audit_against_the_rows_acceptance_rate(tmp_path):
    # a correct engine whose rejected drafts were not logged (-1) but whose rows were: acceptance is tested on
    # average (sum min(p, q) from the rows), drafting not at all, and the engine passes
    t = _rounds(b=6000, compact=False)
    drafts = np.array(t.column("drafts").to_pylist())
    n = np.array([len(e) for e in t.column("emitted").to_pylist()])
    drafts[np.arange(drafts.shape[1])[None, :] >= (n - 1)[:, None]] = -1
    report = audit(_write(tmp_path, _replace(t, "drafts", drafts.tolist())))
    assert report.passed, report.table()
    assert "no such rounds" in report.cases[0].test("stage:drafting").detail


@pytest.mark.parametrize("column, bad, words", [
    ("p_rows", "nan", ("column 'p_rows'", "row 5", "finite and non-negative")),
    ("p_rows", "negative", ("column 'p_rows'", "row 5", "finite and non-negative")),
    ("p_rows", "twice", ("column 'p_rows'", "row 5", "sums to 2")),
    ("q_draft", "nan", ("column 'q_draft'", "row 5", "[0, 1]")),
    ("q_cdf_hi", "1.7", ("column 'q_cdf_hi'", "row 5", "1.7")),
    ("q_cdf_lo", "order", ("column 'q_cdf_lo'", "row 5", "exceeds")),
    ("stop_cdf_hi", "1.7", ("column 'stop_cdf_hi'", "row 5", "1.7")),
])
def test_bad_values_are_refused(tmp_path, column, bad, words):
    t = _rounds(b=50, rows="probs" if column == "p_rows" else None)
    vals = t.column(column).to_pylist()
    v = vals[5]
    if column == "p_rows":
        v = [list(r) for r in v]
        if bad == "nan":
            v[0][0] = float("nan")
        elif bad == "negative":
            v[0][0], v[0][1] = -0.1, v[0][1] + 0.1
        else:
            v[0] = [2 * x for x in v[0]]
    elif column == "q_draft":
        v = [float("nan")] + v[1:]
    elif column == "q_cdf_hi":
        v = [1.7] + v[1:]
    elif column == "q_cdf_lo":
        v = [0.99] + v[1:]
        hi = t.column("q_cdf_hi").to_pylist()
        hi[5] = [0.5] + hi[5][1:]
        t = _replace(t, "q_cdf_hi", hi)
    else:
        v = 1.7
    vals[5] = v
    _refused(tmp_path, _replace(t, column, vals), *words)


def test_accept_rate_outside_0_1_is_refused(tmp_path):
    t = _rounds(b=50, rows=None)
    rate = np.full((50, 4), 0.5)
    rate[7, 2] = 1.5
    arr = pa.array(rate.tolist(), pa.list_(pa.float64()))
    t = t.append_column(pa.field("accept_rate", arr.type), arr).replace_schema_metadata(t.schema.metadata)
    _refused(tmp_path, t, "column 'accept_rate'", "row 7", "1.5")


def test_wrong_types_lengths_nulls_and_empty_files_are_refused(tmp_path):
    t = _rounds(b=50, rows=None)
    emitted = [e[0] for e in t.column("emitted").to_pylist()]
    _refused(tmp_path, _replace(t, "emitted", emitted, pa.int32()), "column 'emitted'", "list of integers")
    drafts = t.column("drafts").to_pylist()
    drafts[9] = drafts[9][:3]
    _refused(tmp_path, _replace(t, "drafts", drafts), "column 'drafts'", "row 9", "3 entries where 4")
    ks = t.column("k").to_pylist()
    ks[3] = None
    _refused(tmp_path, _replace(t, "k", ks), "column 'k'", "row 3", "null")
    inner = t.column("q_draft").to_pylist()
    inner[11] = [None] + inner[11][1:]
    _refused(tmp_path, _replace(t, "q_draft", inner), "column 'q_draft'", "row 11", "null")
    _refused(tmp_path, t.slice(0, 0), "no rounds")


def test_a_file_shipped_twice_is_refused_or_deduplicated(tmp_path, capsys):
    from specsample.cli import main

    good = _rounds(b=3000, rows=None)
    pa.parquet.write_table(good, tmp_path / "a.parquet")
    pa.parquet.write_table(good.slice(1000, 500), tmp_path / "b.parquet")  # part of it shipped again
    with pytest.raises(ValueError, match=r"500 rounds recorded more than once; first: .*a.parquet \(request req, "
                                         r"round 1000\) and .*b.parquet \(request req, round 1000\)"):
        audit(str(tmp_path))
    assert main(["audit", str(tmp_path), "--no-progress"]) == 2
    assert "--dedupe" in capsys.readouterr().err
    once = audit(str(tmp_path / "a.parquet"))
    both = audit(str(tmp_path), dedupe=True)
    assert both.engine["audit"]["dropped"] == 500 and both.cases[0].rounds == once.cases[0].rounds == 3000
    assert [t.statistic for t in both.cases[0].tests] == [t.statistic for t in once.cases[0].tests]
    assert main(["audit", str(tmp_path), "--dedupe", "--no-progress"]) == 0
    assert "WARNING: dropped 500 repeated rounds" in capsys.readouterr().out


def test_json_lines_audit_as_parquet_does(tmp_path):
    # any language with a printf can log rounds: a header line, then one object a round; the same rounds
    # audit to the same report as from Parquet (drafts not logged: null, as JSON has no NaN)
    t = _rounds(b=3000, rows=None)
    pq = _write(tmp_path, t, "r.parquet")
    jl = records.write_records(str(tmp_path / "r.jsonl"), t)
    lines = open(jl).read().splitlines()
    assert lines[0] == '{"specsample.record": "2", "specsample.rule": "standard"}' and len(lines) == 3001
    a, b = audit(pq, name="x").to_dict(), audit(jl, name="x").to_dict()
    for d in (a, b):
        d.pop("seconds"), d.pop("engine")
        for c in d["cases"]:
            c.pop("seconds")
    assert a == b
    (tmp_path / "bad.jsonl").write_text('{"round": 0}\n')
    with pytest.raises(records.RecordError, match="bad.jsonl: the first line is no header"):
        audit(str(tmp_path / "bad.jsonl"))


def test_a_c_engine_logging_json_lines_is_audited_both_ways(tmp_path):
    # examples/record_writer.c: a speculative sampler in C that logs its rounds with printf; its broken twin
    # (the bonus from q) fails at the bonus stage. Skipped without a C compiler.
    import os
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    src = os.path.join(os.path.dirname(__file__), "..", "examples", "record_writer.c")
    for flags, name, passes in (([], "ok", True), (["-DBONUS_FROM_Q"], "broken", False)):
        exe = str(tmp_path / name)
        subprocess.run([cc, "-O2", *flags, "-o", exe, src, "-lm"], check=True, capture_output=True, timeout=120)
        out = str(tmp_path / f"{name}.jsonl")
        subprocess.run([exe, "40000", out], check=True, timeout=120)
        report = audit(out)
        assert report.passed is passes, report.table()
        if not passes:
            assert report.broken_stages() == {"bonus": 1}


def test_a_support_violation_names_its_stage_from_its_slot(tmp_path):
    # a rejection resampled from p emits tokens the residual forbids: a hard failure, named as the
    # rejection stage's, with its file, request and round
    from test_audit import residual_from_p_np

    report = audit(_write(tmp_path, _rounds(b=4000, rows=None, fn=residual_from_p_np)))
    assert report.broken_stages() == {"rejection": 1}
    first = report.first_violation()
    assert "(stage: rejection)" in first and "r.parquet: request req round" in first
