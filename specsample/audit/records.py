"""The record format (``specsample-record/1``): Apache Arrow tables, as Parquet or Arrow IPC files, or JSON Lines.

One row per round; the columns and their meaning are specified in ``docs/records.md``. Any Arrow
writer in any language writes them; this module writes them from numpy (:func:`write_records`) and
streams them back in batches (:func:`read_batches`), so data larger than memory is audited in
constant memory. pyarrow is an optional extra: ``pip install -e ".[audit]"``.
"""

from __future__ import annotations

import hashlib
import os
from typing import Iterator, Optional

import numpy as np

from . import validate
from .fields import RULES, accept_rate, compact_fields

VERSION = "2"  # 2: the rank-order intervals (RANK) beside version 1's fields; both are read
READS = ("1", "2")
REQUIRED = ("request_id", "round", "k", "drafts", "emitted")
COMPACT = ("q_draft", "p_draft", "q_cdf_lo", "q_cdf_hi", "stop_cdf_lo", "stop_cdf_hi")
RANK = ("q_rank_lo", "q_rank_hi", "stop_rank_lo", "stop_rank_hi")  # format 2, optional: the PIT in rank order
ROWS = (("q_rows", "p_rows", False), ("q_logits", "p_logits", True))  # full rows: probabilities, or logits
SUFFIXES = (".parquet", ".arrow", ".feather", ".ipc", ".jsonl")
ROW_GROUP = 131_072  # rounds per Parquet row group: the unit that --workers share out


class RecordError(ValueError):
    """A record file that cannot be audited: the message says what is wrong and how to fix it."""


def _pa():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise RecordError("reading or writing records needs pyarrow: pip install -e \".[audit]\" (or pip install "
                          "pyarrow)") from None
    return pyarrow


def schema(rule: str = "standard", rows: Optional[str] = None, compact: bool = True, accept_rate: bool = False):
    """The Arrow schema of a record file: required columns, compact fields and/or full rows.

    ``rows``: None, ``"probs"`` (``q_rows``/``p_rows``) or ``"logits"`` (``q_logits``/``p_logits``).
    ``accept_rate``: the optional column of a writer that does not log every draft (a whole loop).
    """
    pa = _pa()
    if rule not in RULES:
        raise RecordError(f"unknown rule {rule!r}; records follow one of {', '.join(RULES)}")
    fields = [pa.field("request_id", pa.string(), nullable=False), pa.field("round", pa.int64(), nullable=False),
              pa.field("k", pa.int32(), nullable=False), pa.field("drafts", pa.list_(pa.int32())),
              pa.field("emitted", pa.list_(pa.int32()))]
    if compact:
        fields += [pa.field(n, pa.list_(pa.float64())) for n in COMPACT[:4] + RANK[:2]]
        fields += [pa.field(n, pa.float64()) for n in COMPACT[4:] + RANK[2:]]
    if accept_rate:
        fields.append(pa.field("accept_rate", pa.list_(pa.float64())))
    if rows is not None:
        names = {"probs": ROWS[0], "logits": ROWS[1]}[rows][:2]
        fields += [pa.field(n, pa.list_(pa.list_(pa.float32()))) for n in names]
    return pa.schema(fields, metadata={"specsample.record": VERSION, "specsample.rule": rule})


def table(request_id, round_, drafts, tokens, n_emitted, q=None, p=None, *, rule: str = "standard",
          rows: Optional[str] = None, compact: bool = True, fields: Optional[dict] = None):
    """An Arrow table of ``b`` rounds from numpy arrays (shapes as :func:`~.fields.compact_fields`).

    ``rows`` keeps the full rows (``"probs"`` or ``"logits"``: what ``q`` and ``p`` are);
    ``compact`` the compact fields, computed here from ``q`` and ``p`` unless ``fields`` gives them.
    """
    pa = _pa()
    drafts = np.asarray(drafts, np.int32)
    tokens = np.asarray(tokens, np.int32)
    n_emitted = np.asarray(n_emitted, np.int64)
    b, k = drafts.shape
    cols = {"request_id": pa.array(np.broadcast_to(np.asarray(request_id).astype(str), (b,)).tolist(), pa.string()),
            "round": pa.array(np.broadcast_to(np.asarray(round_, np.int64), (b,))),
            "k": pa.array(np.full(b, k, np.int32)),
            "drafts": _list(pa, drafts),
            "emitted": pa.ListArray.from_arrays(np.concatenate([[0], np.cumsum(n_emitted)]).astype(np.int32),
                                                pa.array(tokens[np.arange(k + 1)[None, :] < n_emitted[:, None]]))}
    if compact:
        f = fields if fields is not None else compact_fields(drafts, tokens, n_emitted, q, p, rule=rule,
                                                             logits=rows == "logits")
        if not all(n in f for n in RANK):  # fields given by hand, of format 1: no rank order to write
            f = {**f, **{n: np.full(np.shape(f[COMPACT[0 if i < 2 else 4]]), np.nan) for i, n in enumerate(RANK)}}
        for n in COMPACT[:4] + RANK[:2]:
            cols[n] = _list(pa, np.asarray(f[n], np.float64))
        for n in COMPACT[4:] + RANK[2:]:
            cols[n] = pa.array(np.asarray(f[n], np.float64))
        if "accept_rate" in f:
            cols["accept_rate"] = _list(pa, np.asarray(f["accept_rate"], np.float64))
    if rows is not None:
        qn, pn = {"probs": ROWS[0], "logits": ROWS[1]}[rows][:2]
        cols[qn], cols[pn] = _nested(pa, np.asarray(q, np.float32)), _nested(pa, np.asarray(p, np.float32))
    return pa.Table.from_pydict(cols, schema=schema(rule, rows, compact, accept_rate="accept_rate" in cols))


def _list(pa, a: np.ndarray):
    b, w = a.shape
    offsets = np.arange(b + 1, dtype=np.int32) * w  # w = 0: a round of no drafts holds empty lists
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(a.ravel()))


def _nested(pa, a: np.ndarray):
    b, s, v = a.shape  # s = 0: a round of no drafts holds no draft rows
    inner = pa.ListArray.from_arrays(pa.array(np.arange(b * s + 1, dtype=np.int32) * v), pa.array(a.ravel()))
    return pa.ListArray.from_arrays(pa.array(np.arange(b + 1, dtype=np.int32) * s), inner)


def write_records(path: str, tables) -> str:
    """Write one table (or several, of one schema) to ``path``: Parquet (``.parquet``) or Arrow IPC."""
    pa = _pa()
    tables = [tables] if not isinstance(tables, (list, tuple)) else list(tables)
    if not path.endswith(SUFFIXES):
        raise RecordError(f"{path!r}: give a record file a suffix of {', '.join(SUFFIXES)}")
    whole = pa.concat_tables(tables)
    if path.endswith(".jsonl"):
        _write_jsonl(path, whole)
        return path
    if path.endswith(".parquet"):
        pa.parquet.write_table(whole, path, row_group_size=ROW_GROUP)
    else:
        with pa.ipc.new_file(path, whole.schema) as w:
            w.write_table(whole)
    return path


def _write_jsonl(path: str, t) -> None:
    """One header line, then one JSON object a round (NaN written as null)."""
    import json

    meta = {k.decode(): v.decode() for k, v in (t.schema.metadata or {}).items()}

    def clean(v):
        if isinstance(v, float) and v != v:
            return None
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    with open(path, "w") as f:
        f.write(json.dumps(meta) + "\n")
        for row in t.to_pylist():
            f.write(json.dumps({k: clean(v) for k, v in row.items()}, allow_nan=False) + "\n")


def files(paths) -> list:
    """The record files under ``paths`` (files, or folders searched recursively), sorted."""
    out = []
    for path in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        path = os.fspath(path)
        if os.path.isdir(path):
            for root, _, names in os.walk(path):
                out += [os.path.join(root, n) for n in names if n.endswith(SUFFIXES)]
        elif os.path.exists(path):
            out.append(path)
        else:
            raise RecordError(f"{path!r} does not exist; give record files or folders of them")
    if not out:
        raise RecordError(f"no record files ({', '.join(SUFFIXES)}) under {', '.join(map(str, paths))}")
    return sorted(out)


def _parquet(path: str, mapped: bool = False):
    """The Parquet file at ``path``, or a one-line :class:`RecordError` (pyarrow's own says nothing of the file).
    ``mapped`` memory-maps it (the pages are decoded where they lie, without a copy: a quarter less CPU)."""
    pa = _pa()
    try:
        return pa.parquet.ParquetFile(path, memory_map=mapped)
    except (pa.ArrowException, OSError) as e:
        raise RecordError(f"{path}: not a readable Parquet file ({e})") from None


# each column's Arrow type when read from JSON Lines (JSON has no types of its own: 0 would read as an integer)
def _json_types(pa) -> dict:
    floats, ints = pa.list_(pa.float64()), pa.list_(pa.int32())
    return {"request_id": pa.string(), "round": pa.int64(), "k": pa.int32(), "drafts": ints, "emitted": ints,
            **{n: floats for n in COMPACT[:4] + RANK[:2]}, **{n: pa.float64() for n in COMPACT[4:] + RANK[2:]},
            "accept_rate": floats,
            **{n: pa.list_(floats) for pair in ROWS for n in pair[:2]}}


def _open_jsonl(path: str, batch_size: int):
    """A JSON Lines record file: a header object (``{"specsample.record": "1", "specsample.rule": ...}``),
    then one object a round with the columns of the format; null in a float field reads as NaN."""
    import json

    pa = _pa()
    import pyarrow.json  # noqa: F401

    f = open(path, "rb")
    try:
        head = json.loads(f.readline() or b"null")
    except ValueError as e:
        f.close()
        raise RecordError(f"{path}: the first line is not a JSON object ({e}); a JSON Lines record file starts with "
                          "a header line such as {\"specsample.record\": \"1\", \"specsample.rule\": \"standard\"}") from None
    if not isinstance(head, dict) or "specsample.record" not in head:
        f.close()
        raise RecordError(f"{path}: the first line is no header; a JSON Lines record file starts with "
                          "{\"specsample.record\": \"1\", \"specsample.rule\": \"standard\"} (docs/records.md)")
    start = f.tell()
    first = f.readline()
    f.seek(start)
    try:
        names = list(json.loads(first)) if first.strip() else []
    except ValueError as e:
        f.close()
        raise RecordError(f"{path}: line 2 is not a JSON object ({e})") from None
    types = _json_types(pa)
    schema = pa.schema([(n, types[n]) for n in names if n in types])
    meta = {str(k): str(v) for k, v in head.items()}
    try:
        reader = pa.json.open_json(f, read_options=pa.json.ReadOptions(block_size=max(1 << 20, batch_size * 64)),
                                   parse_options=pa.json.ParseOptions(explicit_schema=schema,
                                                                      unexpected_field_behavior="infer"))
    except pa.ArrowException as e:
        f.close()
        raise RecordError(f"{path}: not readable as JSON Lines ({e})") from None
    schema = schema.with_metadata(meta)

    def batches():
        try:
            for b in reader:
                cols = [_nan_for_null(pa, c) for c in b.columns]
                yield pa.RecordBatch.from_arrays(cols, schema=schema)
        except pa.ArrowException as e:
            raise RecordError(f"{path}: not readable as JSON Lines ({e})") from None
        finally:
            f.close()

    return (schema if names else schema), batches()


def _nan_for_null(pa, col):
    """A float column (or list of floats) of JSON Lines with null read as NaN: JSON has no NaN."""
    t = col.type
    if pa.types.is_floating(t):
        return col.fill_null(float("nan"))
    if pa.types.is_list(t) and pa.types.is_floating(t.value_type) and col.null_count == 0:
        return pa.ListArray.from_arrays(col.offsets, col.flatten().fill_null(float("nan")))
    return col


def _open(path: str, batch_size: int, row_groups=None, mapped: bool = False):
    pa = _pa()
    if path.endswith(".jsonl"):
        return _open_jsonl(path, batch_size)
    if path.endswith(".parquet"):
        f = _parquet(path, mapped)
        return f.schema_arrow, f.iter_batches(batch_size=batch_size, row_groups=row_groups)
    try:
        reader = pa.ipc.open_file(path)
        return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))
    except pa.ArrowInvalid:
        pass
    try:  # an Arrow IPC stream rather than a file
        reader = pa.ipc.open_stream(path)
    except (pa.ArrowException, OSError) as e:
        raise RecordError(f"{path}: neither an Arrow IPC file or stream nor Parquet ({e}); record files are written "
                          "by specsample.audit.write_records or any Arrow writer (see docs/records.md)") from None
    return reader.schema, iter(reader)


def check_schema(path: str, sch) -> tuple[str, Optional[tuple]]:
    """The rule and the full-row columns of a file's schema; a one-line :class:`RecordError` if unusable."""
    meta = {k.decode(): v.decode() for k, v in (sch.metadata or {}).items()}
    version = meta.get("specsample.record")
    if version is None:
        raise RecordError(f"{path}: no 'specsample.record' in the schema's metadata; a record file declares its "
                          f"format version (\"{VERSION}\") and rule (see docs/records.md)")
    if version not in READS:
        raise RecordError(f"{path}: record format version {version!r}; this specsample reads versions "
                          f"{', '.join(repr(v) for v in READS)}")
    rule = meta.get("specsample.rule", "standard")
    if rule not in RULES:
        raise RecordError(f"{path}: unknown rule {rule!r} in the metadata; one of {', '.join(RULES)}")
    names = set(sch.names)
    try:
        validate.check_types(sch, _pa())
    except validate.Bad as e:
        raise RecordError(f"{path}: column '{e.column}' {e.what}") from None
    missing = [n for n in REQUIRED if n not in names]
    if missing:
        raise RecordError(f"{path}: missing column{'s' * (len(missing) > 1)} {', '.join(missing)} (see docs/records.md)")
    rows = next((r for r in ROWS if r[0] in names and r[1] in names), None)
    if rows is None and not all(n in names for n in COMPACT):
        absent = [n for n in COMPACT if n not in names]
        raise RecordError(f"{path}: neither full rows (q_rows/p_rows or q_logits/p_logits) nor the compact fields "
                          f"({', '.join(absent)} missing): the laws cannot be recomputed")
    return rule, rows


def work_units(paths, parts: int) -> list:
    """``(path, row_groups)`` units for ``parts`` workers: a Parquet file's row groups in up to ``parts``
    slices, other files whole (``None``)."""
    _pa()  # without pyarrow, its one-line error here, whatever the files
    units = []
    for path in files(paths):
        if path.endswith(".parquet"):
            n = _parquet(path).num_row_groups
            units += [(path, list(g)) for g in np.array_split(np.arange(n), min(parts, max(n, 1))) if len(g)]
        else:
            units.append((path, None))
    return units


def read_batches(paths, batch_size: int = 65_536, row_groups=None, ahead: bool = False, mapped: bool = False
                 ) -> Iterator[tuple[str, str, dict]]:
    """``(path, rule, batch)`` for every batch of every file; a batch is a dict of numpy arrays of rounds
    of one k: ``request_id`` (Arrow strings), ``request_hash``, ``round``, ``drafts`` (b, k), ``tokens``
    (b, k + 1), ``n_emitted``, and the compact fields, recomputed from the full rows where a file has
    them. ``row_groups`` reads only those of a (single) Parquet file. With ``ahead``, each file's Arrow
    batches are read a batch ahead in a thread of their own (:func:`prefetched`) and decoded here.
    ``mapped`` memory-maps Parquet files: for files at rest (the batch audit's), not for a folder being
    written (a file cut short under a map ends the process)."""
    for path in files(paths):
        sch, batches = _open(path, batch_size, row_groups, mapped)
        rule, rows = check_schema(path, sch)
        start = 0
        batches = _readable(path, batches)
        for batch in prefetched(batches) if ahead else batches:
            with _named(path, start):
                validate.check_nulls(batch, sch.names)
                ks = batch.column("k").to_numpy(zero_copy_only=False)
                if ks.size and ks.min() < 0:
                    raise validate.Bad("k", int(np.flatnonzero(ks < 0)[0]), "is negative; k counts the drafts")
            kinds = ks[:1] if ks.size and ks.min() == ks.max() else np.unique(ks)  # usually one k a batch
            for k in kinds:  # rounds of one k together (a batch is usually of one k already)
                where = None if kinds.size == 1 else np.flatnonzero(ks == k)  # the batch's rows, or these
                part = batch if kinds.size == 1 else batch.filter(_pa().array(ks == k))
                with _named(path, start, where):
                    decoded = _decode(part, int(k), rule, rows)
                yield path, rule, decoded
            start += batch.num_rows
        if start == 0 and row_groups is None:
            raise RecordError(f"{path}: no rounds (the file holds no rows); a record file holds one row a round")


def _readable(path: str, batches) -> Iterator:
    """A file's Arrow batches; a page that cannot be decoded (a damaged file) is a one-line :class:`RecordError`
    naming the file and the rounds read before it, not pyarrow's message of several lines."""
    pa, read = _pa(), 0
    it = iter(batches)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as e:
            said = " ".join("".join(c if c.isprintable() else " " for c in str(e)).split())
            raise RecordError(f"{path}: damaged after its first {read:,} rounds ({said}); "
                              "write it again, or audit the other files without it") from None
        read += batch.num_rows
        yield batch


def prefetched(batches: Iterator, depth: int = 2) -> Iterator:
    """``batches`` read ``depth`` ahead in a thread of their own: pyarrow decodes a file's next batch (its
    C++ reader releases the GIL) while the caller checks and counts this one, so a serial audit uses a
    second core.
    The same batches in the same order; an error of the reader is raised here, where the batch it stopped
    at would have come; a consumer that stops early (an error, Ctrl-C) lets the reader end at its next batch."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(entry) -> bool:  # False once the consumer has stopped
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read():
        try:
            for item in batches:
                if not put((item, None)):
                    return
            put((done, None))
        except BaseException as e:  # handed over to the consumer, raised there
            put((done, e))

    reader = threading.Thread(target=read, name="specsample-record-reader", daemon=True)
    reader.start()
    try:
        while True:
            item, error = q.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()


class _named:
    """Turns a :class:`validate.Bad` into a one-line :class:`RecordError` naming the file, column and row
    (the row counted within the file; ``where`` maps a filtered batch's rows back)."""

    def __init__(self, path: str, start: int, where=None):
        self.path, self.start, self.where = path, start, where

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, validate.Bad):
            row = "" if exc.row is None else \
                f", row {self.start + (exc.row if self.where is None else int(self.where[exc.row]))}"
            raise RecordError(f"{self.path}: column '{exc.column}'{row} {exc.what}") from None
        return False


def id_hash(ids) -> np.ndarray:
    """A 64-bit hash of each request id (its text), the same in every file and process."""
    return np.array([int.from_bytes(hashlib.blake2b(str(u).encode(), digest_size=8).digest(), "little")
                     for u in ids], np.uint64)


def _flat(col) -> tuple[np.ndarray, np.ndarray]:
    offsets = col.offsets.to_numpy()
    return col.flatten().to_numpy(zero_copy_only=False), np.diff(offsets)


def _decode(batch, k: int, rule: str, rows) -> dict:
    b = batch.num_rows
    ids = batch.column("request_id").dictionary_encode()  # hash each distinct id once
    out = {"request_id": batch.column("request_id"),  # Arrow: read one when a violation is worded
           "request_hash": id_hash(ids.dictionary.to_pylist())[ids.indices.to_numpy(zero_copy_only=False)],
           "round": batch.column("round").to_numpy(zero_copy_only=False).astype(np.int64, copy=False), "k": k}
    drafts, lengths = _flat(batch.column("drafts"))
    validate.check_lengths("drafts", lengths, k, f"the round's k = {k} drafted tokens")
    out["drafts"] = drafts.reshape(b, k).astype(np.int64, copy=False)
    col = batch.column("emitted")
    offsets = col.offsets.to_numpy()
    emitted, n = col.flatten().to_numpy(zero_copy_only=False), np.diff(offsets)
    tokens = np.full((b, k + 1), -1, np.int64)
    ok = (n >= 1) & (n <= k + 1)  # a round emitting none or more than k + 1 is counted invalid, its tokens -1
    start = (offsets[:-1] - offsets[0]).astype(np.intp)
    for j in range(k + 1):  # slot by slot, the rounds that emitted a token there
        at = np.flatnonzero((n > j) & ok)
        tokens[at, j] = emitted[start[at] + j]
    out["tokens"], out["n_emitted"] = tokens, np.where(ok, n, 0).astype(np.int64)
    if "accept_rate" in batch.schema.names:  # a writer that did not log every draft (docs/records.md)
        vals, lengths = _flat(batch.column("accept_rate"))
        validate.check_lengths("accept_rate", lengths, k, "one a draft slot")
        out["accept_rate"] = vals.reshape(b, k).astype(np.float64, copy=False)
        validate.check_rates(out["accept_rate"])
    if rows is not None:
        out.update(_from_rows(batch, out, tokens, k, rule, rows))
    else:
        names = batch.schema.names
        rank = all(n in names for n in RANK)  # format 2's rank-order intervals, when written
        for name in COMPACT[:4] + (RANK[:2] if rank else ()):
            vals, lengths = _flat(batch.column(name))
            validate.check_lengths(name, lengths, k, "one a draft slot")
            out[name] = vals.reshape(b, k).astype(np.float64, copy=False)  # read-only views of Arrow's buffers
        for name in COMPACT[4:] + (RANK[2:] if rank else ()):
            out[name] = batch.column(name).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        if rank and np.isnan(out["stop_rank_lo"]).all():  # a writer of format 1's fields only: no rank order
            for name in RANK:
                del out[name]
    validate.check_compact(out, k)
    return out


def _from_rows(batch, out: dict, tokens: np.ndarray, k: int, rule: str, rows) -> dict:
    """The compact fields recomputed from a batch's full rows (checked at the slots the rounds reached)."""
    b = batch.num_rows
    qn, pn, logits = rows
    shapes = {}
    for name, slots in ((qn, k), (pn, k + 1)):
        col = batch.column(name)
        validate.check_lengths(name, np.diff(col.offsets.to_numpy()), slots, f"k = {k}: one row a slot, "
                               f"{'k' if name == qn else 'k + 1'} rows")
        vals, widths = _flat(col.flatten())
        shapes[name] = (vals, widths)
    widths = np.concatenate([shapes[qn][1], shapes[pn][1]])
    v = int(widths[0]) if widths.size else 0
    for name in (qn, pn):  # every row of V tokens, the same V in both models
        w = shapes[name][1].reshape(b, -1)
        bad = np.flatnonzero(np.any(w != v, axis=1))
        if bad.size:
            raise validate.Bad(name, int(bad[0]), f"holds rows of {sorted(set(w[bad[0]].tolist()))} tokens where "
                                                  f"{v} are expected (one V for both models' rows)")
    q = shapes[qn][0].reshape(b, k, v).astype(np.float64)
    p = shapes[pn][0].reshape(b, k + 1, v).astype(np.float64)
    used = validate.reached(out["n_emitted"], k)
    drafts = out["drafts"]
    # the draft's rows read: every logged draft's (drafting's PIT), and every reached slot's (the residual,
    # the acceptance rate), logged draft or not
    read_q = (drafts >= 0) | used[:, :k]
    q = validate.check_rows(qn, q, read_q, logits)
    p = validate.check_rows(pn, p, used, logits)
    # a row nobody reads (the target's after the stop, the draft's after the stop at a draft not logged) may
    # hold NaN: made harmless here, never read
    q = np.where(read_q[..., None], q, 0.0 if logits else 1.0 / max(v, 1))
    p = np.where(used[..., None], p, 0.0 if logits else 1.0 / max(v, 1))
    # an id outside [0, V) gets probability 0 there (and fails valid-records): no clipping
    fields = compact_fields(drafts, tokens, np.maximum(out["n_emitted"], 1), q, p, rule=rule, logits=logits)
    unlogged = drafts < 0
    if unlogged.any():  # drafts not logged (-1): their fields are unknown, and acceptance is tested on average
        for name in COMPACT[:4] + RANK[:2]:
            fields[name] = np.where(unlogged, np.nan, fields[name])
        if "accept_rate" not in out:
            qp = np.exp(q - q.max(-1, keepdims=True)) if logits else q
            pp = np.exp(p - p.max(-1, keepdims=True)) if logits else p
            if logits:
                qp, pp = qp / qp.sum(-1, keepdims=True), pp / pp.sum(-1, keepdims=True)
            rate = accept_rate(qp, pp[:, :k], rule) if k else np.zeros((b, 0))
            fields["accept_rate"] = np.where(used[:, :k], rate, np.nan)
    fields["vocab"] = v
    return fields
