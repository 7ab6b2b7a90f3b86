"""The audit's fast paths say what the plain computations say, bit for bit and check for check.

A tally counts a batch in slices that stay in cache, sums columns by a matrix-vector product, tests
slot by slot and bins every PIT in one count; the checks of the compact fields first look at each
column's minimum and maximum. Each is held here to the plain form it replaces, on batches built to
reach its edges (every k, invalid rounds, zero laws, NaN where the format allows it). A file read
memory-mapped and a batch ahead that turns out damaged is still one line naming it."""

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")

from specsample.audit import counting, validate  # noqa: E402
from specsample.audit.counting import BINS, PIT_STAGES, Tally, pit_bins, round_keys64, uniforms  # noqa: E402


def _batch(b=40_000, k=4, seed=0, invalid=0.0, zeros=0.0):
    """A decoded batch as read_batches gives it: random compact fields, some rounds invalid or of zero laws."""
    rng = np.random.default_rng(seed)
    drafts = rng.integers(0, 50, (b, k))
    n = rng.integers(1, k + 2, b)
    tokens = np.full((b, k + 1), -1, np.int64)
    for j in range(k + 1):
        tokens[:, j] = np.where(j < n - 1, drafts[:, j] if j < k else 0, np.where(j == n - 1, rng.integers(0, 50, b), -1))
    if invalid:
        bad = rng.random(b) < invalid
        tokens[bad, 0] = np.where(n[bad] > 1, drafts[bad, 0] + 1, tokens[bad, 0])  # not the accepted draft
    q = rng.random((b, k)) * 0.5
    p = rng.random((b, k)) * 0.5
    lo = rng.random((b, k)) * 0.5
    s_lo = rng.random(b) * 0.5
    s_hi = s_lo + rng.random(b) * 0.5
    if zeros:
        q[rng.random((b, k)) < zeros] = 0.0
        z = rng.random(b) < zeros
        s_hi[z] = s_lo[z]
    ids = pa.array([f"r{i // 100}" for i in range(b)])
    return {"request_id": ids, "request_hash": counting._splitmix(np.arange(b, dtype=np.uint64) // 100),
            "round": np.arange(b) % 100, "k": k, "drafts": drafts, "tokens": tokens, "n_emitted": n,
            "q_draft": q, "p_draft": p, "q_cdf_lo": lo, "q_cdf_hi": lo + q, "q_rank_lo": lo[:, ::-1].copy(),
            "q_rank_hi": lo[:, ::-1] + q, "stop_cdf_lo": s_lo, "stop_cdf_hi": s_hi,
            "stop_rank_lo": s_lo * 0.9, "stop_rank_hi": s_hi * 0.9 + 0.05}


def _plain(batch, rule="standard", seed=3):
    """The counts as computed before the fast paths: whole arrays, reductions along the short axis."""
    k, drafts, tokens, n = batch["k"], batch["drafts"], batch["tokens"], batch["n_emitted"]
    b = drafts.shape[0]
    slots = np.arange(k)
    n_acc = n - 1
    prefix = np.all((slots[None, :] >= n_acc[:, None]) | (tokens[:, :k] == drafts), axis=1)
    ok = (n >= 1) & (n <= k + 1) & prefix & (tokens[np.arange(b), np.clip(n_acc, 0, k)] >= 0)
    ok &= np.all(~(slots[None, :] <= n_acc[:, None]) | (drafts >= 0), axis=1)
    sel = {key: (v[ok] if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == b else v) for key, v in batch.items()}
    q, p, n_acc = sel["q_draft"], sel["p_draft"], sel["n_emitted"] - 1
    a = np.minimum(1.0, p / np.where(q > 0, q, 1.0)) if rule == "standard" else p
    zero_q = q <= 0
    tested, acc = slots[None, :] <= n_acc[:, None], slots[None, :] < n_acc[:, None]
    t = tested & ~zero_q
    out = {"rounds": int(ok.sum()), "invalid": int((~ok).sum()), "draft_zero": int(zero_q.sum()),
           "tested": t.sum(0), "accepted": (acc & t).sum(0),
           "mean": np.rint(np.where(t, a, 0) * 2.0 ** 32).astype(np.int64).sum(0),
           "var": np.rint(np.where(t, a * (1 - a), 0) * 2.0 ** 32).astype(np.int64).sum(0)}
    u = uniforms(seed, sel["request_hash"], sel["round"], k + 1)
    pit = {s: np.zeros(BINS, np.int64) for s in PIT_STAGES}
    for order, (lo, hi, slo, shi) in {"": ("q_cdf_lo", "q_cdf_hi", "stop_cdf_lo", "stop_cdf_hi"),
                                      "[rank]": ("q_rank_lo", "q_rank_hi", "stop_rank_lo", "stop_rank_hi")}.items():
        v = (sel[lo] + u[:, :k] * (sel[hi] - sel[lo]))[~zero_q]
        pit["drafting" + order] += np.bincount(pit_bins(v), minlength=BINS)
        zero = sel["stop_cdf_hi"] - sel["stop_cdf_lo"] <= 0  # a token of probability 0: a hard check, no PIT
        bonus = n_acc >= k
        v = sel[slo] + u[:, k] * (sel[shi] - sel[slo])
        pit["rejection" + order] += np.bincount(pit_bins(v[~bonus & ~zero]), minlength=BINS)
        pit["bonus" + order] += np.bincount(pit_bins(v[bonus & ~zero]), minlength=BINS)
    out["pit"] = pit
    return out


@pytest.mark.parametrize("k, invalid, zeros, b", [(4, 0.0, 0.0, 40_000), (4, 0.05, 0.01, 40_000),
                                                  (1, 0.02, 0.02, 17_000), (7, 0.0, 0.0, 16_384), (4, 0.0, 0.0, 5)])
def test_a_tally_counts_what_the_plain_computation_counts(k, invalid, zeros, b):
    batch = _batch(b=b, k=k, invalid=invalid, zeros=zeros, seed=k)
    t = Tally(k)
    t.add(batch, "standard", 3, "x.parquet")
    want = _plain(batch)
    for field in ("rounds", "invalid", "draft_zero"):
        assert getattr(t, field) == want[field], field
    for field in ("tested", "accepted", "mean", "var"):
        np.testing.assert_array_equal(getattr(t, field), want[field], err_msg=field)
    for stage in PIT_STAGES:
        np.testing.assert_array_equal(t.pit[stage], want["pit"][stage], err_msg=stage)
    assert np.array_equal(np.concatenate(t.keys), round_keys64(batch, 3))


def test_the_slices_of_a_batch_add_up_to_the_batch_counted_whole(monkeypatch):
    batch = _batch(b=50_000, invalid=0.03, zeros=0.01, seed=11)
    sliced = Tally(4)
    sliced.add(batch, "standard", 0, "x")
    monkeypatch.setattr(counting, "_ROWS", 10 ** 9)
    whole = Tally(4)
    whole.add(batch, "standard", 0, "x")
    assert sliced.first == whole.first and sliced.first
    for field in ("rounds", "invalid", "draft_zero", "stop_zero", "impossible", "tested", "accepted", "mean", "var"):
        assert np.array_equal(getattr(sliced, field), getattr(whole, field)), field
    assert all(np.array_equal(sliced.pit[s], whole.pit[s]) for s in PIT_STAGES)


def test_column_sums_are_exact_integers():
    rng = np.random.default_rng(0)
    for b in (1, 1000, 2 ** 14, 2 ** 20):
        x = np.rint(rng.random((b, 3)) * 2.0 ** 32)  # the fixed-point sums' largest terms
        np.testing.assert_array_equal(counting._column_sums(x), x.astype(np.int64).sum(0))
    flags = rng.random((5000, 4)) < 0.3
    np.testing.assert_array_equal(counting._column_sums(flags), flags.sum(0))
    big = np.full((2 ** 20 + 1, 2), 2.0 ** 32)  # past 2^53 in float: summed in integers
    np.testing.assert_array_equal(counting._column_sums(big), np.full(2, (2 ** 20 + 1) * 2 ** 32))


def test_uniforms_are_the_hash_as_specified():
    # the audit's uniforms are part of its contract (the same seed, the same counts, in every version):
    # SplitMix64 of (seed, request hash, round, slot), 53 bits centred in their cell
    m = np.uint64(0xFFFFFFFFFFFFFFFF)

    def splitmix(x):
        with np.errstate(over="ignore"):
            x = (x + np.uint64(0x9E3779B97F4A7C15)) & m
            x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & m
            x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & m
            return x ^ (x >> np.uint64(31))

    rng = np.random.default_rng(2)
    h = rng.integers(0, 2 ** 63, 20_000).astype(np.uint64)
    r = rng.integers(0, 10 ** 6, 20_000)
    with np.errstate(over="ignore"):
        base = splitmix(splitmix(h ^ splitmix(np.uint64(7))) ^ r.astype(np.uint64))
        x = splitmix(base[:, None] + np.arange(1, 6, dtype=np.uint64)[None, :])
    want = ((x >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
    np.testing.assert_array_equal(uniforms(7, h, r, 5), want)


def _exact_verdict(out, k, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(validate, "_within", lambda *a: False)
        try:
            validate.check_compact(out, k)
            return None
        except validate.Bad as e:
            return (e.column, e.row, e.what)


@pytest.mark.parametrize("column, value, rows_logged", [
    ("q_cdf_hi", 1 + validate.CDF_TOL * 0.9, True), ("q_cdf_hi", 1 + validate.CDF_TOL * 1.1, True),
    ("q_draft", -validate.CDF_TOL * 0.5, True), ("q_draft", -validate.CDF_TOL * 2, True),
    ("stop_rank_hi", 1.5, True), ("p_draft", np.nan, True), ("q_draft", np.nan, False),
    ("q_cdf_lo", "above hi by 0.9 tol", True), ("q_cdf_lo", "above hi by 1.1 tol", True),
    ("stop_cdf_lo", "above hi by 0.9 tol", True), ("stop_rank_lo", "above hi by 2 tol", True),
])
def test_the_compact_checks_fast_path_agrees_with_the_exact_checks(monkeypatch, column, value, rows_logged):
    batch = _batch(b=3000, seed=5)
    out = {key: (v.copy() if isinstance(v, np.ndarray) else v) for key, v in batch.items()}
    if not rows_logged:  # a file with accept_rate: a draft's fields may be NaN
        out["accept_rate"] = np.full((3000, 4), 0.5)
    target = out[column]
    where = (17, 2) if target.ndim == 2 else 17
    if isinstance(value, str):
        hi = column.replace("_lo", "_hi")
        tol = float(value.split("by ")[1].split(" tol")[0]) * validate.CDF_TOL
        out[hi][where] = 0.4
        target[where] = 0.4 + tol
    else:
        target[where] = value
    exact = _exact_verdict(out, 4, monkeypatch)
    try:
        validate.check_compact(out, 4)
        fast = None
    except validate.Bad as e:
        fast = (e.column, e.row, e.what)
    assert fast == exact


def test_a_damaged_page_is_one_line_naming_the_file(tmp_path):
    # a page header overwritten (a disk or a copy gone wrong): pyarrow's error, several lines naming no file,
    # becomes the audit's one line, whether the file is read ahead (the batch audit) or in line (the monitor)
    import pyarrow.parquet as pq

    from specsample.audit import audit, records
    from specsample.cli import main

    b = 5000
    batch = _batch(b=b, seed=1)
    t = records.table("r", np.arange(b), batch["drafts"], np.maximum(batch["tokens"], 0), batch["n_emitted"],
                      fields={n: batch[n] for n in records.COMPACT + records.RANK})
    path = str(tmp_path / "damaged.parquet")
    pq.write_table(t, path, row_group_size=2000)
    col = pq.ParquetFile(path).metadata.row_group(1).column(5)
    at = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"\xff" * 16)
    with pytest.raises(records.RecordError) as e:
        audit(path)
    line = str(e.value)
    assert line.startswith(f"{path}: damaged after its first ") and line.isprintable(), line
    with pytest.raises(records.RecordError, match="damaged after its first 2,000 rounds"):
        list(records.read_batches(path, 1000))  # two batches of 1,000 read, then the damaged row group
    assert main(["audit", path, "--no-progress"]) == 2
