from __future__ import annotations

import pytest
from log_batches import batches, make_batch, split_batches, stored

from onceflow.log.config import LogConfig
from onceflow.log.errors import (
    LogClosedError,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
)
from onceflow.records.batch import TIMESTAMP_TYPE_MASK, iter_batches


def fill(log, counts, *, timestamp=1_700_000_000_000, value=b"v" * 20):
    """Append one batch per entry of `counts`; returns the stored bytes of each, in order."""
    expected = []
    for i, n in enumerate(counts):
        raw = make_batch(n, timestamp=timestamp + i, value=value)
        info = log.append(*batches(raw))
        expected.append((info.first_offset, info.last_offset, stored(raw, info.first_offset)))
    return expected


def test_append_assigns_contiguous_offsets_and_reads_back_exact_bytes(open_log):
    log = open_log()
    a, b, c = make_batch(3), make_batch(1), make_batch(5)
    info = log.append(*batches(a, b), leader_epoch=7)
    assert (info.first_offset, info.last_offset, info.log_append_time) == (0, 3, -1)
    assert [h.base_offset for _, h in info.headers] == [0, 3]
    assert all(h.partition_leader_epoch == 7 for _, h in info.headers)
    info2 = log.append(*batches(c))
    assert (info2.first_offset, info2.last_offset, info2.log_start_offset) == (4, 8, 0)
    assert log.log_end_offset == 9

    result = log.read(0, 1 << 20)
    assert result.data == stored(a, 0, 7) + stored(b, 3, 7) + stored(c, 4)
    assert result.next_offset == 9
    assert [h.base_offset for h in split_batches(result.data)] == [0, 3, 4]


def test_reads_cross_segment_boundaries(open_log):
    log = open_log(LogConfig(segment_bytes=400, index_interval_bytes=100))
    expected = fill(log, [1, 2, 3, 1, 4] * 8)
    assert len(log.segment_base_offsets) > 5
    assert log.segment_base_offsets[0] == 0
    everything = b"".join(raw for _, _, raw in expected)
    assert log.read(0, 1 << 20).data == everything
    for base in log.segment_base_offsets:
        path = log.directory / f"{base:020d}.log"
        assert path.exists() and path.stat().st_size <= 400


def test_read_at_every_offset_returns_the_containing_batch(open_log):
    log = open_log(LogConfig(segment_bytes=600, index_interval_bytes=150))
    expected = fill(log, [1, 4, 2, 7, 1, 3, 5] * 5)
    for first, last, raw in expected:
        for offset in range(first, last + 1):
            result = log.read(offset, 1)  # max_bytes below one batch: still one whole batch
            assert result.data == raw
            assert result.next_offset == last + 1


def test_max_bytes_returns_whole_batches_only(open_log):
    log = open_log()
    expected = fill(log, [2, 2, 2, 2])
    sizes = [len(raw) for _, _, raw in expected]
    assert log.read(0, sizes[0] + sizes[1] - 1).data == expected[0][2]
    two = log.read(0, sizes[0] + sizes[1])
    assert two.data == expected[0][2] + expected[1][2] and two.next_offset == 4
    assert log.read(0, 0).data == expected[0][2]


def test_max_offset_is_an_exclusive_bound_on_base_offsets(open_log):
    log = open_log(LogConfig(segment_bytes=300))
    expected = fill(log, [3, 3, 3, 3, 3])  # batches at 0, 3, 6, 9, 12
    assert log.read(0, 1 << 20, max_offset=6).data == expected[0][2] + expected[1][2]
    # A bound inside a batch keeps that batch (its base offset is below the bound).
    assert log.read(0, 1 << 20, max_offset=7).next_offset == 9
    assert log.read(6, 1 << 20, max_offset=6).data == b""
    assert log.read(6, 1 << 20, max_offset=6).next_offset == 6
    # Nothing is readable at or past the bound, even inside a batch that starts below it.
    assert log.read(7, 1 << 20, max_offset=7).data == b""
    assert log.read(7, 1 << 20, max_offset=8).data == expected[2][2]


def test_read_outside_the_log_is_out_of_range(open_log):
    log = open_log()
    fill(log, [2, 2])
    assert log.read(4, 100).data == b"" and log.read(4, 100).next_offset == 4
    with pytest.raises(OffsetOutOfRangeError):
        log.read(5, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)


def test_empty_log_reads_nothing(open_log):
    log = open_log()
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    assert log.read(0, 100).data == b""
    assert log.offset_for_timestamp(0) is None
    assert list(log.iter_batch_headers()) == []


def test_log_append_time_sets_max_timestamp_and_recomputes_crc(open_log, clock):
    log = open_log(LogConfig(message_timestamp_type="LogAppendTime"))
    raw = make_batch(3, timestamp=5)
    info = log.append(*batches(raw))
    assert info.log_append_time == clock.now_ms
    header = info.headers[0][1]
    assert header.max_timestamp == clock.now_ms and header.is_log_append_time
    data = log.read(0, 1000).data
    ((_, on_disk),) = list(iter_batches(data, verify_crc=True))
    assert on_disk == header
    assert on_disk.attributes & TIMESTAMP_TYPE_MASK
    assert on_disk.base_timestamp == 5  # only the max timestamp and the type bit change


def test_append_rejects_what_cannot_fit_or_does_not_add_up(open_log):
    log = open_log(LogConfig(segment_bytes=100))
    big = make_batch(10)
    with pytest.raises(RecordBatchTooLargeError):
        log.append(*batches(big))
    data, headers = batches(make_batch(1), make_batch(1))
    with pytest.raises(ValueError):
        log.append(data, headers[1:])
    with pytest.raises(ValueError):
        log.append(data + b"x", headers)
    with pytest.raises(ValueError):
        log.append(b"", [])
    assert log.log_end_offset == 0


def test_roll_by_size(open_log):
    log = open_log(LogConfig(segment_bytes=250))
    expected = fill(log, [1] * 10)
    size = len(expected[0][2])
    per_segment = 250 // size
    assert log.segment_base_offsets == list(range(0, 10, per_segment))


def test_roll_by_time_uses_record_timestamps(open_log, clock):
    log = open_log(LogConfig(segment_ms=1000))
    log.append(*batches(make_batch(1, timestamp=clock.now_ms)))
    log.append(*batches(make_batch(1, timestamp=clock.now_ms + 1000)))
    assert log.segment_base_offsets == [0]
    log.append(*batches(make_batch(1, timestamp=clock.now_ms + 1001)))
    assert log.segment_base_offsets == [0, 2]


def test_roll_by_time_without_timestamps_uses_segment_age(open_log, clock):
    log = open_log(LogConfig(segment_ms=1000))
    log.append(*batches(make_batch(1, timestamp=-1)))
    clock.advance(1000)
    log.append(*batches(make_batch(1, timestamp=-1)))
    assert log.segment_base_offsets == [0]
    clock.advance(1)
    log.append(*batches(make_batch(1, timestamp=-1)))
    assert log.segment_base_offsets == [0, 2]


def test_roll_when_the_offset_index_is_full(open_log):
    # Two 8-byte entries per index; every batch after the first gets an entry (interval 0).
    log = open_log(LogConfig(segment_index_bytes=16, index_interval_bytes=0))
    fill(log, [1] * 7)
    assert log.segment_base_offsets == [0, 2, 4, 6]


def test_roll_is_a_no_op_on_an_empty_segment(open_log):
    log = open_log()
    log.roll()
    assert log.segment_base_offsets == [0]
    fill(log, [2])
    log.roll()
    log.roll()
    assert log.segment_base_offsets == [0, 2]
    assert log.read(0, 1000).next_offset == 2


def test_offset_for_timestamp_matches_a_linear_search(open_log):
    log = open_log(LogConfig(segment_bytes=500, index_interval_bytes=90))
    stamps = [10, 30, 20, 50, 40, 40, 70, 60, 90, 80, 100, 95] * 2
    found = []
    for ts in stamps:
        info = log.append(*batches(make_batch(2, timestamp=ts)))
        found.append((info.first_offset, ts + 1))  # max timestamp = ts + n - 1
    assert len(log.segment_base_offsets) > 2
    for target in range(0, 110):
        want = next(((o, m) for o, m in found if m >= target), None)
        assert log.offset_for_timestamp(target) == want, target


def test_iter_batch_headers_and_read_batches_bytes(open_log):
    log = open_log(LogConfig(segment_bytes=300))
    expected = fill(log, [2, 1, 3, 1, 2, 2])
    headers = list(log.iter_batch_headers())
    assert [(h.base_offset, h.last_offset) for h in headers] == [
        (f, last) for f, last, _ in expected
    ]
    assert list(log.read_batches_bytes()) == [raw for _, _, raw in expected]
    # From an offset inside a batch: that batch first.
    assert [h.base_offset for h in log.iter_batch_headers(4)] == [3, 6, 7, 9]
    assert [f for f, _, _ in expected] == [0, 2, 3, 6, 7, 9]
    assert list(log.read_batches_bytes(100)) == []


def test_closed_log_refuses_work(open_log):
    log = open_log()
    fill(log, [1])
    log.close()
    with pytest.raises(LogClosedError):
        log.append(*batches(make_batch(1)))
    with pytest.raises(LogClosedError):
        log.read(0, 10)
