"""validate_produce: Kafka's batch-level rules for what clients may append."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from crc32c import crc32c

from onceflow.records.builder import build_batch
from onceflow.records.control import build_marker
from onceflow.records.errors import (
    CorruptRecordError,
    InvalidRecordError,
    RecordsError,
    RecordTooLargeError,
    UnsupportedCompressionError,
)
from onceflow.records.record import Record, decode_batch
from onceflow.records.validation import validate_produce

Frame = Callable[..., bytes]
RECORDS = [(b"k", b"v", (("h", b"x"),), 1000), (None, b"v2", (), 1001), (b"k3", None, (), 999)]


def idempotent(**kwargs: object) -> bytes:
    params: dict[str, object] = {"producer_id": 4, "producer_epoch": 0, "base_sequence": 0}
    params.update(kwargs)
    return build_batch(RECORDS, **params)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data",
    [
        build_batch(RECORDS),
        idempotent(),
        idempotent(transactional=True),
        idempotent(base_sequence=(1 << 31) - 2),  # sequences wrap; still valid
        idempotent(compression=1),
        idempotent(compression=4),
        build_batch([(None, None, (), -1)]),
    ],
)
def test_valid_batches(data: bytes) -> None:
    header = decode_batch(data).header
    assert validate_produce(data) == [(0, header)]
    assert validate_produce(memoryview(data), deep=True) == [(0, header)]
    assert validate_produce(bytearray(data), produce_version=9, max_batch_size=len(data))


def _v1_message_set() -> bytes:
    # offset, size, crc, magic 1, attributes, timestamp, key -1, value "v"
    body = struct.pack(">bbq", 1, 0, 0) + struct.pack(">i", -1) + struct.pack(">i", 1) + b"v"
    message = struct.pack(">I", 0) + body
    return struct.pack(">qi", 0, len(message)) + message


def _patch(data: bytes, fmt: str, offset: int, value: int) -> bytes:
    """Change a header field and recompute the CRC, so that only the intended rule breaks."""
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", InvalidRecordError),
        (_v1_message_set(), InvalidRecordError),
        (_v1_message_set()[:20], InvalidRecordError),
        (idempotent()[:16] + b"\x00" + idempotent()[17:], InvalidRecordError),
        # no complete batch: Kafka's "must have at least one record batch" (INVALID_RECORD)
        (idempotent()[:-1], InvalidRecordError),
        (idempotent() + b"\x00" * 5, CorruptRecordError),  # trailing bytes
        (b"\x00" * 10, InvalidRecordError),
        (_patch(idempotent(), ">q", 0, 5), InvalidRecordError),  # base offset not 0
        (idempotent()[:30] + b"\xff" + idempotent()[31:], CorruptRecordError),  # CRC
        (_patch(idempotent(), ">h", 21, 5), UnsupportedCompressionError),
        (_patch(idempotent(), ">h", 21, 7), UnsupportedCompressionError),
        (_patch(idempotent(), ">i", 23, 1), InvalidRecordError),  # last offset delta vs count
        (_patch(idempotent(), ">i", 23, -1), InvalidRecordError),
        (_patch(idempotent(), ">i", 57, 0), InvalidRecordError),  # record count 0
        (_patch(idempotent(), ">i", 57, -3), InvalidRecordError),
        (build_batch([]), InvalidRecordError),  # empty batch
        (build_marker(4, 0, True, 0, 1000), InvalidRecordError),  # control batch
        (idempotent(control=True), InvalidRecordError),
        (idempotent(base_sequence=-1), InvalidRecordError),
        (idempotent(producer_epoch=-1), InvalidRecordError),
        (idempotent(producer_id=-2), InvalidRecordError),
        (build_batch(RECORDS, transactional=True), InvalidRecordError),  # no producer id
        (idempotent() + idempotent(), InvalidRecordError),  # two batches
    ],
)
def test_rule_violations(data: bytes, error: type[RecordsError]) -> None:
    with pytest.raises(error):
        validate_produce(data)


def test_several_batches_when_allowed() -> None:
    data = idempotent() + idempotent(base_sequence=3, compression=2)
    result = validate_produce(data, single_batch=False)
    assert [pos for pos, _ in result] == [0, len(idempotent())]
    assert result[1][1].base_sequence == 3


def test_zstd_needs_produce_v7() -> None:
    data = idempotent(compression=4)
    with pytest.raises(UnsupportedCompressionError):
        validate_produce(data, produce_version=6)
    assert validate_produce(data, produce_version=7)
    assert validate_produce(idempotent(compression=1), produce_version=3)


def test_max_batch_size() -> None:
    data = idempotent()
    with pytest.raises(RecordTooLargeError):
        validate_produce(data, max_batch_size=len(data) - 1)


def test_deep_checks_offset_deltas() -> None:
    # header-level consistent (last delta 2, count 3) but the deltas are 0, 0, 2
    records = [Record(0, 1, b"a", b"1"), Record(0, 2, b"b", b"2"), Record(2, 3, b"c", b"3")]
    for codec in (0, 3):
        data = build_batch(records, compression=codec)
        assert validate_produce(data)
        with pytest.raises(InvalidRecordError):
            validate_produce(data, deep=True)


def test_deep_catches_malformed_records(frame: Frame) -> None:
    body = b"\x00\x00\x00\x02k\x02v\x00"
    bad = frame(bytes([len(body) * 2 + 2]) + body, records_count=1)  # length says one more
    assert validate_produce(bad)  # the header is fine
    with pytest.raises(InvalidRecordError):  # record structure: INVALID_RECORD, as Kafka
        validate_produce(bad, deep=True)
    garbage = frame(b"\x28\xb5\x2f\xfd garbage", attributes=4, records_count=1)
    assert validate_produce(garbage)
    with pytest.raises(CorruptRecordError):
        validate_produce(garbage, deep=True)
