"""Diagnostic figures (matplotlib): the only stage besides the CLI that draws.

- :mod:`.gallery`: the figures ``specsample figures`` renders, one function each;
- :mod:`.trees`: tokens per target pass of token trees against the chain;
- :mod:`.html`: a run as one self-contained HTML page (``verify --html``);
- :mod:`.panels`: panels both draw (a stage against its own law).
"""

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "gallery": "FIGURES SCALES check_names render_all",
    "html": "render write_html",
})
