"""Input checks shared by the statistics functions (one clear error per problem)."""

from __future__ import annotations

import numpy as np

PROB_ATOL = 1e-6


def as_probs(probs, name="probs", *, axis=-1, atol=PROB_ATOL) -> np.ndarray:
    """Return ``probs`` as float64, checked to be finite, non-negative and normalised.

    The result is renormalised exactly along ``axis`` so later sums are exact.
    """
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim == 0 or p.shape[axis] == 0:
        raise ValueError(f"{name} must be a non-empty array of probabilities, got shape {p.shape}")
    if not np.all(np.isfinite(p)):
        raise ValueError(f"{name} contains NaN or inf; pass finite probabilities")
    if np.any(p < 0):
        raise ValueError(f"{name} has negative entries (min {p.min():.3g}); probabilities must be >= 0")
    total = p.sum(axis=axis, keepdims=True)
    if np.any(np.abs(total - 1.0) > atol):
        worst = float(np.max(np.abs(total - 1.0)))
        raise ValueError(
            f"{name} is not normalised (sum differs from 1 by {worst:.3g} > {atol:g}); "
            "divide by its sum first"
        )
    return p / total


def as_counts(counts, name="counts") -> np.ndarray:
    """Return ``counts`` as int64, checked to be finite, non-negative integers."""
    c = np.asarray(counts)
    if c.size == 0:
        raise ValueError(f"{name} is empty")
    if c.dtype.kind == "f":
        if not np.all(np.isfinite(c)) or np.any(c != np.round(c)):
            raise ValueError(f"{name} must hold whole numbers (got non-integer or non-finite values)")
    elif c.dtype.kind not in "iub":
        raise ValueError(f"{name} must be numeric counts, got dtype {c.dtype}")
    c = c.astype(np.int64)
    if np.any(c < 0):
        raise ValueError(f"{name} has negative entries; counts must be >= 0")
    return c


def same_shape(a: np.ndarray, b: np.ndarray, names: tuple[str, str]) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{names[0]} has shape {a.shape} but {names[1]} has shape {b.shape}; they must match")


def check_level(alpha: float, name: str = "alpha") -> float:
    alpha = float(alpha)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {alpha}")
    return alpha
