"""Checkpoint files: named int64 arrays with the signature of the run they belong to.

One format for the engine's chunked runs, host samplers' cases and end-to-end sequences.
Writes are atomic (a kill leaves the old file or the new one, never half of one), and a file
whose signature differs from the run's is an error, never silently mixed in.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

FORMAT = "specsample-checkpoint-2"  # files of another layout are refused like another run's


def save(path: str, signature: str, arrays: dict) -> None:
    """Write ``arrays`` (name -> array) and ``signature`` to ``path`` atomically."""
    tmp = f"{path}.tmp.npz"
    np.savez(tmp, format=np.array(FORMAT), signature=np.array(signature), **{f"a_{k}": np.asarray(v) for k, v in arrays.items()})
    os.replace(tmp, path)


def load(path: str, signature: str) -> Optional[dict]:
    """The arrays saved at ``path`` (None when there is no file); a one-line error for another run's."""
    if not os.path.exists(path):
        return None
    with np.load(path) as f:
        if "format" not in f.files or str(f["format"]) != FORMAT or str(f["signature"]) != signature:
            raise ValueError(f"checkpoint {path!r} belongs to a run with other arguments (or an older "
                             "engine); remove it or pass another path")
        return {k[2:]: f[k] for k in f.files if k.startswith("a_")}
