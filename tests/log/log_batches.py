"""A tiny RecordBatch v2 builder for the log tests (the real builder is written elsewhere)."""

from __future__ import annotations

import struct

from crc32c import crc32c

from onceflow.records.batch import (
    BatchHeader,
    iter_batches,
    set_base_offset,
    set_partition_leader_epoch,
)

_HEADER_AFTER_CRC = struct.Struct(">hiqqqhii")


def _varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _record(offset_delta: int, timestamp_delta: int, value: bytes) -> bytes:
    body = (
        b"\x00"
        + _varint(timestamp_delta)
        + _varint(offset_delta)
        + _varint(-1)
        + _varint(len(value))
        + value
        + _varint(0)
    )
    return _varint(len(body)) + body


def make_batch(
    n_records: int = 1,
    *,
    timestamp: int = 1_700_000_000_000,
    value: bytes = b"v",
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
    base_offset: int = 0,
) -> bytes:
    """One batch of `n_records` records with timestamps timestamp, timestamp+1, ..."""
    records = b"".join(_record(i, i, value) for i in range(n_records))
    after_crc = (
        _HEADER_AFTER_CRC.pack(
            attributes,
            n_records - 1,
            timestamp,
            timestamp + n_records - 1,
            producer_id,
            producer_epoch,
            base_sequence,
            n_records,
        )
        + records
    )
    crc = crc32c(after_crc)
    batch_length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, rest
    return struct.pack(">qiibI", base_offset, batch_length, -1, 2, crc) + after_crc


def batches(*raw: bytes) -> tuple[bytes, list[tuple[int, BatchHeader]]]:
    """Concatenate batches and parse their headers, as the broker hands them to append()."""
    data = b"".join(raw)
    return data, list(iter_batches(data))


def stored(raw: bytes, base_offset: int, leader_epoch: int = 0) -> bytes:
    """The bytes the log keeps for `raw`: base offset and leader epoch rewritten, CRC intact."""
    buf = bytearray(raw)
    set_base_offset(buf, 0, base_offset)
    set_partition_leader_epoch(buf, 0, leader_epoch)
    return bytes(buf)


def split_batches(data: bytes) -> list[BatchHeader]:
    """Headers of `data`, CRC-checked: proves a read returned whole, intact batches."""
    return [h for _, h in iter_batches(data, verify_crc=True)]
