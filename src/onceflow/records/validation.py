"""What the broker checks in a Produce request's records before appending them.

Follows Kafka's batch-level rules for client appends (ProduceRequest.validateRecords,
UnifiedLog.analyzeAndValidateRecords, LogValidator.validateBatch), in Kafka's order:

1. at least one complete batch; magic 2 only; exactly one batch per partition, as Produce v3+
   requires (opt out with `single_batch=False`) (InvalidRecordError, as Kafka answers these);
2. framing: a sane batch length, no trailing bytes (CorruptRecordError);
3. base offset 0, as clients send it (InvalidRecordError);
4. batch size within `max_batch_size` when given (RecordTooLargeError);
5. CRC-32C (CorruptRecordError);
6. a known codec, and no zstd before Produce v7 when `produce_version` is given
   (UnsupportedCompressionError);
7. record count > 0 and equal to last offset delta + 1 (InvalidRecordError);
8. no control batches from clients (InvalidRecordError);
9. producer fields: a producer id is -1 or >= 0; with one, the epoch and base sequence are
   >= 0; a transactional batch has a producer id (InvalidRecordError).

Those read the 61-byte headers only. `deep=True` (what the broker's Produce does, through
`validate_produce_records`) then walks every record of every batch as a stream (walker.py):
compressed batches are decompressed chunk by chunk, at most `max_decompressed_bytes` of them
(RecordTooLargeError past it), undecodable compressed data is CorruptRecordError, and any
record-level fault (counts, lengths, offset deltas, timestamps, headers) InvalidRecordError, as
Kafka's LogValidator answers. Kafka rewrites a compressed batch whose inner offsets are off;
onceflow stores client bytes as they are, so it rejects them. Timestamp checks
(message.timestamp.*) depend on topic configuration and are the caller's.

Also here, so that a produced batch's checks are in one place: the refusal of keyless records on
a compacted topic (LogValidator.validateKey: the walk counts the null keys, and only a refused
batch is read again to name them in Produce v8+'s record_errors), and what an append answers
(`Appended`, or `AppendRefused` with Kafka's error code for the producer).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from onceflow.records.batch import (
    HEADER_SIZE,
    MAGIC_OFFSET,
    NO_PRODUCER_ID,
    BatchHeader,
    batch_size_at,
    check_batch,
    compute_crc,
)
from onceflow.records.compression import CompressionType
from onceflow.records.decompression import DEFAULT_MAX_DECOMPRESSED_BYTES, iter_decompressed
from onceflow.records.errors import (
    CorruptRecordError,
    InvalidRecordError,
    RecordsError,
    RecordTooLargeError,
    UnsupportedCompressionError,
    UnsupportedMagicError,
)
from onceflow.records.varint import decode_varint, decode_varlong
from onceflow.records.walker import walk_batch

# Produce v7 is the first that may carry zstd (KIP-110)
ZSTD_MIN_PRODUCE_VERSION = 7
MIN_BATCH_OVERHEAD = 14  # Kafka's LOG_OVERHEAD + the smallest record: below it is corrupt
_MAX_CODEC = max(CompressionType)


@dataclass(frozen=True, slots=True)
class ValidatedRecords:
    """One partition's records as Produce validated them."""

    batches: list[tuple[int, BatchHeader]]  # (position, header) of each batch
    records: int
    null_keys: int  # records with a null key (compacted topics refuse them)


def validate_produce(
    data: bytes | bytearray | memoryview,
    *,
    deep: bool = False,
    single_batch: bool = True,
    max_batch_size: int | None = None,
    produce_version: int | None = None,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> list[tuple[int, BatchHeader]]:
    """Check one partition's records from a Produce request; returns [(position, header)].

    Raises a RecordsError subclass naming the first rule broken (see the module doc).
    """
    return _validate(
        data, deep, single_batch, max_batch_size, produce_version, max_decompressed_bytes
    ).batches


def validate_produce_records(
    data: bytes | bytearray | memoryview,
    *,
    single_batch: bool = True,
    max_batch_size: int | None = None,
    produce_version: int | None = None,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> ValidatedRecords:
    """`validate_produce` with `deep=True`, also returning the record and null-key counts."""
    return _validate(
        data, True, single_batch, max_batch_size, produce_version, max_decompressed_bytes
    )


def _validate(
    data: bytes | bytearray | memoryview,
    deep: bool,
    single_batch: bool,
    max_batch_size: int | None,
    produce_version: int | None,
    max_decompressed_bytes: int,
) -> ValidatedRecords:
    end = len(data)
    if end == 0:
        raise InvalidRecordError("produce request has no record batch for the partition")
    result: list[tuple[int, BatchHeader]] = []
    records = null_keys = 0
    pos = 0
    while pos < end:
        remaining = end - pos
        # As Kafka's batch reader: too few bytes for a header, or a batch longer than what is
        # there, is no batch at all ("must have at least one record batch": INVALID_RECORD).
        if not result and (
            remaining < MAGIC_OFFSET + 1
            or MIN_BATCH_OVERHEAD <= batch_size_at(data, pos) > remaining
        ):
            raise InvalidRecordError("the records hold no complete record batch")
        try:
            header = check_batch(data, pos, verify_crc=False)
        except UnsupportedMagicError as e:
            # Kafka's ProduceRequest (v3+) answers INVALID_RECORD for v0/v1 message sets.
            raise InvalidRecordError(f"{e}: only RecordBatch v2 (magic 2) is accepted") from None
        if single_batch and result:
            raise InvalidRecordError("produce requests may carry exactly one batch per partition")
        _check_header(data, pos, header, max_batch_size, produce_version)
        if deep:
            summary = walk_batch(data, pos, header, max_decompressed_bytes=max_decompressed_bytes)
            records += summary.records
            null_keys += summary.null_keys
        else:
            records += header.records_count
        result.append((pos, header))
        pos += header.size
    return ValidatedRecords(result, records, null_keys)


def _check_header(
    data: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    max_batch_size: int | None,
    produce_version: int | None,
) -> None:
    if header.base_offset != 0:
        raise InvalidRecordError(f"batch base offset must be 0, not {header.base_offset}")
    if max_batch_size is not None and header.size > max_batch_size:
        raise RecordTooLargeError(
            f"batch of {header.size} bytes exceeds the maximum of {max_batch_size}"
        )
    if compute_crc(data, pos, header.size) != header.crc:
        raise CorruptRecordError(f"CRC mismatch in batch at byte {pos}")
    codec = header.compression
    if codec > _MAX_CODEC:
        raise UnsupportedCompressionError(f"unknown compression codec id {codec}")
    if (
        codec == CompressionType.ZSTD
        and produce_version is not None
        and produce_version < ZSTD_MIN_PRODUCE_VERSION
    ):
        raise UnsupportedCompressionError(f"zstd needs Produce v7 or later, not v{produce_version}")
    count_from_offsets = header.last_offset_delta + 1
    if count_from_offsets <= 0:
        raise InvalidRecordError(f"invalid last offset delta {header.last_offset_delta}")
    if header.records_count <= 0:
        raise InvalidRecordError(f"invalid record count {header.records_count}")
    if count_from_offsets != header.records_count:
        raise InvalidRecordError(
            f"last offset delta {header.last_offset_delta} does not match "
            f"{header.records_count} records"
        )
    if header.is_control:
        raise InvalidRecordError("clients may not write control batches")
    producer_id = header.producer_id
    if producer_id < NO_PRODUCER_ID:
        raise InvalidRecordError(f"invalid producer id {producer_id}")
    if producer_id >= 0:
        if header.producer_epoch < 0:
            raise InvalidRecordError(f"invalid producer epoch {header.producer_epoch}")
        if header.base_sequence < 0:
            raise InvalidRecordError(
                f"invalid sequence {header.base_sequence} for producer id {producer_id}"
            )
    elif header.is_transactional:
        raise InvalidRecordError("a transactional batch needs a producer id")


# -- keyless records on a compacted topic (LogValidator.validateKey) --------------------

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


# -- what an append answers ------------------------------------------------------------

_RECORDS_ERRORS: list[tuple[type[RecordsError], ErrorCode]] = [
    (UnsupportedMagicError, ErrorCode.unsupported_for_message_format),
    (UnsupportedCompressionError, ErrorCode.unsupported_compression_type),
    (InvalidRecordError, ErrorCode.invalid_record),
    # Kafka's RecordTooLargeException; on it Java and librdkafka producers split the batch
    (RecordTooLargeError, ErrorCode.message_too_large),
    (CorruptRecordError, ErrorCode.corrupt_message),
]


def records_error_code(error: RecordsError) -> ErrorCode:
    for kind, code in _RECORDS_ERRORS:
        if isinstance(error, kind):
            return code
    return ErrorCode.corrupt_message


class AppendRefused(Exception):
    """The batch was not appended: Kafka's error code for the producer, and the records at
    fault as (batch index, message) for Produce v8+'s record_errors. `verification`: the
    coordinator refused it in KIP-890 verification, before the log was touched (Kafka answers
    those without the log start offset)."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        record_errors: list[tuple[int, str]] | None = None,
        *,
        verification: bool = False,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.record_errors = record_errors or []
        self.verification = verification


@dataclass(frozen=True, slots=True)
class Appended:
    """Where the batch is (a retried duplicate: where its original is)."""

    first_offset: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int
