"""specsample: statistical verification of speculative sampling.

>>> import specsample
>>> report = specsample.verify("standard", budget="quick", cases="dirichlet/V8/k4")  # doctest: +SKIP
>>> report.passed  # doctest: +SKIP
True

Submodules load on first use. Importing specsample before JAX exposes every CPU core as
a JAX device (:func:`use_all_cpu_cores`), so the Python API runs on as many devices as the
command line does; the counts do not depend on the number of devices.
"""

import importlib

from . import _legacy

_legacy.install()  # specsample.exact, specsample.pairs, ... still import, from their stage folders
__version__ = "0.3.1"
SEED_MAX = 2**31 - 1  # seeds are folded into 31 bits: a larger or negative one would repeat another

_LAZY = {
    "Counts": "engine", "run": "engine",
    "CaseResult": "battery.report", "Report": "battery.report", "TestResult": "battery.report",
    "CONTROLS": "schemes", "LOSSY": "schemes", "SCHEMES": "schemes", "RoundOutput": "schemes", "Scheme": "schemes",
    "SchemeError": "battery", "verify": "battery",
}
# the stages, in the order data flows through them, then the tools on top
_SUBMODULES = {"models", "schemes", "engine", "laws", "battery", "host", "loops", "figures",
               "bench", "calibrate", "cli", "decode", "testing",
               # old flat paths, still importable (specsample._legacy)
               "pairs", "report", "reference", "transformer", "boundary"}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'specsample' has no attribute {name!r}")


def use_all_cpu_cores() -> None:
    """Expose every CPU core as a JAX device (blocks shard over devices; counts unchanged).

    Must run before JAX is imported; does nothing if the device count is already set.
    On GPU machines the flag only concerns the unused CPU platform.
    """
    import os
    import sys

    flags = os.environ.get("XLA_FLAGS", "")
    if "jax" in sys.modules or "xla_force_host_platform_device_count" in flags:
        return
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={os.cpu_count() or 1}".strip()


use_all_cpu_cores()
