"""Kafka's refusal of keyless records on a compacted topic (LogValidator.validateKey).

A batch for a topic whose cleanup.policy contains `compact` is refused whole with INVALID_RECORD
when any of its records has a null key: the cleaner keeps the latest record per key, and a
record without one could never be kept or removed correctly. Produce's record walk already
counts the null keys; only a refused batch is read again, to name its keyless records in
Produce v8+'s record_errors as Kafka does.
"""

from __future__ import annotations

from collections.abc import Iterator

from onceflow.records.batch import HEADER_SIZE, BatchHeader
from onceflow.records.decompression import DEFAULT_MAX_DECOMPRESSED_BYTES, iter_decompressed
from onceflow.records.errors import CorruptRecordError
from onceflow.records.varint import decode_varint, decode_varlong

# Kafka lists every keyless record; the records read again to name them are bounded, so a
# refused batch of millions of tiny records costs the event loop no more than an accepted one.
MAX_RECORDS_SCANNED = 1_000
# Kafka's exception message quotes the first three record errors.
MESSAGE_ERRORS_SHOWN = 3


def keyless_message(topic: str, partition: int) -> str:
    return (
        f"Compacted topic cannot accept message without key in topic partition {topic}-{partition}"
    )


def refusal_message(count: int, errors: list[tuple[int, str]]) -> str:
    """Kafka's RecordValidationException message for INVALID_RECORD record errors."""
    shown = ", ".join(
        f"RecordError(batchIndex={index}, message='{message}')"
        for index, message in errors[:MESSAGE_ERRORS_SHOWN]
    )
    return (
        f"One or more records have been rejected due to {count} record errors in total, and "
        f"only showing the first three errors at most: [{shown}]"
    )


def null_key_indexes(
    data: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    *,
    max_records: int = MAX_RECORDS_SCANNED,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> list[int]:
    """Indexes (Kafka's batchIndex) of the keyless records among the first `max_records`
    records of the batch at `pos`, which Produce's walk has already validated."""
    section = memoryview(data)[pos + HEADER_SIZE : pos + header.size]
    chunks: Iterator[bytes | bytearray | memoryview] = (
        iter((section,))
        if header.compression == 0
        else iter_decompressed(header.compression, section, max_decompressed_bytes)
    )
    buf = bytearray()
    start = 0
    found: list[int] = []
    for index in range(min(header.records_count, max_records)):
        while True:
            try:
                length, body = decode_varint(buf, start, len(buf))
                if len(buf) - body >= length:
                    break
            except CorruptRecordError:
                pass  # the length itself is cut by the end of what was decompressed so far
            chunk = next(chunks, None)
            if chunk is None:  # cannot happen after the walk; stop rather than guess
                return found
            del buf[:start]
            start = 0
            buf += chunk
        end = body + length
        _, at = decode_varlong(buf, body + 1, end)  # after attributes: timestamp delta
        _, at = decode_varint(buf, at, end)  # offset delta
        key_length, _ = decode_varint(buf, at, end)
        if key_length == -1:
            found.append(index)
        start = end
    return found
