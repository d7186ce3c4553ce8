"""What the coordinator knows about one transactional id, and the transitions it may prepare.

Kafka's `TransactionMetadata`, made immutable: each ``prepare_*`` method returns the target
metadata after checking the table of valid previous states; the coordinator writes the target
to the transaction log and adopts it only when the record is replayed. The epoch rules
(KIP-98 fencing, KIP-360 retries, epoch exhaustion) follow Kafka's transaction version 0/1
protocol: the epoch changes only on InitProducerId and when the coordinator fences a producer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.coordinator.result import TopicPartition
from onceflow.txn.coordinator_errors import IllegalTransitionError, TransactionLogReplayError
from onceflow.txn.transaction_log import NO_PRODUCER_EPOCH, TransactionLogValue
from onceflow.txn.transaction_state import TransactionState, is_valid_transition

MAX_PRODUCER_EPOCH = 2**15 - 1


def _log_fields(value: TransactionLogValue) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in fields(TransactionLogValue)}


def is_epoch_exhausted(producer_epoch: int) -> bool:
    """Kafka never hands out Short.MaxValue, so that it can always fence once more."""
    return producer_epoch >= MAX_PRODUCER_EPOCH - 1


@dataclass(frozen=True)
class TransactionMetadata(TransactionLogValue):
    """The transaction log's value of one transactional id, with that id (the record's key).

    Its fields are the log value's (see TransactionLogValue), so that reading a record and
    writing one copy them all; `transactional_id` is keyword-only, after them.
    """

    transactional_id: str = field(kw_only=True)

    @classmethod
    def new(
        cls, transactional_id: str, producer_id: int, txn_timeout_ms: int, now_ms: int
    ) -> TransactionMetadata:
        """The starting point of a transactional id seen for the first time (never written)."""
        return cls(
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=NO_PRODUCER_EPOCH,
            txn_timeout_ms=txn_timeout_ms,
            state=TransactionState.EMPTY,
            partitions=frozenset(),
            txn_start_timestamp=-1,
            txn_last_update_timestamp=now_ms,
        )

    @classmethod
    def from_log_value(
        cls, transactional_id: str, value: TransactionLogValue
    ) -> TransactionMetadata:
        return cls(transactional_id=transactional_id, **_log_fields(value))

    def to_log_value(self) -> TransactionLogValue:
        return TransactionLogValue(**_log_fields(self))

    @property
    def is_producer_epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    # -- transitions ----------------------------------------------------------------------

    def prepare_increment_producer_epoch(
        self, txn_timeout_ms: int, expected_epoch: int | None, now_ms: int
    ) -> TransactionMetadata | ErrorCode:
        """InitProducerId in Empty/Complete*: bump the epoch, or answer a KIP-360 retry with the
        current epoch, or fence a producer presenting any other epoch."""
        if (
            expected_epoch is None
            or self.producer_epoch == NO_PRODUCER_EPOCH
            or expected_epoch == self.producer_epoch
        ):
            if self.is_producer_epoch_exhausted:
                raise IllegalTransitionError(
                    f"{self.transactional_id}: no epoch left for producer id {self.producer_id}"
                )
            epoch = self.producer_epoch + 1
            # A new producer forgets the last epoch, so no older instance can pass as a retry.
            last_epoch = NO_PRODUCER_EPOCH if expected_epoch is None else self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            # A retry of an InitProducerId that succeeded but whose answer was lost.
            epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        else:
            return ErrorCode.producer_fenced
        return self._initialized(self.producer_id, epoch, last_epoch, txn_timeout_ms, now_ms)

    def prepare_producer_id_rotation(
        self, new_producer_id: int, txn_timeout_ms: int, now_ms: int, record_last_epoch: bool
    ) -> TransactionMetadata:
        """InitProducerId with the epoch exhausted: a new producer id at epoch 0."""
        last_epoch = self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH
        return self._initialized(new_producer_id, 0, last_epoch, txn_timeout_ms, now_ms)

    def _initialized(
        self,
        producer_id: int,
        producer_epoch: int,
        last_producer_epoch: int,
        txn_timeout_ms: int,
        now_ms: int,
    ) -> TransactionMetadata:
        """Empty after InitProducerId: the producer's new identity, the one it had remembered
        as the previous producer id, and no transaction begun."""
        return self._transition_to(
            TransactionState.EMPTY,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            last_producer_epoch=last_producer_epoch,
            previous_producer_id=self.producer_id,
            txn_timeout_ms=txn_timeout_ms,
            partitions=frozenset(),
            txn_start_timestamp=-1,
            txn_last_update_timestamp=now_ms,
        )

    def prepare_fence_producer_epoch(self) -> TransactionMetadata:
        """Ongoing -> PrepareEpochFence with epoch + 1: the open transaction's producer is fenced.
        Never written as such: the coordinator goes on to PrepareAbort at once."""
        if self.producer_epoch >= MAX_PRODUCER_EPOCH:
            raise IllegalTransitionError(
                f"{self.transactional_id}: fencing epoch {self.producer_epoch} would overflow"
            )
        return self._transition_to(
            TransactionState.PREPARE_EPOCH_FENCE,
            producer_epoch=self.producer_epoch + 1,
            last_producer_epoch=NO_PRODUCER_EPOCH,
        )

    def prepare_fence_and_abort(self, now_ms: int) -> TransactionMetadata:
        """Ongoing -> (PrepareEpochFence) -> PrepareAbort at epoch + 1: InitProducerId of a new
        instance, a transaction timeout, or an operator's abort."""
        return self.prepare_fence_producer_epoch().prepare_abort_or_commit(False, now_ms)

    def prepare_add_partitions(
        self, partitions: Iterable[TopicPartition], now_ms: int
    ) -> TransactionMetadata:
        starting = self.state in (
            TransactionState.EMPTY,
            TransactionState.COMPLETE_COMMIT,
            TransactionState.COMPLETE_ABORT,
        )
        return self._transition_to(
            TransactionState.ONGOING,
            partitions=self.partitions | frozenset(partitions),
            txn_start_timestamp=now_ms if starting else self.txn_start_timestamp,
            txn_last_update_timestamp=now_ms,
        )

    def prepare_abort_or_commit(self, commit: bool, now_ms: int) -> TransactionMetadata:
        target = TransactionState.PREPARE_COMMIT if commit else TransactionState.PREPARE_ABORT
        return self._transition_to(target, txn_last_update_timestamp=now_ms)

    def prepare_complete(self, now_ms: int) -> TransactionMetadata:
        """Prepare* -> Complete* once every marker is written; the partitions are done."""
        if self.state is TransactionState.PREPARE_COMMIT:
            target = TransactionState.COMPLETE_COMMIT
        else:
            target = TransactionState.COMPLETE_ABORT
        return self._transition_to(target, partitions=frozenset(), txn_last_update_timestamp=now_ms)

    def prepare_dead(self) -> TransactionMetadata:
        """The transactional id expired: written as a tombstone."""
        return self._transition_to(TransactionState.DEAD, partitions=frozenset())

    def _transition_to(self, state: TransactionState, **changes: Any) -> TransactionMetadata:
        if not is_valid_transition(self.state, state):
            raise IllegalTransitionError(
                f"{self.transactional_id}: {state.kafka_name} cannot follow {self.state.kafka_name}"
            )
        target = dataclasses.replace(self, state=state, **changes)
        if target.producer_id < 0 or (
            state is not TransactionState.DEAD and target.producer_epoch < 0
        ):
            raise IllegalTransitionError(f"{self.transactional_id}: invalid target {target}")
        return target


def check_replayed_transition(
    current: TransactionMetadata | None, new: TransactionLogValue
) -> None:
    """A record read back while loading must be a transition the coordinator could have made:
    allowed by the table, and never lowering the epoch of a producer id."""
    if current is None:
        return
    if not is_valid_transition(current.state, new.state):
        raise TransactionLogReplayError(
            f"{current.transactional_id}: {new.state.kafka_name} replayed after "
            f"{current.state.kafka_name}"
        )
    if new.producer_id == current.producer_id:
        if new.producer_epoch < current.producer_epoch:
            raise TransactionLogReplayError(
                f"{current.transactional_id}: epoch {new.producer_epoch} replayed after "
                f"{current.producer_epoch}"
            )
    elif new.state is not TransactionState.EMPTY or new.producer_epoch != 0:
        raise TransactionLogReplayError(
            f"{current.transactional_id}: producer id {new.producer_id} replaces "
            f"{current.producer_id} outside an InitProducerId"
        )
