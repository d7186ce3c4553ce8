from __future__ import annotations

import pytest
from log_batches import batches, make_batch, stored

from onceflow.log.config import LogConfig
from onceflow.log.errors import OffsetOutOfRangeError

HOUR = 3600 * 1000


def append_at(log, timestamp, n=2):
    raw = make_batch(n, timestamp=timestamp, value=b"r" * 30)
    info = log.append(*batches(raw))
    return info.first_offset, stored(raw, info.first_offset)


def test_time_retention_deletes_whole_expired_segments_oldest_first(open_log, clock):
    log = open_log(LogConfig(retention_ms=10 * HOUR, segment_bytes=10_000))
    now = clock.now_ms
    for age in (30, 25, 20, 15, 5):  # hours before now, one segment each
        append_at(log, now - age * HOUR)
        log.roll()
    recent = append_at(log, now)
    bases = log.segment_base_offsets
    assert len(bases) == 6

    assert log.delete_expired_segments() == 4
    assert log.segment_base_offsets == bases[4:]
    assert log.log_start_offset == bases[4]
    for base in bases[:4]:
        assert not (log.directory / f"{base:020d}.log").exists()
        assert not (log.directory / f"{base:020d}.index").exists()
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)
    assert log.read(recent[0], 1000).data == recent[1]
    assert log.delete_expired_segments() == 0


def test_time_retention_stops_at_the_first_segment_still_within_retention(open_log, clock):
    log = open_log(LogConfig(retention_ms=10 * HOUR))
    now = clock.now_ms
    for age in (30, 2, 30):  # the middle one keeps the later expired one alive, as in Kafka
        append_at(log, now - age * HOUR)
        log.roll()
    append_at(log, now)
    assert log.delete_expired_segments() == 1
    assert log.log_start_offset == 2


def test_expired_active_segment_is_rolled_then_deleted(open_log, clock):
    log = open_log(LogConfig(retention_ms=HOUR))
    append_at(log, clock.now_ms)
    append_at(log, clock.now_ms)
    clock.advance(HOUR + 2)  # max timestamp is now + 1
    assert log.delete_expired_segments() == 1
    assert log.log_start_offset == log.log_end_offset == 4
    assert log.segment_base_offsets == [4]
    assert log.read(4, 100).data == b""
    first, raw = append_at(log, clock.now_ms)
    assert first == 4 and log.read(4, 1000).data == raw


def test_retention_never_passes_the_high_watermark(open_log, clock):
    log = open_log(LogConfig(retention_ms=HOUR))
    for _ in range(3):
        append_at(log, clock.now_ms)
        log.roll()
    clock.advance(2 * HOUR)
    assert log.segment_base_offsets == [0, 2, 4, 6]
    assert log.delete_expired_segments(high_watermark=3) == 1  # [2, 4) is not all below 3
    assert log.log_start_offset == 2
    assert log.delete_expired_segments(high_watermark=6) == 2
    assert log.segment_base_offsets == [6]


def test_size_retention_keeps_at_least_retention_bytes(open_log, clock):
    one = len(make_batch(2, value=b"r" * 30))
    log = open_log(LogConfig(retention_bytes=3 * one + 1, retention_ms=-1))
    for _ in range(6):
        append_at(log, clock.now_ms)
        log.roll()
    assert log.size_in_bytes == 6 * one
    assert log.delete_expired_segments() == 2  # deleting a third would leave 3*one < limit
    assert log.size_in_bytes == 4 * one
    assert log.log_start_offset == 4


def test_forever_retention_deletes_nothing(open_log, clock):
    log = open_log(LogConfig(retention_ms=-1, retention_bytes=-1))
    append_at(log, 0)
    log.roll()
    clock.advance(100 * 365 * 24 * HOUR)
    assert log.delete_expired_segments() == 0


def test_an_empty_active_segment_is_never_deleted(open_log, clock):
    log = open_log(LogConfig(retention_ms=0, retention_bytes=0))
    assert log.delete_expired_segments() == 0
    assert log.segment_base_offsets == [0]


def test_deleted_segments_stay_deleted_after_reopen(open_log, clock):
    config = LogConfig(retention_ms=HOUR)
    log = open_log(config)
    append_at(log, clock.now_ms)
    log.roll()
    clock.advance(2 * HOUR)
    last = append_at(log, clock.now_ms)
    assert log.delete_expired_segments() == 1
    log.close()
    log = open_log(config)
    assert log.log_start_offset == 2
    assert log.read(2, 1000).data == last[1]


@pytest.mark.parametrize("policy", [("compact",), ()])
def test_retention_only_applies_to_a_delete_policy(open_log, clock, policy):
    # Kafka's UnifiedLog.deleteOldSegments: without `delete`, retention never removes data
    # (a compact-only topic is shortened by the cleaner alone).
    log = open_log(LogConfig(retention_ms=HOUR, retention_bytes=0, cleanup_policy=policy))
    append_at(log, clock.now_ms - 30 * HOUR)
    log.roll()
    append_at(log, clock.now_ms)
    assert log.delete_expired_segments() == 0
    assert log.log_start_offset == 0


def test_compact_delete_applies_retention(open_log, clock):
    log = open_log(LogConfig(retention_ms=HOUR, cleanup_policy=("compact", "delete")))
    append_at(log, clock.now_ms - 30 * HOUR)
    log.roll()
    append_at(log, clock.now_ms)
    assert log.delete_expired_segments() == 1
