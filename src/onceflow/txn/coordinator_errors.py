"""Typed errors of the transaction coordinator and its transaction log.

Client mistakes are not exceptions: handlers answer them with Kafka error codes. These errors
mean a corrupt log, a broker bug (a record replayed out of turn) or an exhausted resource.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode


class TransactionCoordinatorError(Exception):
    """Base class; `error_code` is what a client is answered if one has to be."""

    error_code: ErrorCode = ErrorCode.unknown_server_error


class TransactionLogRecordError(TransactionCoordinatorError, ValueError):
    """A `__transaction_state` record that cannot be decoded (truncated, unknown version...)."""


class IllegalTransitionError(TransactionCoordinatorError, RuntimeError):
    """A transition the table of valid previous states excludes: a coordinator bug."""


class TransactionLogReplayError(TransactionCoordinatorError, RuntimeError):
    """A replayed record contradicts the coordinator's state: out of order, or not the pending
    transition of its transactional id (the broker replayed what it did not write in turn)."""


class ProducerIdsExhaustedError(TransactionCoordinatorError):
    """No producer id is left to allocate (the int64 space is used up)."""
