"""States of a transactional id at the coordinator, and the table of valid previous states.

Kafka's `TransactionState`: the ids are those written to the transaction log, the names are
those DescribeTransactions and ListTransactions show. Every transition the coordinator prepares
is checked against `VALID_PREVIOUS_STATES`, and so is every record replayed from the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum


class TransactionState(IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name Kafka's admin APIs show ("Empty", "PrepareCommit", ...)."""
        return _KAFKA_NAMES[self]

    @property
    def is_expiration_allowed(self) -> bool:
        """An idle transactional id may expire only when no transaction is open or finishing."""
        return self in _EXPIRATION_ALLOWED

    @property
    def is_prepare(self) -> bool:
        """PrepareCommit/PrepareAbort: the decision is durable, markers may still be missing."""
        return self in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT)

    @classmethod
    def from_name(cls, name: str) -> TransactionState | None:
        """The state with this Kafka name, or None (ListTransactions reports unknown filters)."""
        return _BY_KAFKA_NAME.get(name)


_S = TransactionState

_KAFKA_NAMES: dict[TransactionState, str] = {
    _S.EMPTY: "Empty",
    _S.ONGOING: "Ongoing",
    _S.PREPARE_COMMIT: "PrepareCommit",
    _S.PREPARE_ABORT: "PrepareAbort",
    _S.COMPLETE_COMMIT: "CompleteCommit",
    _S.COMPLETE_ABORT: "CompleteAbort",
    _S.DEAD: "Dead",
    _S.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_BY_KAFKA_NAME = {name: state for state, name in _KAFKA_NAMES.items()}

VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    _S.EMPTY: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.ONGOING: frozenset({_S.ONGOING, _S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_COMMIT: frozenset({_S.ONGOING}),
    # From Empty/Complete*: a version 2 client aborting a transaction that added nothing.
    _S.PREPARE_ABORT: frozenset(
        {_S.ONGOING, _S.PREPARE_EPOCH_FENCE, _S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}
    ),
    _S.COMPLETE_COMMIT: frozenset({_S.PREPARE_COMMIT}),
    _S.COMPLETE_ABORT: frozenset({_S.PREPARE_ABORT}),
    _S.DEAD: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_EPOCH_FENCE: frozenset({_S.ONGOING}),
}

_EXPIRATION_ALLOWED = frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT})


def is_valid_transition(current: TransactionState, target: TransactionState) -> bool:
    return current in VALID_PREVIOUS_STATES[target]


def unknown_state_filters(names: Iterable[str]) -> list[str]:
    """The ListTransactions state filters that name no state (returned in UnknownStateFilters)."""
    return [name for name in names if TransactionState.from_name(name) is None]
