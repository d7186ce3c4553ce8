"""Typed errors of the records layer; the broker maps them to Kafka error codes."""


class RecordsError(Exception):
    """Base class of every records-layer error."""


class CorruptRecordError(RecordsError):
    """Bytes that are not a valid batch: bad CRC, bad length, truncated (CORRUPT_MESSAGE)."""


class UnsupportedMagicError(RecordsError):
    """A v0/v1 message set: onceflow stores RecordBatch v2 only (UNSUPPORTED_FOR_MESSAGE_FORMAT)."""


class InvalidRecordError(RecordsError):
    """A well-formed batch whose content breaks a rule (INVALID_RECORD)."""


class UnsupportedCompressionError(RecordsError):
    """A compression codec id that Kafka does not define (UNSUPPORTED_COMPRESSION_TYPE)."""


class RecordTooLargeError(RecordsError):
    """A batch larger than the configured maximum, max.message.bytes (MESSAGE_TOO_LARGE)."""
