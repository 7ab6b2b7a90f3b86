"""How many rounds of full rows a host call may carry: sized from the vocabulary and the memory free.

A host sampler is handed float32 rows, k draft rows and k + 1 target rows a round, and it and the
conversions around it (torch tensors, float64 temporaries) hold several copies of them. At a 32,768-token
vocabulary a batch of 4,096 rounds is 4.5 GiB of rows before any copy: a batched torch sampler's stage
pass was killed by the kernel on a 24 GiB machine. Every host call's batch is therefore capped by
:func:`rounds_per_call`, and a round too large for the memory free is refused before any work.
"""

from __future__ import annotations

import os
import resource
import sys

ROW_BUDGET = 1 << 25  # floats of rows passed in one call (128 MiB as float32) at most
COPIES = 8  # copies of a call's rows a sampler and its conversions may hold at once (float64 counts twice)


def available_bytes() -> int:
    """Memory the machine can give now (Linux ``MemAvailable``; elsewhere the free pages), or a large
    number where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def rounds_per_call(k: int, vocab: int, want: int) -> int:
    """Rounds in one host call: ``want``, capped so that the call's rows ((2k + 1) V floats a round) stay
    within :data:`ROW_BUDGET` and, with :data:`COPIES` copies, within the memory free; at least 1.

    Raises ValueError when even one round's rows (with their copies) exceed the memory free: a run that
    cannot fit says so before it starts."""
    per_round = (2 * int(k) + 1) * int(vocab)
    free = available_bytes()
    if per_round * 4 * COPIES > free:
        raise ValueError(f"one round's rows at V = {vocab}, k = {k} take {per_round * 4 * COPIES / 2**20:,.0f} MiB "
                         f"with their copies, and {free / 2**20:,.0f} MiB is free: give a smaller k or vocabulary, "
                         f"or free memory")
    cap = min(ROW_BUDGET, free // (4 * COPIES)) // per_round
    return int(max(1, min(int(want), cap)))


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (``getrusage``; kilobytes on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024
