"""Re-exports that load on first use, so that importing one module of a stage does not import all.

A stage package (``specsample.engine``, ``specsample.host``, ...) names its public API in its
``__init__`` without importing it: ``from specsample.host import mainthread`` must stay light (the
command line imports it before it can catch Ctrl-C), while ``specsample.host.verify_host`` still
works. PEP 562's module ``__getattr__`` does this.
"""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, where: dict):
    """``(__getattr__, __dir__, __all__)`` for ``package``, which re-exports each ``name`` of ``where``
    (``{submodule: "name name ..."}``) from ``package.submodule`` when first asked for."""
    owner = {name: module for module, names in where.items() for name in names.split()}

    def __getattr__(name):
        if name not in owner:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{owner[name]}"), name)
        setattr(sys.modules[package], name, value)  # later lookups are plain attribute reads
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(owner))

    return __getattr__, __dir__, sorted(owner)
