"""ListOffsets' searches: MAX_TIMESTAMP reads one batch (the segments keep the maximum, as
Kafka's do), and a search by time walks the records of one batch as a stream, stopping at the
first match, whatever the batch holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from backports import zstd

from onceflow.clock import system_clock
from onceflow.log.config import LogConfig
from onceflow.log.offset_for_timestamp import max_timestamp_offset, offset_for_time
from onceflow.log.unified_log import UnifiedLog
from onceflow.records import walker
from onceflow.records.batch import iter_batches
from onceflow.records.builder import build_batch
from onceflow.records.varint import encode_varint
from tests.records.batch_frames import frame_batch

T0 = 1_700_000_000_000


def open_partition(directory: Path, segment_bytes: int = 1 << 30) -> UnifiedLog:
    config = LogConfig(segment_bytes=segment_bytes)
    return UnifiedLog.open("t", 0, directory, config, system_clock, 86_400_000)


def append(partition: UnifiedLog, batch: bytes) -> None:
    partition.log.append(batch, list(iter_batches(batch)))


@pytest.fixture
def partition(tmp_path: Path) -> Iterator[UnifiedLog]:
    """30 batches of 3 records over several segments; the largest timestamp is the middle
    record of batch 13 (offset 40), and batch 20 ties it later."""
    p = open_partition(tmp_path, segment_bytes=1000)
    for b in range(30):
        stamps = [T0 + 100 * b + i for i in range(3)]
        if b == 13:
            stamps[1] = T0 + 10**6
        if b == 20:
            stamps[2] = T0 + 10**6
        append(p, build_batch([(None, f"{b}-{i}".encode(), (), t) for i, t in enumerate(stamps)]))
    assert len(p.log.segment_base_offsets) == 3  # batches 13 and 20 in different segments
    yield p
    p.log.close()


def test_max_timestamp_reads_one_batch_and_walks_no_headers(
    partition: UnifiedLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real_read = partition.log.read

    def counting_read(offset: int, *args: object, **kwargs: object) -> object:
        reads.append(offset)
        return real_read(offset, *args, **kwargs)  # type: ignore[arg-type]

    def no_walk(*_: object) -> object:
        raise AssertionError("MAX_TIMESTAMP walked the batch headers")

    monkeypatch.setattr(partition.log, "read", counting_read)
    monkeypatch.setattr(partition.log, "iter_batch_headers", no_walk)
    assert max_timestamp_offset(partition.log, partition.log.log_end_offset) == (40, T0 + 10**6)
    assert len(reads) == 1


def test_max_timestamp_above_the_readable_bound_is_not_answered(partition: UnifiedLog) -> None:
    # the maximum is at offset 40, not readable below 39: Apache Kafka answers no offset then
    # rather than the largest timestamp below the bound (tests/apache_kafka/conformance/)
    assert max_timestamp_offset(partition.log, 39) == (-1, -1)


def test_max_timestamp_survives_a_restart(tmp_path: Path) -> None:
    p = open_partition(tmp_path, segment_bytes=1000)
    for b in range(10):
        append(p, build_batch([(None, b"v", (), T0 + (5 - b) ** 2)]))
    p.log.close()
    p = open_partition(tmp_path, segment_bytes=1000)
    try:
        assert max_timestamp_offset(p.log, p.log.log_end_offset) == (0, T0 + 25)
    finally:
        p.log.close()


def test_offset_for_time(partition: UnifiedLog) -> None:
    end = partition.log.log_end_offset
    assert offset_for_time(partition.log, T0 + 101, end) == (4, T0 + 101)
    assert offset_for_time(partition.log, T0 + 1303, end) == (40, T0 + 10**6)
    assert offset_for_time(partition.log, T0 + 10**7, end) == (-1, -1)


def record(offset_delta: int, value: bytes, timestamp_delta: int) -> bytes:
    body = b"\x00" + encode_varint(timestamp_delta) + encode_varint(offset_delta)
    body += b"\x01" + encode_varint(len(value)) + value + b"\x00"
    return encode_varint(len(body)) + body


def stored_zstd_batch(pieces: Iterator[bytes], count: int, max_timestamp: int) -> bytes:
    compressor = zstd.ZstdCompressor()
    section = b"".join([*(compressor.compress(p) for p in pieces), compressor.flush()])
    return frame_batch(
        section,
        attributes=4,
        last_offset_delta=count - 1,
        records_count=count,
        base_timestamp=T0,
        max_timestamp=max_timestamp,
    )


@pytest.fixture
def chunks_walked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    real = walker.iter_decompressed

    def counting(*args: object) -> Iterator[object]:
        for chunk in real(*args):  # type: ignore[arg-type]
            sizes.append(len(chunk))  # type: ignore[arg-type]
            yield chunk

    monkeypatch.setattr(walker, "iter_decompressed", counting)
    return sizes


def test_search_by_time_stops_at_the_first_match(tmp_path: Path, chunks_walked: list[int]) -> None:
    """100k records (100 MB decompressed) in one stored batch: the search for the 10th reads
    one chunk of it."""
    count = 100_000
    batch = stored_zstd_batch((record(i, bytes(1000), i) for i in range(count)), count, T0 + count)
    p = open_partition(tmp_path)
    try:
        append(p, batch)
        assert offset_for_time(p.log, T0 + 9, p.log.log_end_offset) == (9, T0 + 9)
    finally:
        p.log.close()
    assert len(chunks_walked) == 1


def test_a_stored_bomb_answers_its_batch_in_bounded_memory(
    tmp_path: Path, chunks_walked: list[int]
) -> None:
    """A bomb stored before Produce walked records (1 GiB of zeros): ListOffsets answers the
    batch rather than decompressing it or failing."""
    batch = stored_zstd_batch((bytes(1 << 20) for _ in range(1024)), 1000, T0 + 5)
    p = open_partition(tmp_path)
    try:
        append(p, batch)
        end = p.log.log_end_offset
        assert offset_for_time(p.log, T0 + 1, end) == (0, T0 + 5)
        assert max_timestamp_offset(p.log, end) == (0, T0 + 5)
    finally:
        p.log.close()
    assert sum(chunks_walked) <= 2 * walker.DEFAULT_MAX_DECOMPRESSED_BYTES
    assert max(chunks_walked) <= 1 << 20
