"""Whole generate loops, verified end to end as black boxes.

- :mod:`.verify`: :func:`verify_generate`, the exact law by enumeration or prefix-by-prefix
  sequential tests, provenance of drafted tokens;
- :mod:`.runner`: calls the user's loop (serial, batched or in worker processes) reproducibly;
- :mod:`.boundary`: the loop's own draws forced to their extreme values;
- :mod:`.mask`: a target masked to its top-k (or without given tokens), so the boundary pass reaches.
"""

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "runner": "LoopError",
    "verify": "verify_generate",
    "mask": "mask_logits mask_module",
})
