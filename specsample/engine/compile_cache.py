"""JAX's persistent compilation cache for specsample's compiled chunks (on by default).

A cold battery of a stateful scheme spends most of its time compiling, again in every new
process. With the cache, a later process loads the compiled chunks from disk instead. The cache
lives in the user's cache folder (``$XDG_CACHE_HOME/specsample/jax-<version>``, else
``~/.cache/...``); ``SPECSAMPLE_COMPILE_CACHE=0`` turns it off, and any other value is taken as
the folder. A cache the user configured for JAX already is left as it is. Cached executables
are keyed by the program, its options, the devices and the jax version, so the counts do not
depend on whether a chunk was compiled or loaded.
"""

from __future__ import annotations

import os

ENV = "SPECSAMPLE_COMPILE_CACHE"
MIN_COMPILE_SECONDS = 0.0  # every compile: entries are small (the whole battery keeps about 3 MB)


def default_dir() -> str:
    import jax

    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "specsample", f"jax-{jax.__version__}")


def enable() -> str | None:
    """Point JAX's persistent cache at specsample's folder; returns the folder (None: off or not ours)."""
    import jax

    setting = os.environ.get(ENV, "").strip()
    if setting.lower() in ("0", "off", "false", "no") or jax.config.jax_compilation_cache_dir:
        return None
    path = setting or default_dir()
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:  # a read-only home: run without the cache rather than fail
        return None
    if not os.access(path, os.W_OK):
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return path


CROWDED = 0.5  # of the kernel's memory-map limit: past it, compiled code is dropped before a run


def map_counts() -> tuple[int, int] | None:
    """(memory maps of this process, the kernel's limit), on Linux; None elsewhere."""
    try:
        with open("/proc/self/maps", "rb") as f:
            used = sum(1 for _ in f)
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
    except (OSError, ValueError):
        return None
    return used, limit


def release_if_crowded(fraction: float = CROWDED) -> bool:
    """Drop every compiled executable (``jax.clear_caches``) when this process holds over ``fraction``
    of the kernel's memory-map limit; returns whether it did.

    Each executable XLA compiles for the CPU maps a few hundred regions; a process that runs many
    batteries (calibration, benchmarks, a test session) accumulates thousands of executables and, at
    ``vm.max_map_count`` (65,530 by default), LLVM fails with "Cannot allocate memory" or a cached
    executable segfaults as it loads. Called before each battery: what is dropped recompiles (or
    loads from the persistent cache) when next used, and the counts do not change.
    """
    counts = map_counts()
    if counts is None or counts[0] < fraction * counts[1]:
        return False
    import jax

    from .. import program_cache

    jax.clear_caches()
    program_cache.clear()  # the programs loaded whole hold their memory maps too
    return True
