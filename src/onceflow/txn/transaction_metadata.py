"""What the coordinator knows about one transactional id, and the transitions it may prepare.

Kafka's `TransactionMetadata`, made immutable: each ``prepare_*`` method returns the target
metadata after checking the table of valid previous states; the coordinator writes the target
to the transaction log and adopts it only when the record is replayed. The epoch rules
(KIP-98 fencing, KIP-360 retries, epoch exhaustion) follow Kafka's: with transaction version
0/1 the epoch changes only on InitProducerId and when the coordinator fences a producer; with
version 2 (KIP-890 part 2) also at every EndTxn, and when that exhausts the epochs the
transaction moves to a new producer id (epoch 0) once its markers are written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.coordinator.result import TopicPartition
from onceflow.txn.coordinator_errors import IllegalTransitionError, TransactionLogReplayError
from onceflow.txn.transaction_log import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TransactionLogValue
from onceflow.txn.transaction_state import TransactionState, is_valid_transition

MAX_PRODUCER_EPOCH = 2**15 - 1
# Kafka's TransactionVersion.TV_2: the first whose clients have the epoch bumped at each EndTxn.
EPOCH_BUMP_TRANSACTION_VERSION = 2


def supports_epoch_bump(client_transaction_version: int) -> bool:
    return client_transaction_version >= EPOCH_BUMP_TRANSACTION_VERSION


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
        instance, a transaction timeout, or an operator's abort. A version 2 transaction's abort
        bumps once more, as Kafka's: else the fenced producer's EndTxn would pass for a retry
        of an EndTxn that bumped the epoch."""
        fenced = self.prepare_fence_producer_epoch()
        version = self.client_transaction_version
        return fenced.prepare_abort_or_commit(
            False, now_ms, version if supports_epoch_bump(version) else None
        )

    @property
    def is_between_transactions(self) -> bool:
        return self.state in (
            TransactionState.EMPTY,
            TransactionState.COMPLETE_COMMIT,
            TransactionState.COMPLETE_ABORT,
        )

    def prepare_add_partitions(
        self,
        partitions: Iterable[TopicPartition],
        now_ms: int,
        client_transaction_version: int | None = None,
    ) -> TransactionMetadata:
        """Ongoing with the partitions added; a version 2 client's add (the partition leader's,
        on its Produce v12 or TxnOffsetCommit v5) records its version."""
        version = (
            self.client_transaction_version
            if client_transaction_version is None
            else client_transaction_version
        )
        return self._transition_to(
            TransactionState.ONGOING,
            partitions=self.partitions | frozenset(partitions),
            txn_start_timestamp=now_ms
            if self.is_between_transactions
            else self.txn_start_timestamp,
            txn_last_update_timestamp=now_ms,
            client_transaction_version=version,
        )

    def prepare_abort_or_commit(
        self,
        commit: bool,
        now_ms: int,
        client_transaction_version: int | None = None,
        next_producer_id: int = NO_PRODUCER_ID,
    ) -> TransactionMetadata:
        """Prepare*. An EndTxn of a version 2 client (`client_transaction_version` 2) bumps the
        epoch, so that no write of the ending transaction can join the next one (KIP-890), and
        names the producer id to move to when that exhausts the epochs. The coordinator's own
        abort (fencing) passes no version: its fence already bumped the epoch."""
        target = TransactionState.PREPARE_COMMIT if commit else TransactionState.PREPARE_ABORT
        changes: dict[str, Any] = {"txn_last_update_timestamp": now_ms}
        if client_transaction_version is not None:
            changes["client_transaction_version"] = client_transaction_version
            if supports_epoch_bump(client_transaction_version):
                bumped = self.producer_epoch + 1
                if self.producer_epoch >= MAX_PRODUCER_EPOCH:
                    if commit:
                        raise IllegalTransitionError(
                            f"{self.transactional_id}: epoch {self.producer_epoch} cannot be bumped"
                        )
                    bumped = self.producer_epoch  # as Kafka: an abort may still recover
                changes.update(
                    producer_epoch=bumped,
                    last_producer_epoch=self.producer_epoch,
                    next_producer_id=next_producer_id,
                )
        if self.is_between_transactions:
            # Version 2 may abort a transaction that added nothing (its Produce failed before
            # the leader added the partition): it starts and ends now.
            changes["txn_start_timestamp"] = now_ms
        return self._transition_to(target, **changes)

    def prepare_complete(self, now_ms: int) -> TransactionMetadata:
        """Prepare* -> Complete* once every marker is written; the partitions are done. With
        version 2 a transaction that exhausted the epochs moves to its next producer id at
        epoch 0; the last epoch stays the one the client last saw (Kafka's prepareComplete)."""
        if self.state is TransactionState.PREPARE_COMMIT:
            target = TransactionState.COMPLETE_COMMIT
        else:
            target = TransactionState.COMPLETE_ABORT
        changes: dict[str, Any] = {}
        if (
            supports_epoch_bump(self.client_transaction_version)
            and self.next_producer_id != NO_PRODUCER_ID
        ):
            changes.update(
                producer_id=self.next_producer_id,
                producer_epoch=0,
                previous_producer_id=self.producer_id,
                next_producer_id=NO_PRODUCER_ID,
            )
        return self._transition_to(
            target, partitions=frozenset(), txn_last_update_timestamp=now_ms, **changes
        )

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
    elif _is_overflow_complete(current, new):
        pass
    elif new.state is not TransactionState.EMPTY or new.producer_epoch != 0:
        raise TransactionLogReplayError(
            f"{current.transactional_id}: producer id {new.producer_id} replaces "
            f"{current.producer_id} outside an InitProducerId"
        )


def _is_overflow_complete(current: TransactionMetadata, new: TransactionLogValue) -> bool:
    """Complete* moving a version 2 transaction to the next producer id its EndTxn named."""
    return (
        new.state in (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)
        and current.next_producer_id == new.producer_id
        and new.previous_producer_id == current.producer_id
        and new.producer_epoch == 0
    )
