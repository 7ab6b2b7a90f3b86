"""The engine: runs a scheme's rounds in jitted, vectorised lanes and counts what they emit on device.

- :mod:`.lanes`: the counting engine (fixed-size chunks, sharding over devices, stateful lanes);
- :mod:`.cells`: where a block's counts live on the device, and the one scatter a round makes;
- :mod:`.rng`: the PRNG implementations and the uniform stream a round consumes;
- :mod:`.compile_cache`: JAX's persistent compilation cache in the user's cache folder;
- :mod:`.checkpoint`: resumable runs (counts saved as they finish).

``specsample.engine`` re-exports the engine's API (``run``, ``Counts``, ...), as it did when it was
one module.
"""

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "lanes": ("COMPILE_CACHE DEFAULT_PRNG JOINT_MAX_CELLS PRNG_IMPLS STREAM_VERSION Counts RunSpec check_prng "
        "n_prefixes prefix_id run save_pending_checkpoints transitions_from_joint warm"),
})
