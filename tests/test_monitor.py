"""specsample audit --follow: the anytime-valid monitor of a live engine's record files, both ways.

A simulated engine writes record files into a folder while the monitor follows it: a correct engine
raises no alarm over a long stream, and a bug switched on mid-stream is caught within a stated number
of rounds of the switch, its stage and its first file named."""

import json
import os
import re
import threading
import time

import numpy as np
import pytest

pytest.importorskip("pyarrow")

from specsample.audit import monitor as mon  # noqa: E402
from specsample.audit.recorder import table  # noqa: E402
from specsample.audit.records import write_records  # noqa: E402
from specsample.models.pairs import make_pair  # noqa: E402
from test_audit import bonus_from_q  # noqa: E402
from test_host import residual_from_p_np, standard_np  # noqa: E402

PER_FILE = 4_000


def bonus_from_the_wrong_row(drafts, q, p, rng):
    """The bonus drawn from the target's row one position too early (row k - 1, not k)."""
    shifted = p.copy()
    shifted[:, -1] = p[:, -2]
    return standard_np(drafts, q, shifted, rng)


def engine_file(folder, index, fn, rounds=PER_FILE, k=4, vocab=8, pairs=4, family="dirichlet", name=None):
    """One rotated log file of a simulated engine: ``rounds`` rounds of ``fn`` over ``pairs`` requests, each
    request id new to this file (an engine's requests do not repeat), written under a hidden name and
    renamed when whole, as a writer should. Each draft position has rows of its own, as a language
    model's do (the pairs of ``family``, one a position), so a row taken from the wrong position shows."""
    rng = np.random.default_rng([7, index])
    per = rounds // pairs
    tables = []
    for i in range(pairs):
        prs = [make_pair(family, 100 * i + j, vocab) for j in range(k + 1)]
        p_rows = np.stack([np.asarray(pr.target.table, np.float64)[0] for pr in prs])
        q_rows = np.stack([np.asarray(pr.draft.table, np.float64)[0] for pr in prs[:k]])
        drafts = np.stack([rng.choice(vocab, size=per, p=q_rows[j] / q_rows[j].sum()) for j in range(k)], 1)
        q = np.broadcast_to(q_rows, (per, k, vocab)).copy()
        p = np.broadcast_to(p_rows, (per, k + 1, vocab)).copy()
        tokens, n = fn(drafts, q, p, rng)
        tables.append(table(f"file{index}-req{i}", np.arange(per), drafts, np.asarray(tokens), np.asarray(n), q, p))
    name = name or f"rounds-{index:05d}.parquet"
    final, hidden = os.path.join(folder, name), os.path.join(folder, "." + name)  # hidden names are not read
    write_records(hidden, tables)
    os.replace(hidden, final)
    return final


def test_a_correct_engine_raises_no_alarm_over_a_long_stream(tmp_path):
    m = mon.Monitor(alpha=0.01)
    for i in range(40):  # 160,000 rounds, the e-processes read after each file
        assert m.add_file(engine_file(tmp_path, i, standard_np)) is None, m.alarm
    r = m.report()
    assert r.passed and r.multiplicity.startswith("anytime-valid")
    assert all(t.pvalue > 0.01 for c in r.cases for t in c.tests if not t.hard)
    assert "e-process over" in r.case("records/standard/k4").test("stage:bonus").detail


@pytest.mark.parametrize("bug, stage, within", [
    (bonus_from_q, "bonus", 12_000),  # statistical alarms: 1,000-2,000 rounds over eight seeds (files of 1,000)
    (bonus_from_the_wrong_row, "bonus", 12_000),
    (residual_from_p_np, "rejection", PER_FILE),  # a token the residual forbids: a hard alarm at once
])
def test_a_bug_switched_on_mid_stream_alarms_within_its_bound_naming_stage_and_file(tmp_path, bug, stage, within):
    m = mon.Monitor(alpha=0.01)
    for i in range(10):
        assert m.add_file(engine_file(tmp_path, i, standard_np)) is None
    switch = m.rounds
    first_bad = None
    for i in range(10, 10 + within // PER_FILE + 1):
        path = engine_file(tmp_path, i, bug)
        first_bad = first_bad or path
        if m.add_file(path):
            break
    assert m.alarm, f"no alarm within {within:,} rounds of the switch"
    assert m.rounds - switch <= within + PER_FILE
    assert f"stage: {stage}" in m.alarm or f"stage:{stage}" in m.alarm, m.alarm
    # the file named is after the switch: the first one for a hard alarm, the one where a statistical
    # alarm's evidence crossed its line (the first or the next, here)
    named = int(re.search(r"rounds-(\d+)\.parquet", m.alarm).group(1))
    assert named >= 10 and (stage == "bonus" or f"rounds-{named:05d}" == os.path.basename(first_bad)[:12]), m.alarm
    r = m.report()
    assert not r.passed
    if stage == "bonus" and bug is bonus_from_q:  # a statistical alarm names the stage in the report too
        assert r.broken_stages() == {"bonus": 1}, r.headline()
        assert "first decisive evidence at" in m.alarm and "request file1" in m.alarm


def test_a_file_being_written_is_not_read_half_way(tmp_path):
    folder = mon.Folder(str(tmp_path), settle=0.0)
    whole = engine_file(tmp_path, 0, standard_np, rounds=400)
    data = open(whole, "rb").read()
    half = tmp_path / "rounds-00001.parquet"
    half.write_bytes(data[: len(data) // 2])  # a writer still at work: no closing PAR1 yet
    (tmp_path / ".hidden.parquet").write_bytes(data)
    (tmp_path / "x.parquet.partial").write_bytes(data)
    assert folder.ready() == [whole]
    assert folder.ready() == []  # each file once
    half.write_bytes(data)
    assert folder.ready() == [str(half)]
    arrow = engine_file(tmp_path, 2, standard_np, rounds=400, name="r.arrow")
    assert mon.complete(arrow) and folder.ready() == [arrow]


def test_a_settling_file_waits_until_it_stops_changing(tmp_path):
    now = [0.0]
    folder = mon.Folder(str(tmp_path), settle=2.0, clock=lambda: now[0])
    path = engine_file(tmp_path, 0, standard_np, rounds=400)
    assert folder.ready() == []
    now[0] = 1.0
    assert folder.ready() == []
    now[0] = 2.5
    assert folder.ready() == [path]


def test_follow_watches_a_folder_that_an_engine_writes_into(tmp_path):
    # the engine in a thread, the monitor polling: a correct stream, then the bug; the alarm comes after the
    # switch, and a correct engine's monitor leaves after --idle-exit
    stop = threading.Event()

    def engine(fn_of):
        for i in range(60):
            if stop.is_set():
                return
            engine_file(tmp_path, i, fn_of(i))
            time.sleep(0.01)

    writer = threading.Thread(target=engine, args=(lambda i: standard_np if i < 5 else bonus_from_q,))
    lines = []
    writer.start()
    try:
        m = mon.follow(str(tmp_path), poll=0.02, settle=0.0, idle_exit=20, status=lines.append)
    finally:
        stop.set()
        writer.join()
    assert m.alarm and "stage:bonus" in m.alarm and m.files > 5, (m.alarm, m.files)
    assert lines and "files" in lines[0] and "rounds" in lines[0]


def test_the_command_follows_exits_on_idle_and_writes_its_report(tmp_path, capsys):
    from specsample.cli import main

    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(3):
        engine_file(logs, i, standard_np)
    out = tmp_path / "live.json"
    code = main(["audit", "--follow", str(logs), "--idle-exit", "0.5", "--poll", "0.05", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "following" in text and "no deviation established over 3 files, 12,000 rounds" in text
    assert "anytime-valid" in " ".join(text.split())
    report = json.loads(out.read_text())
    assert report["verdict"] == "pass" and report["budget"] == "follow"
    engine_file(logs, 3, bonus_from_q, rounds=40_000)
    assert main(["audit", "--follow", str(logs), "--idle-exit", "0.5", "--poll", "0.05"]) == 1
    text = " ".join(capsys.readouterr().out.split())
    assert "ALARM: records/standard/k4: stage:bonus" in text and "Broken stage: bonus" in text
    assert main(["audit", "--follow", str(tmp_path / "nowhere")]) == 2
    assert main(["audit", "--idle-exit", "3", str(logs)]) == 2
    assert main(["audit"]) == 2
    assert "--follow DIR" in capsys.readouterr().err


def test_ctrl_c_exits_130_and_writes_the_report(tmp_path):
    import signal
    import subprocess
    import sys

    engine_file(tmp_path, 0, standard_np)
    out = tmp_path / "at-exit.json"
    proc = subprocess.Popen([sys.executable, "-m", "specsample", "audit", "--follow", str(tmp_path), "--poll", "0.05",
                             "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # "following ...": the command is watching
        assert line.startswith("following"), line + proc.stderr.read()
        deadline = time.monotonic() + 60
        while "1 files" not in line and time.monotonic() < deadline:  # its status line for the file
            line = proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        proc.kill()
    report = json.loads(out.read_text())
    assert report["verdict"] == "pass" and report["engine"]["audit"]["files"] == 1
