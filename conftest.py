# Every CPU core as a JAX device for the whole test session (set before JAX is imported).
import os

import specsample

specsample.use_all_cpu_cores()

# The default run compiles hundreds of small programs that each run briefly: at XLA's -O0 they compile
# faster and the numbers are the same (no fast math at any level; the pinned-count tests check it). The
# long runs are engine-bound and keep the default level. Measured in docs/engine.md, "Busy machines".
OPT_FLAG = "--xla_backend_optimization_level=0"


def _selects_long(expr: str) -> bool:
    return "long" in expr and "not long" not in expr


def pytest_configure(config):
    flags = os.environ.get("XLA_FLAGS", "")
    if _selects_long(config.getoption("markexpr", "") or "") or "xla_backend_optimization_level" in flags:
        return
    os.environ["XLA_FLAGS"] = f"{flags} {OPT_FLAG}".strip()
