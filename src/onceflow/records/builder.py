"""Encode records into a RecordBatch v2, byte for byte as Kafka's clients write it.

Kafka's rules followed here (DefaultRecordBatch / MemoryRecordsBuilder):
- the base timestamp is the first record's timestamp unless given; timestamp deltas are
  relative to it and may be negative;
- the max timestamp is the largest record timestamp (-1 for an empty batch);
- last offset delta is the last record's offset delta;
- the CRC-32C covers everything from the attributes to the end; base offset and partition
  leader epoch are outside it, so the broker can patch them without recomputing it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from onceflow.records.batch import (
    CONTROL_FLAG,
    CURRENT_MAGIC,
    HEADER_LAYOUT,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG,
    set_crc,
)
from onceflow.records.compression import CompressionType, compress, compression_type
from onceflow.records.record import Header, Record
from onceflow.records.varint import encode_varint, encode_varlong

RecordInput = Record | tuple[bytes | None, bytes | None, Sequence[Header], int]
"""A `Record`, or a (key, value, headers, timestamp_ms) tuple whose offset delta is its index."""

_NULL = b"\x01"  # varint -1
_BYTES_LIKE = (bytes, bytearray, memoryview)


def build_batch(
    records: Iterable[RecordInput],
    *,
    base_offset: int = 0,
    compression: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    control: bool = False,
    timestamp_type: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
) -> bytes:
    """Encode `records` as one batch.

    Tuples get offset delta = their index; `Record`s keep theirs (record.offset - base_offset)
    and their attributes byte, so that decoding a batch and building it again with the same
    header fields gives the same bytes. `max_timestamp` overrides the computed one (a broker
    stamping LogAppendTime sets it). `timestamp_type` is 0 CreateTime, 1 LogAppendTime.
    """
    codec = compression_type(compression)
    if timestamp_type not in (0, 1):
        raise ValueError(f"timestamp type must be 0 or 1, not {timestamp_type}")
    parts: list[bytes] = []
    add = parts.append
    count = 0
    last_delta = 0
    max_ts = NO_TIMESTAMP
    base_ts = base_timestamp
    for index, rec in enumerate(records):
        if isinstance(rec, Record):
            key, value, headers, ts = rec.key, rec.value, rec.headers, rec.timestamp
            delta = rec.offset - base_offset
            attributes = rec.attributes
        else:
            key, value, headers, ts = rec
            delta = index
            attributes = 0
        if base_ts is None:
            base_ts = ts
        if count == 0 or ts > max_ts:
            max_ts = ts
        body = bytearray(b"\x00" if attributes == 0 else bytes((attributes,)))
        body += encode_varlong(ts - base_ts)
        body += encode_varint(delta)
        _encode_nullable_bytes(body, key, "key")
        _encode_nullable_bytes(body, value, "value")
        body += encode_varint(len(headers))
        for h_key, h_value in headers:
            raw_key = h_key.encode("utf-8", "surrogateescape")
            body += encode_varint(len(raw_key))
            body += raw_key
            _encode_nullable_bytes(body, h_value, "header value")
        add(encode_varint(len(body)))
        add(body)
        count += 1
        last_delta = delta
    section = b"".join(parts)
    if codec is not CompressionType.NONE:
        section = compress(codec, section)
    if base_ts is None:
        base_ts = NO_TIMESTAMP
    if max_timestamp is not None:
        max_ts = max_timestamp
    attributes = int(codec)
    if timestamp_type:
        attributes |= TIMESTAMP_TYPE_MASK
    if transactional:
        attributes |= TRANSACTIONAL_FLAG
    if control:
        attributes |= CONTROL_FLAG
    out = bytearray(HEADER_SIZE + len(section))
    try:
        HEADER_LAYOUT.pack_into(
            out,
            0,
            base_offset,
            HEADER_SIZE - LOG_OVERHEAD + len(section),
            partition_leader_epoch,
            CURRENT_MAGIC,
            0,
            attributes,
            last_delta,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
    except struct.error as exc:
        raise ValueError(f"a batch header field is out of range: {exc}") from None
    out[HEADER_SIZE:] = section
    set_crc(out, 0, len(out))
    return bytes(out)


def _encode_nullable_bytes(body: bytearray, data: object, field: str) -> None:
    """A record's key, value or header value: its varint length (-1 for null), then its bytes."""
    if data is None:
        body += _NULL
    elif isinstance(data, _BYTES_LIKE):
        body += encode_varint(len(data))
        body += data
    else:
        raise TypeError(f"record {field} must be bytes or None, not {type(data).__name__}")
