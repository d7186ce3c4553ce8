"""Records of a RecordBatch v2: the `Record` value and decoding a whole batch into them.

Record layout (inside the batch's records section, which may be compressed):
  length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
  | keyLength varint, key | valueLength varint, value | headerCount varint
  | headers: keyLength varint, key (UTF-8) | valueLength varint, value
A length of -1 is null. `length` counts the bytes after itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from onceflow.records.batch import HEADER_SIZE, BatchHeader, check_batch
from onceflow.records.decompression import decompress
from onceflow.records.errors import CorruptRecordError
from onceflow.records.varint import decode_varint, decode_varlong

Header = tuple[str, bytes | None]

# the smallest record: length, attributes, timestamp delta, offset delta, key, value, header count
MIN_RECORD_SIZE = 7


@dataclass(frozen=True, slots=True)
class Record:
    """One record with its absolute offset and timestamp.

    Header keys are str; bytes that are not UTF-8 decode with `surrogateescape`, so that
    re-encoding gives back the exact bytes a client sent. `attributes` is the record-level
    attributes byte (unused by Kafka, always 0 in practice).
    """

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    attributes: int = 0


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """A batch header and its records, decompressed."""

    header: BatchHeader
    records: list[Record]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)


def decode_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, verify_crc: bool = True
) -> DecodedBatch:
    """Decode the batch at `pos` (its header says how long it is; bytes after it are ignored).

    Raises CorruptRecordError for any inconsistency (CRC, lengths, record count, truncated or
    over-long varints, bytes left over after the last record), UnsupportedMagicError for v0/v1
    and UnsupportedCompressionError for codec ids 5-7.
    """
    header = check_batch(buf, pos, verify_crc=verify_crc)
    section = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    data = decompress(header.compression, section) if header.compression else bytes(section)
    return DecodedBatch(header, decode_records(header, data))


def iter_decoded_batches(
    buf: bytes | bytearray | memoryview, *, verify_crc: bool = True
) -> Iterator[DecodedBatch]:
    """Decode every batch of `buf` in order; trailing bytes that are no batch are an error."""
    pos = 0
    end = len(buf)
    while pos < end:
        batch = decode_batch(buf, pos, verify_crc=verify_crc)
        yield batch
        pos += batch.header.size


def decode_records(header: BatchHeader, data: bytes) -> list[Record]:
    """Decode the (uncompressed) records section `data` of the batch described by `header`."""
    count = header.records_count
    end = len(data)
    if count < 0:
        raise CorruptRecordError(f"negative record count {count}")
    if count * MIN_RECORD_SIZE > end:
        raise CorruptRecordError(f"{count} records cannot fit in {end} bytes")
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    # LogAppendTime batches: every record's timestamp is the batch's max timestamp (Kafka's rule)
    append_time = header.max_timestamp if header.is_log_append_time else None
    records: list[Record] = []
    append = records.append
    pos = 0
    for _ in range(count):
        length, pos = decode_varint(data, pos, end)
        if length < MIN_RECORD_SIZE - 1 or length > end - pos:
            raise CorruptRecordError(f"record length {length} out of range")
        rec_end = pos + length
        attributes = data[pos]
        ts_delta, pos = decode_varlong(data, pos + 1, rec_end)
        offset_delta, pos = decode_varint(data, pos, rec_end)
        key, pos = _decode_nullable_bytes(data, pos, rec_end, "key")
        value, pos = _decode_nullable_bytes(data, pos, rec_end, "value")
        header_count, pos = decode_varint(data, pos, rec_end)
        if header_count:
            headers, pos = _decode_headers(data, pos, rec_end, header_count)
        else:
            headers = ()
        if pos != rec_end:
            raise CorruptRecordError(
                f"record length {length} does not match its content ({length - (rec_end - pos)})"
            )
        timestamp = base_timestamp + ts_delta if append_time is None else append_time
        append(Record(base_offset + offset_delta, timestamp, key, value, headers, attributes))
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes left after the last of {count} records")
    return records


def _decode_headers(data: bytes, pos: int, end: int, count: int) -> tuple[tuple[Header, ...], int]:
    if count < 0:
        raise CorruptRecordError(f"negative header count {count}")
    if count * 2 > end - pos:
        raise CorruptRecordError(f"{count} headers cannot fit in the record")
    headers: list[Header] = []
    for _ in range(count):
        key_len, pos = decode_varint(data, pos, end)
        if key_len < 0 or key_len > end - pos:
            raise CorruptRecordError(f"header key length {key_len} out of range")
        key = data[pos : pos + key_len].decode("utf-8", "surrogateescape")
        pos += key_len
        value, pos = _decode_nullable_bytes(data, pos, end, "header value")
        headers.append((key, value))
    return tuple(headers), pos


def _decode_nullable_bytes(data: bytes, pos: int, end: int, field: str) -> tuple[bytes | None, int]:
    """A record's key, value or header value: its varint length (-1 for null), then its bytes."""
    length, pos = decode_varint(data, pos, end)
    if length >= 0:
        if length > end - pos:
            raise CorruptRecordError(f"{field} length {length} past the end of the record")
        return data[pos : pos + length], pos + length
    if length == -1:
        return None, pos
    raise CorruptRecordError(f"invalid {field} length {length}")
