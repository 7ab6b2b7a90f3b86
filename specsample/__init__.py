"""specsample: statistical verification of speculative sampling.

>>> import specsample
>>> report = specsample.verify("standard", budget="quick", cases="dirichlet/V8/k4")  # doctest: +SKIP
>>> report.passed  # doctest: +SKIP
True
"""

__version__ = "0.1.0"

from . import models, pairs, schemes  # noqa: E402
from .engine import Counts, run  # noqa: E402
from .report import CaseResult, Report, TestResult  # noqa: E402
from .schemes import CONTROLS, SCHEMES, RoundOutput, Scheme  # noqa: E402
from .verify import SchemeError, verify  # noqa: E402

__all__ = [
    "CONTROLS", "CaseResult", "Counts", "Report", "RoundOutput", "SCHEMES", "Scheme", "SchemeError",
    "TestResult", "models", "pairs", "run", "schemes", "verify",
]
