# Every CPU core as a JAX device for the whole test session (set before JAX is imported).
import os

import specsample

specsample.use_all_cpu_cores()

# The default run compiles hundreds of small programs that each run briefly: at XLA's -O0, and with the
# CPU backend's older elemental emitter for fusions, they compile faster and the numbers are the same (no
# fast math at any level or emitter; the pinned-count tests check it). The long runs are engine-bound and
# keep the defaults. Measured in docs/engine.md, "Busy machines".
OPT_FLAG = "--xla_backend_optimization_level=0"
# an XLA flag unknown to the installed jaxlib aborts the process, so this one only where it was measured
EMITTER_FLAG = "--xla_cpu_use_fusion_emitters=false"
EMITTER_JAXLIB = ((0, 10), (0, 11))  # [from, to) of jaxlib's (major, minor)


def _selects_long(expr: str) -> bool:
    return "long" in expr and "not long" not in expr


def _jaxlib_version() -> tuple:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return tuple(int(x) for x in version("jaxlib").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return ()


def run_flags(flags: str, jaxlib: tuple) -> str:
    """XLA_FLAGS for the default test run: ``flags`` plus what compiles faster, unless set already."""
    if "xla_backend_optimization_level" in flags:
        return flags
    added = [OPT_FLAG]
    if EMITTER_JAXLIB[0] <= jaxlib < EMITTER_JAXLIB[1] and "xla_cpu_use_fusion_emitters" not in flags:
        added.append(EMITTER_FLAG)
    return " ".join([flags, *added]).strip()


def pytest_configure(config):
    if _selects_long(config.getoption("markexpr", "") or ""):
        return
    os.environ["XLA_FLAGS"] = run_flags(os.environ.get("XLA_FLAGS", ""), _jaxlib_version())
