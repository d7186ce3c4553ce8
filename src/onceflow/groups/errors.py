"""Errors of the group coordinator: typed inside, one Kafka error code each at the edge."""

from __future__ import annotations

from kio.schema.errors import ErrorCode


class GroupCoordinatorError(Exception):
    """An error of the coordinator that maps onto one Kafka error code."""

    error_code: ErrorCode = ErrorCode.unknown_server_error


class CoordinatorLoadInProgressError(GroupCoordinatorError):
    """The offsets log is still being replayed; the client should retry."""

    error_code = ErrorCode.coordinator_load_in_progress


class MemberFencedError(GroupCoordinatorError):
    """OffsetFetch v9+ from a KIP-848 member that is not in the group (UNKNOWN_MEMBER_ID) or
    not at its member epoch (STALE_MEMBER_EPOCH)."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class CoordinatorStateError(RuntimeError):
    """The coordinator reached a state its own rules exclude: a bug, never a client error."""
