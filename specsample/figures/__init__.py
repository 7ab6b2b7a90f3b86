"""Diagnostic figures (matplotlib): the only stage besides the CLI that draws.

- :mod:`.gallery`: the figures ``specsample figures`` renders, one function each;
- :mod:`.trees`: tokens per target pass of token trees against the chain.
"""

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "gallery": "FIGURES SCALES check_names render_all",
})
