"""Old import paths keep working: ``specsample.exact`` is ``specsample.laws.exact``, the same module object.

Until the stage folders, every module sat directly in ``specsample/``; users' glue files import
``specsample.pairs``, ``specsample.transformer``, ``specsample.adapters`` and so on. A finder on
``sys.meta_path`` answers those names with the module at its new place, loaded once, so monkeypatching
either name patches both. Nothing is imported until an old name is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

# old ``specsample.<name>`` -> new path under ``specsample``; engine, models, battery and figures are
# packages of the same name that re-export the old module's API.
MOVED = {
    "pairs": "models.pairs", "transformer": "models.transformer", "tree_attention": "models.tree_attention",
    "rng": "engine.rng", "compile_cache": "engine.compile_cache", "checkpoint": "engine.checkpoint",
    "exact": "laws.exact", "tree_exact": "laws.tree_exact", "reference": "laws.reference",
    "cases": "battery.cases", "report": "battery.report", "stages": "battery.stages",
    "diagnosis": "battery.diagnosis", "edges": "battery.edges", "boundary": "battery.boundary",
    "sequential": "battery.sequential",
    "adapters": "host.adapters", "intercept": "host.intercept", "mainthread": "host.mainthread",
    "e2e": "loops.verify", "e2e_boundary": "loops.boundary", "loop_runner": "loops.runner",
    "tree_figures": "figures.trees",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.spec = module.__spec__  # the import system overwrites __spec__ with the alias's; put it back
        return module

    def exec_module(self, module):
        module.__spec__ = self.spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.partition(".")
        if package != __package__ or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(f"{package}.{MOVED[name]}"))


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
