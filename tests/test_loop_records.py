"""verify --generate ... --record: the rounds a whole loop reveals through its provenance, audited (both ways).

The loop is ``examples/numpy_loop.py``: a numpy speculative loop over two bigram tables with k = 3,
batched, returning (tokens, from_draft); its twins break one stage each (one uniform shared by the
round's acceptance tests; the bonus drawn from the draft's row).
"""

import os

import numpy as np
import pytest

pytest.importorskip("pyarrow")

from specsample.audit import audit  # noqa: E402
from specsample.audit.loop_rounds import LoopRecordError, loop_rounds  # noqa: E402
from specsample.audit.recorder import RecordSink  # noqa: E402
from specsample.host.observe import observe  # noqa: E402
from specsample.loops.verify import verify_generate  # noqa: E402
from specsample.schemes import _load_object  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "numpy_loop.py")
loop, shared_uniform, bonus_from_q, next_token, draft_next_token = (
    _load_object(f"{EXAMPLE}:{name}") for name in ("loop", "shared_uniform", "bonus_from_q", "next_token",
                                                    "draft_next_token"))
K, V, PROMPT = 3, 6, [1]


def _recorded(folder, generate, sequences=4000):
    sink = RecordSink(str(folder), loop_k=K)
    with observe(sink):
        verified = verify_generate(next_token, generate, PROMPT, length=12, sequences=sequences, batch=500,
                                   draft_next_token=draft_next_token, batch_pass=False, seed=2)
    sink.close()
    return verified, audit(str(folder))


def test_the_rounds_a_loop_reveals_by_hand():
    # one sequence, k = 2: rounds [a, a, bonus], [rejection], [a, rejection], [a, ...] (the last does not fit)
    seqs = np.array([[3, 4, 5, 0, 1, 2, 3]])
    flags = np.array([[True, True, False, False, True, False, True]])
    rows = lambda toks: np.full(np.shape(toks) + (V,), 1.0 / V)  # noqa: E731
    f = loop_rounds([1], seqs, flags, rows, rows, k=2)
    np.testing.assert_array_equal(f["round"], [0, 1, 2])  # round 3 starts at 6: 6 + k + 1 > 7 tokens
    np.testing.assert_array_equal(f["n_emitted"], [3, 1, 2])
    np.testing.assert_array_equal(f["drafts"], [[3, 4], [-1, -1], [1, -1]])
    np.testing.assert_array_equal(f["tokens"][:, 0], [3, 0, 1])
    assert np.isnan(f["q_draft"][1]).all() and f["q_draft"][0, 0] == pytest.approx(1 / V)
    np.testing.assert_allclose(f["accept_rate"][0], [1.0, 1.0])  # p = q: sum min(p, q) = 1
    assert np.isnan(f["accept_rate"][1, 1])  # slot 1 of a round that stopped at slot 0 was not reached
    with pytest.raises(LoopRecordError, match="accepted 3 drafts in a row from position 0, more than k = 2"):
        loop_rounds([1], np.zeros((1, 6), int), np.array([[1, 1, 1, 0, 0, 0]], bool), rows, rows, k=2)


def test_a_correct_loops_rounds_pass_the_audit(tmp_path):
    verified, report = _recorded(tmp_path, loop)
    assert verified.passed and report.passed, report.table()
    (case,) = report.cases
    assert case.name == f"records/standard/k{K}" and case.rounds > 10_000
    n = {s.stage: s.n for s in case.stages}
    assert n["drafting"] == 0 and n["acceptance"] > 10_000 and n["rejection"] > 3000 and n["bonus"] > 2000, n


@pytest.mark.parametrize("twin, stage", [(shared_uniform, "acceptance"), (bonus_from_q, "bonus")])
def test_a_broken_loops_rounds_fail_at_its_stage(tmp_path, twin, stage):
    _, report = _recorded(tmp_path, twin)
    assert not report.passed and stage in report.broken_stages(), report.table()


def test_recording_a_loop_from_the_command_line(tmp_path, capsys):
    from specsample.cli import main

    args = ["verify", "--generate", f"{EXAMPLE}:loop", "--next-token", f"{EXAMPLE}:next_token", "--draft-next-token",
            f"{EXAMPLE}:draft_next_token", "--prompt", "1", "--length", "12", "--sequences", "2000", "--batch", "500",
            "--no-progress", "--record", str(tmp_path / "rec")]
    assert main(args) == 2
    assert "needs the loop's draft length: --k K" in capsys.readouterr().err
    assert main(args + ["--k", str(K)]) == 0
    assert f"specsample audit {tmp_path / 'rec'}" in capsys.readouterr().out
    assert audit(str(tmp_path / "rec")).passed
    assert main(args[:5] + args[7:] + ["--k", str(K)]) == 2  # no --draft-next-token: no provenance
    assert "give --draft-next-token" in capsys.readouterr().err
