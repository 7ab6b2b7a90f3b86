"""Run a host sampler on random pairs and record its rounds, as an engine's log would.

The sampler follows the host convention (:mod:`specsample.host`): ``fn(drafts, q, p, rng) ->
(tokens, n_emitted)`` on a batch, with q (b, k, V) and p (b, k + 1, V) probabilities. Drafts are
drawn from q here; the records keep the compact fields (and the full rows with ``rows="probs"``).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..models.pairs import make_pair
from .records import table, write_records


def record_sampler(fn, path: str, *, family: str = "dirichlet", pairs: int = 4, vocab: int = 8, k: int = 4,
                   rounds: int = 20_000, batch: int = 4096, seed: int = 0, rows=None, rule: str = "standard",
                   request_prefix: str = "") -> str:
    """Record ``rounds`` rounds of ``fn`` (spread over ``pairs`` context-free pairs of ``family``) to ``path``.

    Each pair is one request id (``pair0``, ``pair1``, ..., after ``request_prefix``); its rounds are
    numbered from 0. Files that an audit reads together need distinct request ids (a prefix each).

    Examples
    --------
    >>> record_sampler(my_sampler, "rounds.parquet", rounds=50_000)  # doctest: +SKIP
    """
    rng = np.random.default_rng(seed)
    tables = []
    per_pair = -(-rounds // pairs)
    for i in range(pairs):
        pr = make_pair(family, seed * 1000 + i, vocab)
        p_row = np.asarray(pr.target.table, np.float64)[0]
        q_row = np.asarray(pr.draft.table, np.float64)[0]
        for start in range(0, per_pair, batch):
            b = min(batch, per_pair - start)
            drafts = np.stack([rng.choice(vocab, size=b, p=q_row / q_row.sum()) for _ in range(k)], 1)
            q = np.broadcast_to(q_row, (b, k, vocab)).copy()
            p = np.broadcast_to(p_row, (b, k + 1, vocab)).copy()
            tokens, n = fn(drafts, q, p, rng)
            tables.append(table(f"{request_prefix}pair{i}", np.arange(start, start + b), drafts, np.asarray(tokens),
                                np.asarray(n), q, p, rule=rule, rows=rows))
    return write_records(path, tables)


class RecordSink:
    """An observer (:func:`specsample.host.observe.observe`) that writes the rounds it is shown to
    ``folder`` as record files of about ``per_file`` rounds: compact fields only, computed from the
    rows in slices, so a large vocabulary costs no large array. ``request_id`` is the case label and
    ``round`` counts that case's rounds; :meth:`close` writes what is left and returns the files."""

    def __init__(self, folder: str, per_file: int = 262_144, rule: str = "standard", loop_k: Optional[int] = None):
        import os

        os.makedirs(folder, exist_ok=True)
        self.folder, self.per_file, self.rule, self.loop_k = folder, per_file, rule, loop_k
        self.tables, self.pending, self.files, self.rounds = [], 0, [], {}

    def sequences(self, label, prompt, seqs, from_draft, target_probs, draft_probs) -> None:
        """A whole loop's sequences: the rounds they reveal (:mod:`.loop_rounds`), for a loop of draft
        length ``loop_k``; ``request_id`` is ``label/i`` for sequence i."""
        from .loop_rounds import loop_rounds

        if self.loop_k is None:
            raise ValueError("recording a whole loop needs its draft length: RecordSink(..., loop_k=K)")
        f = loop_rounds(prompt, seqs, from_draft, target_probs, draft_probs, self.loop_k, self.rule)
        ids = np.char.add(f"{label}/", f["sequence"].astype(str))
        fields = {n: f[n] for n in ("q_draft", "p_draft", "q_cdf_lo", "q_cdf_hi", "stop_cdf_lo", "stop_cdf_hi",
                                    "accept_rate")}
        self.tables.append(table(ids, f["round"], f["drafts"], f["tokens"], f["n_emitted"], rule=self.rule,
                                 fields=fields))
        self.rounds[label] = self.rounds.get(label, 0) + int(f["round"].size)
        self.pending += int(f["round"].size)
        if self.pending >= self.per_file:
            self._flush()

    def __call__(self, label, drafts, q_rows, p_rows, tokens, n_emitted):
        from .fields import compact_fields

        b, k = drafts.shape
        v = q_rows.shape[-1]
        step = max(1, (1 << 24) // max(1, (2 * k + 1) * v))  # rows of at most 16M floats at a time
        first = self.rounds.get(label, 0)
        for s in range(0, b, step):
            e = min(b, s + step)
            f = compact_fields(drafts[s:e], tokens[s:e], n_emitted[s:e], q_rows[s:e], p_rows[s:e], rule=self.rule)
            self.tables.append(table(label, np.arange(first + s, first + e), drafts[s:e], tokens[s:e],
                                     n_emitted[s:e], rule=self.rule, fields=f))
        self.rounds[label] = first + b
        self.pending += b
        if self.pending >= self.per_file:
            self._flush()

    def _flush(self):
        import os

        if self.tables:
            path = os.path.join(self.folder, f"rounds-{len(self.files) + 1:05d}.parquet")
            self.files.append(write_records(path, self.tables))
        self.tables, self.pending = [], 0

    def close(self) -> list:
        self._flush()
        return self.files
