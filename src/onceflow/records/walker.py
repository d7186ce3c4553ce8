"""Walking every record of a batch as a stream: what Produce checks, and ListOffsets' search.

The rules, Kafka's DefaultRecord.readFrom and LogValidator's for a client batch, each broken
one an InvalidRecordError (INVALID_RECORD, as Kafka answers record-level faults):
- exactly `records_count` records, and no byte after the last one;
- each record's length varint is at least 6 and matches its content exactly;
- offset deltas are 0, 1, ..., count - 1 in order;
- base timestamp + timestamp delta fits an int64 and, for a CreateTime batch, is at most the
  batch's max timestamp (the time index and ListOffsets trust that maximum);
- key and value lengths are -1 (null) or fit in the record; header count >= 0 and fits;
- header keys are non-null (length >= 0), header values -1 or fit in the record;
- varints are at most 5 bytes (varlongs 10) and within their type, as varint.py decodes them.

`RecordWalker` is the C state machine (onceflow.records._walker), fed the decompressed bytes in
chunks of any size with O(1) state; it is a required part of the build, since a pure-Python walk
cannot keep up with Produce. `walk_records_reference` is the same walk in plain Python over a
whole buffer, kept as the specification the C walker is property-tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

try:
    from onceflow.records._walker import RecordWalker
except ImportError as exc:  # no slow fallback: say how to build it
    raise ImportError(
        "onceflow's C record walker is not built: `pip install -e .` builds it, or "
        "`python setup.py build_ext --inplace` in a checkout"
    ) from exc
from onceflow.records.batch import HEADER_SIZE, BatchHeader
from onceflow.records.decompression import (
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    Buffer,
    iter_decompressed,
)
from onceflow.records.errors import CorruptRecordError, InvalidRecordError
from onceflow.records.varint import INT64_MAX, INT64_MIN, decode_varint, decode_varlong

__all__ = ["RecordWalker", "RecordsSummary", "walk_batch", "walk_records_reference"]

MIN_RECORD_BODY = 6  # attributes, timestamp delta, offset delta, key, value, header count


@dataclass(frozen=True, slots=True)
class RecordsSummary:
    """What a walk found: records read, those with a null key, and for a search the
    (offset delta, timestamp) of the first record at or after the target (the walk stops
    there, so `records` and `null_keys` then only count the records before it)."""

    records: int
    null_keys: int
    found: tuple[int, int] | None = None


def walk_batch(
    buf: Buffer,
    pos: int,
    header: BatchHeader,
    *,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    target_timestamp: int | None = None,
    check_timestamps: bool = True,
) -> RecordsSummary:
    """Walk the records of the batch at `pos` (its header already checked) as a stream.

    Raises InvalidRecordError for a bad record, CorruptRecordError for undecodable compressed
    data, RecordTooLargeError past `max_decompressed_bytes` of decompressed records.
    """
    if target_timestamp is not None and header.is_log_append_time:
        # every record of a LogAppendTime batch has the batch's max timestamp (Kafka's rule)
        if header.max_timestamp >= target_timestamp:
            return RecordsSummary(0, 0, (0, header.max_timestamp))
        return RecordsSummary(header.records_count, 0)
    section = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    check_max = check_timestamps and not header.is_log_append_time
    walker = RecordWalker(
        header.records_count,
        header.base_timestamp,
        header.max_timestamp if check_max else None,
        target_timestamp,
    )
    if header.compression == 0:  # the common case, without the generator's cost
        if not walker.feed(section):
            walker.finish()
    else:
        for chunk in iter_decompressed(header.compression, section, max_decompressed_bytes):
            if walker.feed(chunk):
                break
        else:
            walker.finish()
    return RecordsSummary(walker.records, walker.null_keys, walker.found)


def walk_records_reference(
    data: bytes | bytearray | memoryview,
    *,
    count: int,
    base_timestamp: int,
    max_timestamp: int | None = None,
    target: int | None = None,
) -> RecordsSummary:
    """The walk `RecordWalker` does, over a whole decompressed records section.

    Checks run in the C walker's order (a search stops right after a matching record's offset
    delta, before its key), so both agree on every input: the same summary, or both raise.
    """
    try:
        return _walk(data, count, base_timestamp, max_timestamp, target)
    except CorruptRecordError as exc:  # varint.py's truncated or over-long varints
        raise InvalidRecordError(str(exc)) from None


def _walk(
    data: bytes | bytearray | memoryview,
    count: int,
    base_timestamp: int,
    max_timestamp: int | None,
    target: int | None,
) -> RecordsSummary:
    end = len(data)
    pos = 0
    null_keys = 0
    for index in range(count):
        length, pos = decode_varint(data, pos, end)
        if length < MIN_RECORD_BODY:
            raise InvalidRecordError(f"record {index}: invalid record length {length}")
        rec_end = pos + length
        # reads stop at the record's end; past the data's end the record is truncated
        limit = min(rec_end, end)
        if pos >= limit:
            raise InvalidRecordError(f"record {index} is truncated")
        pos += 1  # attributes
        delta, pos = decode_varlong(data, pos, limit)
        timestamp = base_timestamp + delta
        if not INT64_MIN <= timestamp <= INT64_MAX:
            raise InvalidRecordError(f"record {index}: timestamp delta {delta} overflows")
        offset_delta, pos = decode_varint(data, pos, limit)
        if offset_delta != index:
            raise InvalidRecordError(f"record {index} has offset delta {offset_delta}")
        if max_timestamp is not None and timestamp > max_timestamp:
            raise InvalidRecordError(f"record {index}: timestamp {timestamp} past the max")
        if target is not None and timestamp >= target:
            return RecordsSummary(index, null_keys, (offset_delta, timestamp))
        key_len, pos = decode_varint(data, pos, limit)
        if key_len == -1:
            null_keys += 1
        pos = _skip(key_len, pos, rec_end, end, index, "key")
        value_len, pos = decode_varint(data, pos, limit)
        pos = _skip(value_len, pos, rec_end, end, index, "value")
        header_count, pos = decode_varint(data, pos, limit)
        if header_count < 0 or header_count * 2 > rec_end - pos:
            raise InvalidRecordError(f"record {index}: invalid header count {header_count}")
        for _ in range(header_count):
            h_key_len, pos = decode_varint(data, pos, limit)
            if h_key_len < 0:
                raise InvalidRecordError(f"record {index}: null header key")
            pos = _skip(h_key_len, pos, rec_end, end, index, "header key")
            h_value_len, pos = decode_varint(data, pos, limit)
            pos = _skip(h_value_len, pos, rec_end, end, index, "header value")
        if pos != rec_end:
            raise InvalidRecordError(f"record {index}: length {length} does not match content")
    if pos != end:
        raise InvalidRecordError(f"{end - pos} bytes left after the last of {count} records")
    return RecordsSummary(count, null_keys)


def _skip(length: int, pos: int, rec_end: int, end: int, index: int, what: str) -> int:
    if length < -1:
        raise InvalidRecordError(f"record {index}: invalid {what} length {length}")
    if length > rec_end - pos:
        raise InvalidRecordError(f"record {index}: {what} length {length} past the record")
    if length > end - pos:
        raise InvalidRecordError(f"record {index} is truncated")
    return pos + max(length, 0)
