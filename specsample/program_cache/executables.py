"""Compiled executables kept beside the programs of :mod:`specsample.program_cache`, loaded without lowering.

A program loaded from that cache is still lowered in every new process: JAX turns the exported
StableHLO back into a module (deserialising the portable artifact, in a new MLIR context) and hashes
it for its own cache's key before it reads the compiled code: about a quarter of a load of one of the
engine's transformer programs (0.06 of 0.23 s of CPU; the rest is XLA deserialising the executable).
Here the compiled executable itself is kept (:mod:`jax.experimental.serialize_executable`), under the
program's key and the host CPU's identity, and a new process deserialises it and calls it: no trace,
no lowering, no hash. A quick ``cached`` battery, which loads about 30 programs, ran 0.3-0.5 s faster.

One catch decides how an executable is written. XLA's CPU client serialises an executable it has
itself deserialised without its compiled functions (13.7 KB of 33.3 KB in a small test), and running the
copy fails with ``NOT_FOUND: Function ... not found``. So the executable is compiled here, with JAX's
reads of its persistent cache and its fresh compiles watched in this thread (:func:`compile_watched`):
one JAX compiled now is serialised anew; one it read from its cache is written from that entry's
bytes, which JAX serialised when it compiled them. One that came from neither (JAX's in-memory cache: first
compiled or read earlier, nobody knows which) is not written, and neither is anything where JAX's
internals are not as expected (another version): those programs load as before.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import threading
import zlib
from typing import Optional

_WATCH = threading.local()  # .log: [(how, executable, ...)] while compile_watched runs in this thread


@functools.cache
def cpu_identity() -> str:
    """The host CPU's model and instruction-set flags (Linux), or the machine type: compiled CPU code
    uses the instructions of the host that compiled it, so a cache folder shared between hosts must
    not hand one host's code to another."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f.read().splitlines() if ln.split(":")[0].strip() in ("model name", "flags")]
        return "\n".join(sorted(set(lines))) or platform.machine()
    except OSError:
        return platform.machine() + platform.processor()


@functools.cache
def _watching() -> bool:
    """Wrap JAX's persistent-cache read and its fresh compile (once per process) so that, in a thread
    running :func:`compile_watched`, each executable is logged with where it came from; False when JAX has no
    such functions (nothing is written then). The wrappers change nothing else."""
    try:
        from jax._src import compilation_cache as cc
        from jax._src import compiler

        read, fresh = cc.get_executable_and_time, compiler.backend_compile_and_load
        cc._get_cache, cc.decompress_executable, cc.extract_executable_and_time  # noqa: B018 - used by _bytes_of
    except (ImportError, AttributeError):
        return False

    def log(how, executable, *where):
        if getattr(_WATCH, "log", None) is not None and executable is not None:
            _WATCH.log.append((how, executable) + where)

    @functools.wraps(read)
    def watched_read(cache_key, compile_options, backend, *args, **kwargs):
        executable, seconds = read(cache_key, compile_options, backend, *args, **kwargs)
        log("read", executable, cache_key, backend)
        return executable, seconds

    @functools.wraps(fresh)
    def watched_compile(*args, **kwargs):
        executable = fresh(*args, **kwargs)
        log("fresh", executable)
        return executable

    cc.get_executable_and_time, compiler.backend_compile_and_load = watched_read, watched_compile
    return True


def compile_watched(run, leaves: list):
    """``run.lower(*leaves).compile()`` (``run`` jitted) and where JAX got each executable: a list of
    (how, executable, ...) with how "read" (its persistent cache) or "fresh" (compiled now)."""
    _watching()
    _WATCH.log = []
    try:
        return run.lower(*leaves).compile(), _WATCH.log
    finally:
        _WATCH.log = None


def _bytes_of(executable, log: list) -> Optional[bytes]:
    """``executable`` serialised, as the module docstring says; None when its origin is not known."""
    for how, ex, *where in log:
        if ex is not executable:
            continue
        if how == "fresh":
            return executable.serialize()
        from jax._src import compilation_cache as cc

        cache_key, backend = where
        cache = cc._get_cache(backend)
        stored = None if cache is None else cache.get(cache_key)
        return None if stored is None else cc.extract_executable_and_time(cc.decompress_executable(stored))[0]
    return None


# The tuple jax.experimental.serialize_executable pickles, by its _SERIALIZATION_VERSION: 1 up to JAX
# 0.12.0.1 (no number), 3 from 0.12.1 (the number first, closed-over constants last: none here, since
# save refuses them). 2 was never released. Another number: not written, the program loads as before.
_LAYOUTS = {
    1: lambda unloaded, args_info, no_kwargs: (unloaded, args_info, no_kwargs),
    3: lambda unloaded, args_info, no_kwargs: (3, unloaded, args_info, no_kwargs, []),
}


def save(path: str, name: str, compiled, log: list, out_tree, write) -> bool:
    """Write ``compiled`` (from :func:`compile_watched`, with its ``log``; a function of the arguments'
    leaves) and ``out_tree`` (the tree its outputs unflatten to) as entry ``path`` for key ``name``,
    through ``write(path, data)``; False when it cannot be written faithfully (module docstring)."""
    import jax
    from jax.experimental import serialize_executable as se

    unloaded = getattr(compiled._executable, "_unloaded_executable", None)
    if unloaded is None or compiled._params.const_args:
        return False
    args_info, in_tree = jax.tree.flatten(compiled.args_info)
    unknown = []

    class Pickler(se._JaxPjrtPickler):
        def persistent_id(self, obj):
            if isinstance(obj, se.xc.LoadedExecutable):
                data = _bytes_of(obj, log)
                if data is None:
                    unknown.append(obj)
                return "exec", data or b""
            return super().persistent_id(obj)

    version = getattr(se, "_SERIALIZATION_VERSION", 1)
    if version not in _LAYOUTS:
        return False  # a layout this module does not know: the program loads as before
    with io.BytesIO() as f:
        Pickler(f).dump(_LAYOUTS[version](unloaded, args_info, compiled._no_kwargs))
        payload = f.getvalue()
    if unknown:
        return False
    devices = [d.id for d in unloaded.device_list]  # deserialised for all devices, it would run on each
    write(path, zlib.compress(pickle.dumps((name, cpu_identity(), devices, payload, in_tree, compiled.out_tree,
                                            out_tree)), 1))
    return True


def load(path: str, name: str):
    """(the :class:`jax.stages.Compiled` kept at ``path``, its output tree), or None when there is none for
    key ``name`` on this CPU; raises when the entry is unreadable."""
    if not os.path.exists(path):
        return None
    import jax
    from jax.experimental import serialize_executable as se

    with open(path, "rb") as f:
        stored, cpu, devices, payload, in_tree, flat_tree, out_tree = pickle.loads(zlib.decompress(f.read()))
    if stored != name or cpu != cpu_identity():
        return None
    by_id = {d.id: d for d in jax.devices()}
    compiled = se.deserialize_and_load(payload, in_tree, flat_tree, execution_devices=[by_id[i] for i in devices])
    return compiled, out_tree


def call(compiled, leaves: list):
    """``compiled(*leaves)`` with every argument first placed as the executable expects (a loaded
    executable does not place its arguments itself: one over two devices was given them on one)."""
    import jax

    return compiled(*jax.device_put(tuple(leaves), tuple(compiled.input_shardings[0])))
