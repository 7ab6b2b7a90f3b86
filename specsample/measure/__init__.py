"""How far from lossless: distances of a run's laws from p, with intervals, certificates and sweeps.

``specsample measure`` is ``verify`` read as a measurement. :mod:`.distances` turns a report's position
laws into TV estimates with simultaneous intervals (and KL), :mod:`.exact` computes the exact laws of
registered rules on the battery's table pairs for comparison, and :mod:`.sweep` moves a lossy rule's
threshold and records distortion against tokens per round.
"""

from .distances import Measurement, PositionDistance, measure, position_laws, stage_laws
from .exact import case_exact_laws, exact_laws, has_exact

__all__ = ["Measurement", "PositionDistance", "case_exact_laws", "exact_laws", "has_exact", "measure",
           "position_laws", "stage_laws"]
