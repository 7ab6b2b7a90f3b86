"""specsample.heap: the command's processes reuse freed memory for large numpy temporaries."""

import subprocess
import sys
import textwrap

import pytest

from specsample import heap

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")

# 20 arrays of 64 MiB made and freed in turn; prints the minor page faults they cost
_FAULTS = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from specsample import heap
    heap._numpy_hugepages_off()  # ordinary pages on both sides: a huge page would hide the faults
    if sys.argv[1] == "keep":
        heap._keep_malloc()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(20):
        a = np.full(1 << 23, float(i))
        del a
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@linux
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    """Both sides: with glibc's defaults every 64 MiB temporary is mapped anew and faulted in page by page
    (about 16,000 faults each); kept, the first one's pages serve the other nineteen."""
    default, kept = _faults("default"), _faults("keep")
    assert default > 20 * 10_000, default
    assert kept < 2 * 16_384 + 5_000, kept


@linux
def test_keep_freed_memory_reports_what_it_set_and_turns_numpy_advice_off():
    multiarray = pytest.importorskip("numpy._core.multiarray")  # numpy 2
    before = multiarray._set_madvise_hugepage(True)  # known state; the previous one restored below
    try:
        assert heap.keep_freed_memory() == {"malloc": True, "numpy_hugepages_off": True}
        assert multiarray._set_madvise_hugepage(True) is False  # what keep_freed_memory left
        assert heap.keep_freed_memory()["numpy_hugepages_off"]  # twice is fine
    finally:
        multiarray._set_madvise_hugepage(before)


def test_the_command_and_its_stage_worker_keep_freed_memory():
    """The setting is made where the processes start: the command's entry and the worker's loop."""
    import inspect

    from specsample import cli
    from specsample.battery import stage_worker

    assert "keep_freed_memory()" in inspect.getsource(cli._main)
    assert "keep_freed_memory()" in inspect.getsource(stage_worker._serve)
