"""Traced programs kept on disk under the name of what built them, so a new process skips tracing.

JAX's persistent cache (:mod:`specsample.engine.compile_cache`) keeps XLA's compiled code, but its
key is the lowered program: a new process still traces and lowers every program to find it. For
rounds over neural models that was most of a warm battery: ``verify --scheme cached --budget quick``
spent about 1 s tracing and lowering each engine chunk, against 0.2 s loading it from here.

Here a program is kept as JAX exports it (:func:`jax.export.export`: the lowered StableHLO, from
which JAX's own cache then finds the compiled code) under a key made of everything that went into it:

- ``identity``: what the caller built it from (the engine: the scheme's registry name and k and every
  other field of the run's spec). Callers pass one only for specsample's own schemes
  (:func:`specsample.schemes.builtin_identity`), never for a user's, whose code this key cannot see;
- a digest of every source file of the ``specsample`` package: an edit starts new entries;
- the versions of jax, jaxlib and numpy, the backend and its devices, ``XLA_FLAGS`` and the jax
  settings that change a trace;
- the structure, shapes and dtypes of the arguments, whose containers must be Python's or
  specsample's own classes (a user's model class brings code the digest does not cover: no key).

:func:`value` keeps, under the same kind of key, a result this package computes from the identity and
the arguments' shapes alone: a transformer pair's weights from its seed, a shape check that passed,
a transformer case's exact laws (under a digest of both networks' weights).

Every program is saved (:data:`SAVE_SECONDS` is 0): even one that traces in a few hundredths of a
second loads faster than it traces (a warm battery's 35 stage-pass programs: 0.5 s less in all). An
entry that does not load (a truncated file, another format) is traced again and replaced; a program
that cannot be exported runs as before. Entries live in ``programs/`` in JAX's cache folder
(``SPECSAMPLE_COMPILE_CACHE``), and the least recently used go past :data:`MAX_BYTES`.

Beside each program, its compiled executable is kept too (``x-`` entries, :mod:`.executables`),
and a new process of one JAX process loads that first: no trace and no lowering at all.

The cache is on in the ``specsample`` command (and the stage worker it starts), off in a library
process unless ``SPECSAMPLE_PROGRAM_CACHE=1``: the key sees the package's files, not its state, so
a process that patches specsample's internals at run time (a test's mutant, a notebook's experiment)
would load a program traced without the patch, and save one traced with it under the true key.

Exported programs need the ``flatbuffers`` package (a dependency); without it, this cache is
off. Like JAX's own cache, entries are unpickled from the user's cache folder: do not point it at a
folder others can write.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import threading
import time
import zlib
from typing import Optional

from . import executables

ENV = "SPECSAMPLE_PROGRAM_CACHE"
SAVE_SECONDS = 0.0  # trace + lower time from which a program is saved: all of them
FORMAT = 1  # bumped when an entry's layout changes
MAX_BYTES = 256 << 20  # the folder's size past which the least recently used entries go (entries: 10-300 KB)

_LOADED: dict = {}  # key -> (jitted program of the leaves, output tree), or None: call fn itself
_LOCK = threading.Lock()
STATS = {"loaded": 0, "saved": 0, "traced": 0, "failed": 0,  # this process's counts (tests read them)
         "values_loaded": 0, "values_saved": 0, "executables_loaded": 0, "executables_saved": 0}


def enable() -> None:
    """Keep and load programs in this process and its children (the command line calls this)."""
    os.environ[ENV] = "1"  # a variable, so the stage worker (a child process) inherits it


def folder() -> Optional[str]:
    """Where programs are kept: ``programs/`` in JAX's compile cache folder; None unless this cache is
    on (:func:`enable`, or ``SPECSAMPLE_PROGRAM_CACHE=1``) and JAX's cache is too."""
    if os.environ.get(ENV, "").strip().lower() not in ("1", "on", "true", "yes"):
        return None
    import jax

    base = jax.config.jax_compilation_cache_dir  # specsample's folder, or one the user gave JAX
    return None if not base or "://" in base else os.path.join(base, "programs")


def package_root() -> str:
    """The folder of the ``specsample`` package (this module's package sits in it)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def source_digest() -> str:
    """SHA-256 of every ``.py`` file of the specsample package (their paths and bytes), once per process."""
    root = package_root()
    h = hashlib.sha256()
    for d, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(d, f)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as fh:
                    h.update(fh.read() + b"\0")
    return h.hexdigest()


def _setting_key() -> tuple:
    import jax
    import jaxlib
    import numpy as np

    devices = jax.devices()
    settings = tuple((name, str(getattr(jax.config, name, None))) for name in (
        "jax_enable_x64", "jax_default_prng_impl", "jax_default_matmul_precision", "jax_threefry_partitionable",
        "jax_numpy_rank_promotion", "jax_numpy_dtype_promotion"))
    return (FORMAT, source_digest(), jax.__version__, jaxlib.__version__, np.__version__, jax.default_backend(),
            devices[0].client.platform_version, tuple(d.device_kind for d in devices), jax.process_count(),
            os.environ.get("XLA_FLAGS", ""), settings)


def key(identity: tuple, args: tuple) -> Optional[str]:
    """The entry name of a program built from ``identity`` for arguments like ``args``; None when an
    argument is not arrays in specsample's own or Python's containers (a user's model class: its code,
    traced into the program, is not in the source digest)."""
    import jax

    leaves, tree = jax.tree.flatten(args)
    if not _own_types(tree) or not all(hasattr(x, "shape") and hasattr(x, "dtype") for x in leaves):
        return None
    avals = tuple((tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False))) for x in leaves)
    return hashlib.sha256(repr((_setting_key(), identity, str(tree), avals)).encode()).hexdigest()


def hash_model(h, model) -> None:
    """Feed ``h`` (a :mod:`hashlib` object) what a network's outputs depend on: its config (or its type's name)
    and the bytes of every weight. The engine's checkpoint signature and a case's kept exact laws use it."""
    import jax
    import numpy as np

    h.update(repr(getattr(model, "config", type(model).__name__)).encode())
    for leaf in jax.tree.leaves(model):
        h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())


def _own_types(tree) -> bool:
    """Whether every node of a pytree structure is a Python container or a specsample class."""
    data = tree.node_data()
    if data is not None:
        module = getattr(data[0], "__module__", "") or ""
        if module not in ("builtins", "collections") and not module.startswith("specsample."):
            return False
    return all(_own_types(child) for child in tree.children())


def call(fn, identity: Optional[tuple], *args):
    """``fn(*args)`` (``fn`` jitted), through a program saved for ``identity`` and arguments of these
    shapes when there is one. ``identity`` None (a user's scheme) or the cache off: ``fn`` itself."""
    where = None if identity is None or _export_missing() else folder()
    if where is None:
        return fn(*args)
    entry = program(fn, identity, args, where)
    if entry is None:
        return fn(*args)
    import jax

    run, out_tree = entry
    leaves = jax.tree.leaves(args)
    if isinstance(run, jax.stages.Compiled):
        return out_tree.unflatten(executables.call(run, leaves))
    return out_tree.unflatten(run(*leaves))


def bound(fn, identity: Optional[tuple]):
    """``fn`` called through :func:`call` under ``identity``; ``fn`` itself when there is none (a user's
    scheme: see :func:`specsample.schemes.builtin_identity`)."""
    return fn if identity is None else functools.partial(call, fn, identity)


def value(compute, identity: Optional[tuple], *args, host: bool = False):
    """``compute(*args)``, through a copy saved for ``identity`` and arguments of these shapes (the key of
    a program) when there is one: for a result that code of this package computes from the identity and
    the arguments' shapes alone (a transformer pair's weights from their seed, a check that passed).

    The result is kept as the host copy of its arrays (``jax.device_get``, pickled) and comes back with
    them as JAX arrays again, the same values to the bit; ``host=True`` gives back the numpy arrays as
    they were (float64 stays float64). ``identity`` None, the cache off, or arguments without a key:
    computed. Values live beside the programs (their names start with ``v-``).
    """
    where = None if identity is None else folder()
    name = None if where is None else key(("value",) + tuple(identity), args)
    if name is None:
        return compute(*args)
    import jax
    import numpy as np

    path = os.path.join(where, f"v-{name}")
    try:
        with open(path, "rb") as f:
            stored, host_copy = pickle.loads(zlib.decompress(f.read()))
        if stored == name:
            STATS["values_loaded"] += 1
            os.utime(path)
            if host:
                return host_copy
            # device_put, not jnp.asarray: the latter compiles a program per shape (jax's `stage`)
            return jax.tree.map(lambda x: jax.device_put(x) if isinstance(x, np.ndarray) else x, host_copy)
    except Exception:  # noqa: BLE001 - none yet, or unreadable: computed and (re)written
        pass
    out = compute(*args)
    try:
        _write(where, f"v-{name}", zlib.compress(pickle.dumps((name, jax.device_get(out))), 1))
        STATS["values_saved"] += 1
    except Exception:  # noqa: BLE001 - a value that cannot be kept is still returned
        pass
    return out


def program(fn, identity: tuple, args: tuple, where: str) -> Optional[tuple]:
    """(a jitted function of the arguments' leaves, the tree of its outputs) for ``fn`` at ``args``:
    from this process, from disk, or traced now (and saved); None when ``args`` have no key or the
    program cannot be exported (``fn`` is then called as it is)."""
    name = key(identity, args)
    if name is None:
        return None
    if name not in _LOADED:
        import jax

        # one process: an executable kept on disk (several: each process's share of the devices differs)
        alone = jax.process_count() == 1
        entry = _load_compiled(where, name) if alone else None
        if entry is None:
            entry = _load(where, name)
            if entry is None:
                entry = _export(fn, args, where, name)
            if entry is not None and alone:
                entry = _compile_and_keep(entry, args, where, name)
        with _LOCK:
            _LOADED.setdefault(name, entry)
    return _LOADED[name]


def _export(fn, args: tuple, where: str, name: str) -> Optional[tuple]:
    """Trace and lower ``fn`` once, as a function of the arguments' leaves (an exported program needs
    no pytree types registered), save it if that took :data:`SAVE_SECONDS`, and call it from now on."""
    import jax

    leaves, tree = jax.tree.flatten(args)
    trees = []

    def flat(*xs):
        out, out_tree = jax.tree.flatten(fn(*tree.unflatten(xs)))
        trees.append(out_tree)
        return out

    t0 = time.perf_counter()
    try:
        exported = jax.export.export(jax.jit(flat))(*leaves)
        run = _runner(exported)
    except Exception:  # noqa: BLE001 - not exportable (a host callback, say): fn runs as it is, and
        STATS["failed"] += 1  # an error of fn's own shows again when it does
        return None
    STATS["traced"] += 1
    if time.perf_counter() - t0 >= SAVE_SECONDS:
        _save(where, name, exported, trees[0])
    return run, trees[0]


def _runner(exported):
    """``exported.call`` jitted; over several devices (the engine's mesh), with every argument replicated
    on the first ``nr_devices`` devices (the engine's default mesh; its shard_map splits the blocks)."""
    import jax
    import numpy as np

    if exported.nr_devices == 1:
        return jax.jit(exported.call)
    if any(h is not None and not h.is_replicated() for h in exported.in_shardings_hlo):
        raise ValueError("a saved program splits an argument over devices")  # not one of the engine's
    mesh = jax.sharding.Mesh(np.array(jax.devices()[: exported.nr_devices]), ("d",))
    every = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.jit(exported.call, in_shardings=(every,) * len(exported.in_avals))


@functools.cache
def _export_missing() -> bool:
    """Whether jax.export cannot serialise here (it needs the ``flatbuffers`` package)."""
    import importlib.util

    return importlib.util.find_spec("flatbuffers") is None


def _load(where: str, name: str):
    path = os.path.join(where, name)
    if not os.path.exists(path):
        return None
    try:
        import jax

        with open(path, "rb") as f:
            stored, blob, out_tree = pickle.loads(zlib.decompress(f.read()))
        if stored != name:
            raise ValueError("entry of another key")
        exported = jax.export.deserialize(bytearray(blob))
        run = _runner(exported)
    except Exception:  # noqa: BLE001 - an unreadable entry is traced again and replaced
        STATS["failed"] += 1
        return None
    STATS["loaded"] += 1
    _touch(path)
    return run, out_tree


def _touch(path: str) -> None:
    try:
        os.utime(path)  # recently used: kept by prune()
    except OSError:
        pass


def _compile_and_keep(entry: tuple, args: tuple, where: str, name: str) -> tuple:
    """``entry``'s program compiled now, and its executable kept (:mod:`.executables`); ``entry``
    itself when that fails (the program then compiles on its first call, as it did)."""
    import jax

    run, out_tree = entry
    try:
        compiled, log = executables.compile_watched(run, jax.tree.leaves(args))
    except Exception:  # noqa: BLE001 - an error of the program's own shows again when it is called
        return entry
    try:
        if executables.save(os.path.join(where, f"x-{name}"), name, compiled, log, out_tree, _write_path):
            STATS["executables_saved"] += 1
    except Exception:  # noqa: BLE001 - an executable that cannot be kept still runs
        pass
    return compiled, out_tree


def _load_compiled(where: str, name: str):
    try:
        entry = executables.load(os.path.join(where, f"x-{name}"), name)
    except Exception:  # noqa: BLE001 - unreadable: the program is loaded or traced, and its entry replaced
        STATS["failed"] += 1
        return None
    if entry is not None:
        STATS["loaded"] += 1
        STATS["executables_loaded"] += 1
        _touch(os.path.join(where, f"x-{name}"))
    return entry


def _save(where: str, name: str, exported, out_tree) -> None:
    try:
        _write(where, name, zlib.compress(pickle.dumps((name, bytes(exported.serialize()), out_tree)), 1))
    except Exception:  # noqa: BLE001 - a program that cannot be saved still runs
        return
    STATS["saved"] += 1


def _write_path(path: str, data: bytes) -> None:
    _write(os.path.dirname(path), os.path.basename(path), data)


def _write(where: str, name: str, data: bytes) -> None:
    """Write an entry whole or not at all, whatever runs beside it; the first write of a process prunes."""
    os.makedirs(where, exist_ok=True)
    tmp = os.path.join(where, f".{name}.{os.getpid()}.{threading.get_ident()}")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(where, name))
    if not _PRUNED:
        _PRUNED.append(True)
        prune(where)


_PRUNED: list = []


def prune(where: str, max_bytes: int = MAX_BYTES) -> int:
    """Delete the least recently used entries (by modification time: a load touches its entry) until
    the folder holds at most 3/4 of ``max_bytes``, when it holds more; returns how many were deleted.
    Every edit of the package starts new entries, so old ones would otherwise pile up."""
    try:
        entries = [e for e in os.scandir(where) if e.is_file() and not e.name.startswith(".")]
        sizes = {e.path: e.stat() for e in entries}
    except OSError:
        return 0
    total = sum(st.st_size for st in sizes.values())
    if total <= max_bytes:
        return 0
    gone = 0
    for path, st in sorted(sizes.items(), key=lambda kv: kv[1].st_mtime):
        if total <= 3 * max_bytes // 4:
            break
        try:
            os.remove(path)
        except OSError:
            continue
        total -= st.st_size
        gone += 1
    return gone


def clear() -> None:
    """Drop the programs this process loaded (with ``jax.clear_caches``: their compiled code maps memory)."""
    with _LOCK:
        _LOADED.clear()
