"""A provenance run sized from a stated acceptance offset (issue 31, item 7), both ways.

``examples/numpy_loop.py``'s ``stale_draft`` drafts from rows other than the draft's own: its output
law is exactly the target's and its acceptance at round starts moves by +0.012 to +0.044. Sized for
an offset of 0.02, the run finds it; the correct loop, sized the same way, passes.
"""

import os
import re

import pytest

from specsample.loops.verify import verify_generate
from specsample.schemes import _load_object

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "numpy_loop.py")


def _run(name, offset=0.02):
    load = lambda n: _load_object(f"{EXAMPLE}:{n}")  # noqa: E731
    return verify_generate(load("next_token"), load(name), [1], length=12, batch=500, offset=offset, budget=500,
                           draft_next_token=load("draft_next_token"), batch_pass=False, seed=4)


@pytest.mark.parametrize("name, passes", [("loop", True), ("stale_draft", False)])
def test_a_run_sized_for_an_offset_finds_it(name, passes):
    report = _run(name)
    size = report.engine["end_to_end"]["size"]
    assert "sized for an acceptance offset of 0.02" in size, size
    acceptance = report.cases[0].test("acceptance-at-round-starts")
    stated = float(re.search(r"min detectable offset of the acceptance rate ([0-9.e-]+)", acceptance.detail).group(1))
    assert 0.016 <= stated <= 0.022, acceptance.detail  # the pilot's estimate holds on the run (10% slack)
    assert "the output tests alone: 500 sequences" in size, size  # the offset, not the output tests, sized it
    assert report.passed == passes and acceptance.rejected != passes, report.table()
    if not passes:  # only acceptance moved: the output law is exact
        assert all(not t.rejected for t in report.cases[0].tests if t is not acceptance)


def test_an_offset_needs_provenance_and_no_fixed_size():
    load = lambda n: _load_object(f"{EXAMPLE}:{n}")  # noqa: E731
    with pytest.raises(ValueError, match="give draft_next_token"):
        verify_generate(load("next_token"), load("loop"), [1], length=4, batch=100, offset=0.02)
    with pytest.raises(ValueError, match="not both"):
        verify_generate(load("next_token"), load("loop"), [1], length=4, batch=100, offset=0.02, sequences=100,
                        draft_next_token=load("draft_next_token"))
