"""Typed errors of the partition-side exactly-once state; each carries its Kafka error code.

The broker answers a Produce (or a WriteTxnMarkers) with `error.error_code`; nothing here is
caught and dropped inside the log.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode


class TxnError(Exception):
    """Base class of the producer state's errors that map to one Kafka error code."""

    error_code: ErrorCode = ErrorCode.unknown_server_error


class InvalidProducerEpochError(TxnError):
    """A batch or marker whose producer epoch is below the stored one (INVALID_PRODUCER_EPOCH)."""

    error_code = ErrorCode.invalid_producer_epoch


class OutOfOrderSequenceError(TxnError):
    """A sequence gap, or a new epoch not starting at 0 (OUT_OF_ORDER_SEQUENCE_NUMBER)."""

    error_code = ErrorCode.out_of_order_sequence_number


class InvalidTxnStateError(TxnError):
    """A batch that contradicts the producer's transaction state (INVALID_TXN_STATE)."""

    error_code = ErrorCode.invalid_txn_state


class TransactionCoordinatorFencedError(TxnError):
    """A marker from a coordinator epoch older than one already seen
    (TRANSACTION_COORDINATOR_FENCED)."""

    error_code = ErrorCode.transaction_coordinator_fenced


class CorruptSnapshotError(TxnError):
    """A producer-state snapshot that fails its CRC or cannot be parsed; the caller rebuilds
    the state by replaying the log instead (Kafka's CorruptSnapshotException)."""

    error_code = ErrorCode.corrupt_message


class CorruptTxnIndexError(TxnError):
    """An aborted-transaction index file whose entries cannot be right (unknown version,
    offsets out of order); the caller rebuilds it by replaying the log."""

    error_code = ErrorCode.corrupt_message


class TxnIndexStorageError(TxnError):
    """The disk refused a write or an fsync of an aborted-transaction index
    (KAFKA_STORAGE_ERROR)."""

    error_code = ErrorCode.kafka_storage_error
