"""What a produced batch's exactly-once append answers: the offsets it got, or its refusal with
Kafka's error code (the append asks the TransactionCoordinator itself whether a producer id
was issued and whether the partition is in its transaction).

`Partition.append_records` does the append (validation, KIP-890 verification, producer-state
checks, the write); Produce's handler and the simulation only translate requests and answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from onceflow.records.errors import (
    CorruptRecordError,
    InvalidRecordError,
    RecordsError,
    RecordTooLargeError,
    UnsupportedCompressionError,
    UnsupportedMagicError,
)

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
