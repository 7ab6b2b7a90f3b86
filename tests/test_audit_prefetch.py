"""The audit's reader runs a batch ahead in a thread of its own (specsample.audit.records.prefetched,
round a file's Arrow batches with ``read_batches(..., ahead=True)``): the same batches in the same
order, the reader's errors raised where its batch would have come, and a consumer that stops early
stops the reader."""

import threading
import time

import numpy as np
import pytest

from specsample.audit.records import RecordError, prefetched


def test_the_same_items_in_the_same_order():
    assert list(prefetched(iter(range(1000)), depth=3)) == list(range(1000))
    assert list(prefetched(iter([]))) == []


def test_an_error_of_the_reader_is_raised_after_the_items_before_it():
    def items():
        yield 1
        yield 2
        raise RecordError("x.parquet: column 'k', row 7 is negative")

    got = []
    with pytest.raises(RecordError, match="row 7"):
        for x in prefetched(items()):
            got.append(x)
    assert got == [1, 2]


def test_a_consumer_that_stops_early_stops_the_reader():
    read = []

    def items():
        for i in range(10_000):
            read.append(i)
            yield i

    before = threading.active_count()
    it = prefetched(items(), depth=2)
    assert next(it) == 0
    it.close()  # as a loop left by an error or Ctrl-C
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= before and len(read) < 10


def test_a_serial_audit_counts_what_it_counted_without_the_reader_thread(tmp_path, monkeypatch):
    # the tallies of a file read ahead and read in line are the same, bit for bit
    from specsample.audit import counting, records
    from test_audit_power import simulate, write_records

    path = write_records(str(tmp_path / "r.parquet"), simulate(8, 20_000, family="softmax"))
    ahead = counting.tally(path, batch_size=4096)
    monkeypatch.setattr(records, "prefetched", lambda batches: batches)
    inline = counting.tally(path, batch_size=4096)
    assert ahead.keys() == inline.keys()
    for key in ahead:
        a, b = ahead[key], inline[key]
        assert a.rounds == b.rounds == 20_000 and a.first == b.first
        for field in ("tested", "accepted", "mean", "var"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field
        assert all(np.array_equal(a.pit[s], b.pit[s]) for s in a.pit)
