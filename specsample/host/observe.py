"""Watching a host sampler's statistical rounds as they are played (``verify --sampler ... --record``).

Only the rounds the battery draws at random are shown to observers: never those of the boundary,
interception or edge passes, whose forced uniforms and hand-made rows do not follow the sampling
law. An observer is called as ``observer(label, drafts [B, k], q [B, k, V], p [B, k + 1, V],
tokens [B, k + 1], n_emitted [B])`` with probability rows, whatever the sampler takes. An
observer with a ``sequences`` method is also shown a whole loop's sequences and their provenance
(:func:`notify_sequences`), from which the rounds the loop reveals are rebuilt.
"""

from __future__ import annotations

import contextlib
import threading

_OBSERVERS: list = []
_LOCK = threading.Lock()


@contextlib.contextmanager
def observe(observer):
    """Show ``observer`` every random round played while the block runs (from any thread)."""
    with _LOCK:
        _OBSERVERS.append(observer)
    try:
        yield observer
    finally:
        with _LOCK:
            _OBSERVERS.remove(observer)


def active() -> bool:
    return bool(_OBSERVERS)


def notify(label: str, drafts, q_rows, p_rows, tokens, n_emitted) -> None:
    for observer in list(_OBSERVERS):
        observer(label, drafts, q_rows, p_rows, tokens, n_emitted)


def notify_sequences(label: str, prompt, seqs, from_draft, target_probs, draft_probs) -> None:
    """A whole loop's sequences [n, L] and provenance (True: an accepted draft), with the target's and
    the draft's teacher-forced rows (functions of token arrays), for observers that take them."""
    for observer in list(_OBSERVERS):
        if hasattr(observer, "sequences"):
            observer.sequences(label, prompt, seqs, from_draft, target_probs, draft_probs)
