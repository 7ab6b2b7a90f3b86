# Every CPU core as a JAX device for the whole test session (set before JAX is imported).
import os

import specsample

specsample.use_all_cpu_cores()

# The default run compiles hundreds of small programs and runs each briefly, so on a fresh machine
# most of its time is XLA's backend optimising code that runs for milliseconds. At -O0 a cold run took
# 9 min 11 s against 11 min 14 s - 12 min 39 s, and a warm one 5 min 34 s against 5 min 50 s (session 28,
# AVX2 host). The numbers do not change: XLA's CPU backend never uses fast math, and the pinned-count
# tests (recorded by the command, which keeps the default level) pass here and in the subprocesses
# that set their own XLA_FLAGS. The long statistical runs are engine-bound (about 4x slower at -O0)
# and keep the default level.
OPT_FLAG = "--xla_backend_optimization_level=0"


def _selects_long(expr: str) -> bool:
    return "long" in expr and "not long" not in expr


def pytest_configure(config):
    flags = os.environ.get("XLA_FLAGS", "")
    if _selects_long(config.getoption("markexpr", "") or "") or "xla_backend_optimization_level" in flags:
        return
    os.environ["XLA_FLAGS"] = f"{flags} {OPT_FLAG}".strip()
