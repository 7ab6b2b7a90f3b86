"""Bring your own sampler: verify a speculative sampler written in numpy, torch or anything with arrays.

A *host sampler* is a Python callable that does one verification step for a batch of rounds
(or for one, looped over by specsample)::

    fn(drafts int64[B, k], draft_rows [B, k, V], target_rows [B, k + 1, V], rng)
        -> (tokens [B, k + 1] padded, n_emitted [B])

``draft_rows[b, i]`` is q's distribution that drafted ``drafts[b, i]``; ``target_rows[b, i]`` is
p's distribution after the context and the first i drafts (row k: the bonus token). The rows are
probabilities, or log-probabilities with ``inputs="logits"`` (what a library sees after its
logits processors); float32 numpy arrays, or torch tensors with ``arrays="torch"``. Its
randomness comes from ``rng``: a seeded ``numpy.random.Generator`` (``rng="numpy"``), a seeded
``torch.Generator`` (``"torch"``), or nothing, the callable drawing from torch's global generator,
which specsample seeds before every call from the run's seed and the call's index
(``"torch-global"``). Every choice is deterministic given the seed.

specsample drafts from q itself (numpy, its own generator, independent of the sampler's),
computes both models' rows, passes only the rounds of sequences that still need tokens, counts
what comes back and runs the battery's tests on the counts: the same report, JSON and exit codes
as ``specsample verify``. A sequence count is honoured exactly (no rounding up to blocks).

The package: :mod:`.sampler` (what a host sampler is), :mod:`.run` (running and counting it),
:mod:`.boundary` (its generator at the floating-point edge), :mod:`.verify` (the battery).
"""

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "boundary": "EXTREME_VALUES MAX_SLOT extreme_states host_boundary_check",
    "run": "CALL_SECONDS FIRST_LANES ROW_BUDGET HostRun run_host",
    "sampler": "ARRAYS INPUTS RNGS HostNondeterminismWarning HostSampler HostSamplerError load_sampler",
    "verify": "HOST_CAPS verify_host",
})
