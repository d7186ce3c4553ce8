"""Transaction markers (control batches)."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from onceflow.records.batch import CONTROL_FLAG, TRANSACTIONAL_FLAG
from onceflow.records.control import (
    ControlType,
    build_marker,
    parse_control_record,
    parse_control_type,
)
from onceflow.records.errors import InvalidRecordError
from onceflow.records.record import Record, decode_batch


def _expected_marker(pid: int, epoch: int, type_: int, coord: int, ts: int, base: int) -> bytes:
    """A marker assembled by hand from the format description, not by onceflow's builder."""
    key = struct.pack(">hh", 0, type_)
    value = struct.pack(">hi", 0, coord)
    # attributes 0, timestamp delta 0, offset delta 0, key, value, 0 headers (varints are
    # zig-zag: 4 -> 08, 6 -> 0c)
    body = b"\x00\x00\x00\x08" + key + b"\x0c" + value + b"\x00"
    record = bytes([len(body) * 2]) + body
    after_crc = struct.pack(">hiqqqhii", 0x30, 0, ts, ts, pid, epoch, -1, 1) + record
    return (
        struct.pack(">qiib", base, 4 + 1 + 4 + len(after_crc), -1, 2)
        + struct.pack(">I", crc32c(after_crc))
        + after_crc
    )


@given(
    pid=st.integers(0, (1 << 63) - 1),
    epoch=st.integers(0, 32767),
    commit=st.booleans(),
    coord=st.integers(-(1 << 31), (1 << 31) - 1),
    ts=st.integers(0, 1 << 45),
    base=st.integers(0, 1 << 50),
)
def test_marker_bytes_and_round_trip(
    pid: int, epoch: int, commit: bool, coord: int, ts: int, base: int
) -> None:
    data = build_marker(pid, epoch, commit, coord, ts, base_offset=base)
    assert data == _expected_marker(pid, epoch, int(commit), coord, ts, base)
    batch = decode_batch(data)
    header = batch.header
    assert header.attributes == TRANSACTIONAL_FLAG | CONTROL_FLAG
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (pid, epoch, -1)
    assert header.records_count == 1 and header.base_offset == base
    [record] = batch.records
    assert record.offset == base and record.timestamp == ts
    expected_type = ControlType.COMMIT if commit else ControlType.ABORT
    assert parse_control_record(record) == (expected_type, coord)


def test_kafka_python_reads_our_marker() -> None:
    batch = DefaultRecordBatch(build_marker(7, 2, True, 5, 1234, base_offset=10))
    assert batch.validate_crc() and batch.is_control_batch and batch.is_transactional
    [record] = list(batch)
    assert record.commit and record.version == 0 and record.offset == 10


def test_leader_epoch_is_set() -> None:
    data = build_marker(1, 0, False, 0, 0, partition_leader_epoch=12)
    assert decode_batch(data).header.partition_leader_epoch == 12


def _control(key: bytes | None, value: bytes | None) -> Record:
    return Record(offset=0, timestamp=0, key=key, value=value)


def test_higher_versions_are_read_as_version_0() -> None:
    record = _control(struct.pack(">hh", 1, 1) + b"extra", struct.pack(">hi", 3, 9) + b"more")
    assert parse_control_record(record) == (ControlType.COMMIT, 9)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (None, struct.pack(">hi", 0, 1)),
        (b"\x00\x00\x00", struct.pack(">hi", 0, 1)),  # key too short
        (struct.pack(">hh", -1, 1), struct.pack(">hi", 0, 1)),  # negative key version
        (struct.pack(">hh", 0, 2), struct.pack(">hi", 0, 1)),  # not a marker type
        (struct.pack(">hh", 0, 0), None),
        (struct.pack(">hh", 0, 0), b"\x00\x00\x00\x00\x01"),  # value too short
        (struct.pack(">hh", 0, 1), struct.pack(">hi", -2, 1)),  # negative value version
    ],
)
def test_malformed_control_records(key: bytes | None, value: bytes | None) -> None:
    with pytest.raises(InvalidRecordError):
        parse_control_record(_control(key, value))


def test_other_control_types_are_readable() -> None:
    assert parse_control_type(_control(struct.pack(">hh", 0, 3), b"")) == 3
