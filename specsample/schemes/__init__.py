"""Draft-and-verify schemes: the extension point of specsample.

A scheme is a :class:`Scheme` NamedTuple of pure functions built by a factory that takes
the draft length ``k``. ``SCHEMES`` maps the names of lossless schemes to factories;
``CONTROLS`` holds the negative controls (names start with ``control:``); ``LOSSY`` the lossy rules
engines ship on purpose, named with their parameters (``relaxed[threshold_acc=0.5]``,
:mod:`specsample.schemes.lossy`). User schemes
are loaded from ``module:attr`` or ``path/to/file.py:attr``, where ``attr`` is a factory
``f(k) -> Scheme`` or a ready :class:`Scheme`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from typing import Callable, Optional

from .base import (
    RoundOutput,
    Scheme,
    UniformStep,
    draft_tokens,
    emit,
    fenced,
    leading_true,
    residual,
    sample_weights,
    target_rows,
)
from .base import StatefulStep
from .block import block_verification
from .cached import CACHE_CONTROLS, cached, recompute
from .controls import CONTROLS
from .greedy import greedy
from .lossy import LOSSY, parse as parse_lossy
from .multidraft import kseq, multidraft_with_replacement, multidraft_without_replacement
from .standard import standard
from .tree import TREE_CONTROLS, tree, tree_topk, tree_wor
from .tree_cached import TREE_CACHE_CONTROLS, tree_cached
from .tree_dynamic import DYNAMIC_CONTROLS, tree_dynamic, tree_dynamic_wor

SchemeFactory = Callable[..., Scheme]

SCHEMES: dict[str, SchemeFactory] = {
    "standard": standard,
    "block": block_verification,
    "greedy": greedy,
    "multidraft": multidraft_with_replacement,
    "multidraft-wor": multidraft_without_replacement,
    "kseq": kseq,
    "cached": cached,
    "recompute": recompute,
    "tree": tree,
    "tree-wor": tree_wor,
    "tree-topk": tree_topk,
    "tree-cached": tree_cached,
    "tree-dynamic": tree_dynamic,
    "tree-dynamic-wor": tree_dynamic_wor,
}
CONTROLS.update(CACHE_CONTROLS)  # one registry of controls: table rules, then KV-cache handling, then trees
CONTROLS.update(TREE_CONTROLS)
CONTROLS.update(TREE_CACHE_CONTROLS)
CONTROLS.update(DYNAMIC_CONTROLS)


class SchemeLoadError(ValueError):
    """A scheme name or path that cannot be turned into a scheme."""


_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the specsample package


def user_location(exc: BaseException) -> str:
    """Where a user's code raised: `` (at my_scheme.py:12 in step: x = 1 / 0)``, or ``""``.

    The innermost traceback frame outside specsample, JAX and installed packages: the last
    frame of the user's own file, which is what a scheme author needs to see.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    for f in reversed(frames):
        path = os.path.abspath(f.filename)
        if (path.startswith(_OURS + os.sep) or "site-packages" in path or "dist-packages" in path
                or f.filename.startswith("<") or os.sep + "jax" in path or os.sep + "lib" + os.sep + "python" in path):
            continue
        line = f" {(f.line or '').strip()}" if f.line else ""
        return f" (at {os.path.relpath(path) if not os.path.relpath(path).startswith('..') else path}:{f.lineno} " \
               f"in {f.name}:{line})"
    return ""


def registered() -> dict[str, SchemeFactory]:
    """All registered factories: lossless schemes first, then controls, then the lossy rules (at their
    default parameters)."""
    return {**SCHEMES, **CONTROLS, **LOSSY}


_BUILTIN = registered()  # specsample's own, before any user registers or replaces one


def builtin_scheme(name: str) -> bool:
    """Whether ``name`` still names the factory specsample registered under it (a fresh process
    builds the same scheme from the name alone)."""
    return name in _BUILTIN and registered().get(name) is _BUILTIN[name]


def _load_object(spec: str):
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise SchemeLoadError(f"cannot read scheme spec {spec!r}; use NAME, module:attr or path.py:attr")
    if target.endswith(".py") or os.sep in target:
        if not os.path.isfile(target):
            raise SchemeLoadError(f"scheme file {target!r} does not exist")
        folder = os.path.dirname(os.path.abspath(target))
        if folder not in sys.path:  # a glue file imports the modules beside it, as when run as a script
            sys.path.insert(0, folder)
        name = "_specsample_user_" + os.path.splitext(os.path.basename(target))[0]
        file_spec = importlib.util.spec_from_file_location(name, target)
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[name] = module
        try:
            file_spec.loader.exec_module(module)
        except Exception as e:  # a user file: report its error in one line, with where it happened
            raise SchemeLoadError(f"importing {target!r} failed: {type(e).__name__}: {e}{user_location(e)}") from e
    else:
        try:
            module = importlib.import_module(target)
        except Exception as e:
            raise SchemeLoadError(f"cannot import module {target!r}: {type(e).__name__}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SchemeLoadError(f"{target!r} has no attribute {attr!r}") from None


def get_factory(spec) -> SchemeFactory:
    """Resolve a scheme name, ``module:attr``, ``file.py:attr``, factory or Scheme to a factory.

    A ready :class:`Scheme` becomes a factory that ignores ``k`` (its own k is used).
    """
    if isinstance(spec, Scheme):
        return lambda k=None: spec
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise SchemeLoadError(f"a scheme must be a name, a factory or a Scheme, got {type(spec).__name__}")
    known = registered()
    if spec in known:
        return known[spec]
    if spec.endswith("]") and "[" in spec:
        return _parameterised(spec)
    if ":" in spec and not spec.startswith("control:"):
        return get_factory(_load_object(spec))
    if spec.endswith(".py") or os.sep in spec or (os.path.exists(spec) and not spec.isidentifier()):
        stem = os.path.splitext(os.path.basename(spec))[0]
        raise SchemeLoadError(f"scheme spec {spec!r} names a file but not the object in it; use path.py:attr, "
                              f"e.g. {spec}:{stem if stem.isidentifier() else 'my_scheme'}")
    raise SchemeLoadError(
        f"unknown scheme {spec!r}; valid schemes: {', '.join(SCHEMES)}; controls: {', '.join(CONTROLS)}; "
        f"lossy rules: {', '.join(LOSSY)} (with parameters: NAME[key=value,...]); or give module:attr / path.py:attr"
    )


_PARAMETERISED: dict = {}


def _parameterised(spec: str) -> SchemeFactory:
    """The factory of a lossy rule named with parameters: one object per rule and parameters, so that
    :func:`make_scheme` builds (and the engine compiles) each once."""
    try:
        name, params = parse_lossy(spec)
    except (TypeError, ValueError) as e:
        raise SchemeLoadError(str(e)) from None
    key = (name, tuple(sorted(params.items())))
    if key not in _PARAMETERISED:
        import functools

        factory = functools.partial(LOSSY[name], **params)
        try:
            factory(1)  # a bad value fails here, in one line, not inside a run
        except (TypeError, ValueError) as e:
            raise SchemeLoadError(f"{spec}: {e}") from None
        _PARAMETERISED[key] = factory
    return _PARAMETERISED[key]


_BUILT: dict = {}


def make_scheme(spec, k: int) -> Scheme:
    """Build the scheme for draft length ``k`` and check what the factory returned.

    Schemes are memoised per (factory, k), so repeated runs reuse compiled code.
    """
    if int(k) != k or k < 1:
        raise ValueError(f"draft length k must be an integer >= 1, got {k}")
    factory = get_factory(spec)
    key = (factory, int(k))
    if key not in _BUILT:
        _BUILT[key] = _build(factory, int(k))
    return _BUILT[key]


def builtin_identity(scheme: Scheme) -> Optional[tuple]:
    """``(name, k)`` when ``scheme`` is the very object :func:`make_scheme` built from specsample's own
    factory still registered under ``name``: the name and k then determine every function in it (a
    saved program may be found by them, :mod:`specsample.program_cache`). None for any other
    scheme (a user's factory, a Scheme built or changed by hand), whose code no such name describes."""
    for (factory, k), built in list(_BUILT.items()):
        if built is scheme:
            for name, own in _BUILTIN.items():
                if own is factory and builtin_scheme(name):
                    return name, k
    return None


def program_identity(scheme: Scheme, kind: str, *extra) -> Optional[tuple]:
    """``(kind, builtin_identity(scheme), *extra)``: the identity under which
    :mod:`specsample.program_cache` keeps a program or value built from ``scheme``; None for a scheme
    no registry name describes (its program is traced, its value computed, every time)."""
    name = builtin_identity(scheme)
    return None if name is None else (kind, name) + extra


def _build(factory, k: int) -> Scheme:
    try:
        scheme = factory(k)
    except TypeError:
        scheme = factory()
    except Exception as e:
        raise SchemeLoadError(f"scheme factory {getattr(factory, '__name__', factory)!r} raised "
                              f"{type(e).__name__}: {e}{user_location(e)}") from e
    if not isinstance(scheme, Scheme):
        raise SchemeLoadError(f"scheme factory returned {type(scheme).__name__}, expected specsample.Scheme")
    return scheme


__all__ = [
    "CONTROLS", "LOSSY", "RoundOutput", "SCHEMES", "Scheme", "SchemeLoadError", "StatefulStep", "UniformStep",
    "builtin_identity", "builtin_scheme", "draft_tokens", "emit", "fenced", "get_factory", "leading_true", "make_scheme",
    "program_identity", "registered",
    "residual", "sample_weights", "standard", "target_rows", "user_location",
]
