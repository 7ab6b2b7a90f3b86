"""Large numpy temporaries without the kernel's page faults: a setting of the command's processes.

A battery's host-side work makes many short-lived arrays of tens of MiB: the table tree stage pass
at V = 32,768 replays 128 rounds as rows of 32 MiB, and its tests copy, round and hash a few
hundred MiB of them. Two process defaults made each such array cost more in the kernel than the
arithmetic on it (``perf``: 18% of a quick ``tree-wor`` battery's samples zeroing pages, a third
of its CPU time in the kernel):

* glibc's ``malloc`` maps every block above its mmap threshold (at most 32 MiB) fresh from the
  kernel and unmaps it when freed, so each temporary is faulted in and zeroed page by page again;
* numpy advises the kernel to back arrays of 4 MiB or more with transparent huge pages, and where
  the kernel's huge-page ``defrag`` setting is ``madvise`` (Debian's default) a first touch may
  stop to compact memory, which made the first stage pass of a process the slowest by seconds.

:func:`keep_freed_memory` turns both off for the process: freed blocks stay in its heap for the next
array, and arrays get the kernel's ordinary pages. The process's peak memory is what it was (what
is freed is kept, not added); it goes back to the system when the process ends. Numbers and results
do not depend on it. The command (:mod:`specsample.cli`) and its stage worker call it; a library
user's process keeps its own settings.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
_KEEP = 2**31 - 1  # a trim threshold no heap reaches: freed memory is never handed back


def keep_freed_memory() -> dict:
    """Keep freed heap memory for reuse (glibc) and stop numpy's huge-page advice, in this process.

    Returns what was set: ``{"malloc": bool, "numpy_hugepages_off": bool}`` (False where the
    platform has no such setting: another C library, another numpy). Safe to call more than once.
    """
    return {"malloc": _keep_malloc(), "numpy_hugepages_off": _numpy_hugepages_off()}


def _keep_malloc() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # no block mapped apart (each would be zeroed anew), and the heap's free top never trimmed
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP))


def _numpy_hugepages_off() -> bool:
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        try:
            from numpy.core import multiarray
        except ImportError:
            return False
    setter = getattr(multiarray, "_set_madvise_hugepage", None)
    if setter is None:
        return False
    setter(False)
    return True
