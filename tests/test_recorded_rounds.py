"""A stateful run records its first block's rounds (Counts.record); a transformer case's stage tests read them."""

import numpy as np
import pytest

from specsample.battery import recorded_rounds
from specsample.battery.cases import BUDGETS, default_cases
from specsample.engine import lanes as engine
from specsample.engine.cells import record_fields
from specsample.schemes import make_scheme

CASES = {c.name: c for c in default_cases(BUDGETS["quick"], (4,))}
BLOCK = 64 * 16  # the battery's transformer block: lanes x sequences a lane


def _run(name: str, case: str, sequences: int = BLOCK, **kw):
    c = CASES[case]
    pair, scheme = c.pair(0), make_scheme(name, c.k)
    counts = engine.run(scheme, pair.target, pair.draft, sequences=sequences, length=c.length, seed=1, lanes=64,
                        per_lane=16, prompt=pair.prompt, **kw)
    return scheme, pair, counts


def test_the_record_is_every_round_of_the_first_block_whatever_the_chunk():
    _, _, one = _run("cached", "transformer-far/V8/k4")
    _, _, three = _run("cached", "transformer-far/V8/k4", 3 * BLOCK, blocks_per_call=1)  # three chunks
    fields = record_fields(4, 5)
    assert one.record.shape[1:] == (16 * CASES["transformer-far/V8/k4"].length, len(fields), 64)
    active = one.record[0][:, fields.index("active")] == 1
    assert active.sum() == one.rounds[0]  # a one-block run: all its rounds
    assert three.rounds[0] > one.rounds[0]
    np.testing.assert_array_equal(three.record, one.record)  # later blocks and chunks add nothing


def test_the_replayed_sequences_are_the_ones_the_engine_counted():
    """Each recorded round's history is rebuilt from the rounds before it: the sequences those histories
    complete are, token for token, the ones whose counts the run returned."""
    case = CASES["transformer-close/V8/k4"]
    scheme, pair, counts = _run("cached", case.name)
    r = recorded_rounds.replay(scheme, pair, counts.record[0], case.length)
    assert r.windows.shape == (BLOCK, case.length)
    position = np.stack([np.bincount(r.windows[:, t], minlength=case.vocab) for t in range(case.length)])
    np.testing.assert_array_equal(position, counts.position[0])
    # a round's history is the prompt, then what its sequence emitted: the first round of each starts at the prompt
    plen = len(pair.prompt)
    first = r.starts == plen - 1
    assert first.sum() == BLOCK and (r.seqs[first, :plen] == np.asarray(pair.prompt)).all()
    # the last round of a sequence is its own last round, and no round comes after it
    assert (r.last_of >= np.arange(len(r.last_of))).all() and (r.last_of[r.last_of] == r.last_of).all()


@pytest.mark.parametrize("scheme, case, expect", [
    ("cached", "transformer-close/V8/k4", set()),
    ("control:last-token-not-in-draft-cache", "transformer-close/V8/k4", {"drafting", "acceptance", "rejection"}),
    # after a full acceptance: a window of 2k + 3 tokens holds the rounds after it
    ("control:bonus-not-in-target-cache", "transformer-close/V2/k4", {"acceptance", "rejection"}),
    ("cached", "transformer-close/V2/k4", set()),
])
def test_recorded_rounds_are_diagnosed_from_teacher_forced_rows(scheme, case, expect):
    s, pair, counts = _run(scheme, case)
    _, res = recorded_rounds.recorded_stage_tests(s, pair, counts.record[0], CASES[case].length, 0)
    assert {r.stage for r in res} == {"drafting", "acceptance", "rejection", "bonus"}
    assert {r.stage for r in res if r.pvalue < 1e-4} == expect


def test_a_run_of_wide_blocks_records_the_first_64_lanes_of_its_first_block():
    """What a battery's 64-lane block records, a wider block records for its first 64 lanes: the record's
    size does not grow with the block."""
    c = CASES["transformer-far/V8/k4"]
    pair, scheme = c.pair(0), make_scheme("cached", c.k)
    wide = engine.run(scheme, pair.target, pair.draft, sequences=4 * BLOCK, length=c.length, seed=1, lanes=256,
                      per_lane=4, prompt=pair.prompt)
    assert wide.record.shape[1:] == (4 * c.length, len(record_fields(c.k, c.k + 1)), 64)
    r = recorded_rounds.replay(scheme, pair, wide.record[0], c.length)
    assert len(r.windows) == 64 * 4  # the 64 lanes' sequences, each complete


def test_a_record_of_other_shapes_is_refused_in_one_line():
    scheme, pair, counts = _run("cached", "transformer-far/V8/k4")
    with pytest.raises(ValueError, match=r"a record of k = 4, 5 tokens a round is \[rounds, 12, lanes\]"):
        recorded_rounds.replay(scheme, pair, counts.record[0][:, :5], 5)


def test_verify_s_stage_tests_are_those_of_the_rounds_its_run_recorded():
    """The battery tests a transformer case's recorded rounds in a thread beside the next case's run: the
    same tests as the run's record tested alone afterwards."""
    import specsample
    from specsample.battery.cases import NEURAL_BLOCK, _case_seed

    c = CASES["transformer-far/V8/k4"]
    report = specsample.verify("cached", budget=2048, cases=c.name, seed=3, k=4)
    pair, scheme = c.pair(3), make_scheme("cached", 4)
    counts = engine.run(scheme, pair.target, pair.draft, sequences=2048, length=c.length, seed=_case_seed(3, c.name),
                        lanes=NEURAL_BLOCK[0], per_lane=NEURAL_BLOCK[1], prompt=pair.prompt)
    alone, _ = recorded_rounds.recorded_stage_tests(scheme, pair, counts.record[0], c.length, _case_seed(3, c.name))
    got = [t for t in report.cases[0].tests if t.name.startswith("stage:")]
    assert len(got) == 4 and [(t.name, t.statistic, t.pvalue) for t in got] == [
        (t.name, t.statistic, t.pvalue) for t in alone]
