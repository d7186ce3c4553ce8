"""Typed errors of the log layer; the broker maps them to Kafka error codes."""

from __future__ import annotations


class LogError(Exception):
    """Base class of every log-layer error."""


class LogConfigError(LogError, ValueError):
    """A topic-level setting the log cannot honour (INVALID_CONFIG); also a ValueError."""


class OffsetOutOfRangeError(LogError):
    """A read outside [log_start_offset, log_end_offset] (OFFSET_OUT_OF_RANGE)."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(
            f"offset {offset} is outside the log range [{log_start_offset}, {log_end_offset}]"
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class RecordBatchTooLargeError(LogError):
    """An append larger than a whole segment could ever hold (RECORD_LIST_TOO_LARGE)."""


class LogStorageError(LogError, OSError):
    """The disk refused a write or a sync (KAFKA_STORAGE_ERROR); also an OSError."""


class LogClosedError(LogError):
    """The log was closed or deleted (NOT_LEADER_OR_FOLLOWER at the protocol edge)."""


class CorruptSegmentError(LogError):
    """Bytes in a segment file that are not a valid, contiguous batch, found at `position`."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} (at byte {position})")
        self.position = position


class DescriptorsExhaustedError(LogError):
    """Out of file descriptors (EMFILE/ENFILE) even after closing idle log files.

    Fails the one request that met it with KAFKA_STORAGE_ERROR, which clients retry; unlike
    LogStorageError it is not a disk failure and does not halt the broker: it is raised
    before anything is written, so memory and disk still agree.
    """


class SegmentsChangedError(LogError):
    """The segments a clean replaces are no longer the log's (retention, a truncation, the log
    closed): the cleaned files are dropped and the clean done again later."""
