"""The transaction coordinator, sans-IO: Apache Kafka's TransactionCoordinator and
TransactionStateManager over a single ``__transaction_state`` log.

Coordinator-runtime model. A handler validates the request, sets a *pending* transition on the
transactional id and returns a :class:`CoordinatorResult`: the records to append and the
response. The coordinator runtime (coordinator/runtime.py) does the rest: it appends the
records, waits until they are durable, calls :meth:`replay` for each (the state changes only
there), answers, writes the markers of ``result.markers`` and then the result of
:meth:`markers_written` the same way; it calls :meth:`abort_pending` when an append surely
failed. Loading after a restart is :meth:`replay` of the whole log, then markers for
:meth:`in_doubt`. A result with no records sets no pending transition and is answered at once.

While a transition is pending, other requests for the transactional id are answered
CONCURRENT_TRANSACTIONS. The runtime calls :meth:`expire_timed_out` periodically (Kafka: every
10 s) and :meth:`expire_transactional_ids` rarely (Kafka: hourly).

Transaction versions 0/1 and 2 (KIP-890 part 2), by the version of the client: an EndTxn v5
(`client_transaction_version` 2) bumps the epoch at every commit or abort and answers the new
producer id and epoch; a version 2 client's partitions are added by the partition leader
(`add_partitions` with its version) instead of AddPartitionsToTxn / AddOffsetsToTxn.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from kio.schema.errors import ErrorCode

from onceflow.clock import Clock
from onceflow.coordinator.result import CoordinatorResult, MarkerJob, Record, TopicPartition
from onceflow.protocol.api_key import ApiKey
from onceflow.txn.coordinator_errors import (
    IllegalTransitionError,
    TransactionLogRecordError,
    TransactionLogReplayError,
)
from onceflow.txn.producer_ids import PRODUCER_ID_BLOCK_SIZE, ProducerIdManager
from onceflow.txn.transaction_log import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    ProducerIdBlockKey,
    decode_key,
    decode_producer_id_block_value,
    decode_value,
    transaction_record,
)
from onceflow.txn.transaction_metadata import (
    MAX_PRODUCER_EPOCH,
    TransactionMetadata,
    check_replayed_transition,
    is_epoch_exhausted,
    supports_epoch_bump,
)
from onceflow.txn.transaction_state import TransactionState

T = TypeVar("T")

TRANSACTION_STATE_TOPIC = "__transaction_state"
OFFSETS_TOPIC = "__consumer_offsets"
# Single node: every group's offsets live in partition 0 of the offsets log.
OFFSETS_TOPIC_PARTITION: TopicPartition = (OFFSETS_TOPIC, 0)

# First version of each API whose clients understand PRODUCER_FENCED (KIP-588).
_PRODUCER_FENCED_SINCE = {
    ApiKey.INIT_PRODUCER_ID: 4,
    ApiKey.ADD_PARTITIONS_TO_TXN: 2,
    ApiKey.ADD_OFFSETS_TO_TXN: 2,
    ApiKey.END_TXN: 2,
}
# Produce v11 added TRANSACTION_ABORTABLE (KIP-890).
_PRODUCE_TRANSACTION_ABORTABLE_SINCE = 11


# -- results and responses ------------------------------------------------------------------


@dataclass(frozen=True)
class InitProducerIdResponse:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True)
class EndTxnResponse:
    """EndTxn's answer; from v5 (transactions version 2) with the producer id and epoch the
    producer goes on with (the bumped epoch, or a new producer id at epoch 0)."""

    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True)
class TxnDescription:
    """One transactional id in a DescribeTransactions response."""

    transactional_id: str
    error: ErrorCode
    # An error's entry carries the response schema's defaults, zeros, as Kafka's does.
    state: str = ""
    producer_id: int = 0
    producer_epoch: int = 0
    transaction_timeout_ms: int = 0
    transaction_start_time_ms: int = 0
    # (topic, partitions) sorted by topic, partitions sorted.
    topics: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class TxnListing:
    """One transactional id in a ListTransactions response."""

    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True)
class _Pending:
    # The metadata the records establish once replayed; state Dead means a tombstone.
    target: TransactionMetadata


# -- error mapping at the protocol edge ------------------------------------------------------


def error_for_version(error: ErrorCode, api_key: int, version: int) -> ErrorCode:
    """PRODUCER_FENCED is sent as INVALID_PRODUCER_EPOCH to clients too old to know it."""
    since = _PRODUCER_FENCED_SINCE.get(api_key)
    if error == ErrorCode.producer_fenced and since is not None and version < since:
        return ErrorCode.invalid_producer_epoch
    return error


def produce_error_for_verification(error: ErrorCode, produce_version: int) -> ErrorCode:
    """The Produce error for a failed KIP-890 verification, as Kafka's ReplicaManager and
    AddPartitionsToTxnManager translate the coordinator's answer."""
    if error == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch
    if error == ErrorCode.transaction_abortable:
        if produce_version >= _PRODUCE_TRANSACTION_ABORTABLE_SINCE:
            return error
        return ErrorCode.invalid_txn_state
    if error in (
        ErrorCode.concurrent_transactions,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.coordinator_not_available,
        ErrorCode.not_coordinator,
        ErrorCode.network_exception,
    ):
        # Retriable for every client version, and does not trigger a metadata refresh.
        return ErrorCode.not_enough_replicas
    return error


# -- the coordinator ------------------------------------------------------------------------


class TransactionCoordinator:
    """All transactional ids of one broker (the whole ``__transaction_state`` log)."""

    def __init__(
        self,
        clock: Clock,
        *,
        transaction_max_timeout_ms: int = 900_000,
        transactional_id_expiration_ms: int = 604_800_000,
        coordinator_epoch: int = 0,
        producer_id_block_size: int = PRODUCER_ID_BLOCK_SIZE,
    ) -> None:
        self._clock = clock
        self._max_timeout_ms = transaction_max_timeout_ms
        self._expiration_ms = transactional_id_expiration_ms
        self._coordinator_epoch = coordinator_epoch
        self._producer_ids = ProducerIdManager(producer_id_block_size)
        self._txns: dict[str, TransactionMetadata] = {}
        # producer id -> the transactional id whose durable metadata holds it
        self._owners: dict[int, str] = {}
        self._pending: dict[str, _Pending] = {}

    # -- InitProducerId -------------------------------------------------------------------

    def init_producer_id(
        self,
        transactional_id: str | None,
        transaction_timeout_ms: int,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
    ) -> CoordinatorResult[InitProducerIdResponse]:
        if transactional_id is None:
            # Idempotent producer: a fresh id, epoch 0, nothing else to remember.
            new_id, records = self._producer_ids.allocate()
            return CoordinatorResult(records, InitProducerIdResponse(ErrorCode.none, new_id, 0))
        if not transactional_id:
            return self._init_error(ErrorCode.invalid_request)
        if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
            return self._init_error(ErrorCode.invalid_request)
        if not 0 < transaction_timeout_ms <= self._max_timeout_ms:
            return self._init_error(ErrorCode.invalid_transaction_timeout)
        if transactional_id in self._pending:
            return self._init_error(ErrorCode.concurrent_transactions)
        expected = None if producer_id == NO_PRODUCER_ID else (producer_id, producer_epoch)
        now = self._clock()
        records: list[Record] = []
        current = self._txns.get(transactional_id)
        if current is None:
            new_id, records = self._producer_ids.allocate()
            current = TransactionMetadata.new(transactional_id, new_id, transaction_timeout_ms, now)
        if expected is not None and not _is_valid_producer_id(current, *expected):
            return self._init_error(ErrorCode.producer_fenced)

        state = current.state
        if state.is_prepare:
            return self._init_error(ErrorCode.concurrent_transactions)
        if state is TransactionState.ONGOING:
            # Fence the open transaction's producer and abort it; the client retries and gets
            # the epoch bumped once more (or a new producer id if this exhausted the epochs).
            target = current.prepare_fence_and_abort(now)
            return self._pending_result(
                target,
                InitProducerIdResponse(ErrorCode.concurrent_transactions),
                markers=self._marker_job(target),
            )
        if state not in (
            TransactionState.EMPTY,
            TransactionState.COMPLETE_COMMIT,
            TransactionState.COMPLETE_ABORT,
        ):
            raise IllegalTransitionError(f"{transactional_id}: durable state {state.kafka_name}")
        if current.is_producer_epoch_exhausted and (
            expected is None or expected[1] == current.producer_epoch
        ):
            new_id, block_records = self._producer_ids.allocate()
            records += block_records
            bumped: TransactionMetadata | ErrorCode = current.prepare_producer_id_rotation(
                new_id, transaction_timeout_ms, now, record_last_epoch=expected is not None
            )
        else:
            bumped = current.prepare_increment_producer_epoch(
                transaction_timeout_ms, None if expected is None else expected[1], now
            )
        if isinstance(bumped, ErrorCode):
            # Any producer id allocated above is skipped: its block record is written with the
            # next allocation from that block.
            return self._init_error(bumped)
        return self._pending_result(
            bumped,
            InitProducerIdResponse(ErrorCode.none, bumped.producer_id, bumped.producer_epoch),
            extra_records=records,
        )

    # -- AddPartitionsToTxn / AddOffsetsToTxn ---------------------------------------------

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: list[TopicPartition],
        verify_only: bool = False,
        client_transaction_version: int | None = None,
    ) -> CoordinatorResult[dict[TopicPartition, ErrorCode]]:
        """AddPartitionsToTxn; with ``verify_only`` (v4+, KIP-890) only checks membership:
        NONE or TRANSACTION_ABORTABLE per partition, and writes nothing. A version 2 client's
        partitions are added by the partition leader (Produce v12, TxnOffsetCommit v5), which
        passes `client_transaction_version` 2."""
        wanted = list(dict.fromkeys((topic, partition) for topic, partition in partitions))
        if verify_only:
            return CoordinatorResult(
                [], self._verify(transactional_id, producer_id, producer_epoch, wanted)
            )
        error, target = self._prepare_add(
            transactional_id, producer_id, producer_epoch, wanted, client_transaction_version
        )
        response = {tp: error for tp in wanted}
        if target is None:
            return CoordinatorResult([], response)
        return self._pending_result(target, response)

    def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> CoordinatorResult[ErrorCode]:
        """AddOffsetsToTxn: the group's offsets partition joins the transaction, so that the
        markers also commit or abort its transactional offsets."""
        error, target = self._prepare_add(
            transactional_id, producer_id, producer_epoch, [OFFSETS_TOPIC_PARTITION]
        )
        if target is None:
            return CoordinatorResult([], error)
        return self._pending_result(target, error)

    def _prepare_add(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: list[TopicPartition],
        client_transaction_version: int | None = None,
    ) -> tuple[ErrorCode, TransactionMetadata | None]:
        error, current = self._producer_txn(transactional_id, producer_id, producer_epoch)
        if current is None:
            return error, None
        if transactional_id in self._pending or current.state.is_prepare:
            return ErrorCode.concurrent_transactions, None
        if current.state is TransactionState.ONGOING and current.partitions.issuperset(partitions):
            return ErrorCode.none, None
        return ErrorCode.none, current.prepare_add_partitions(
            partitions, self._clock(), client_transaction_version
        )

    def _verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: list[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        # As Kafka, the durable state decides and a pending transition is ignored: the
        # partition leader checks again when it appends.
        error, current = self._producer_txn(transactional_id, producer_id, producer_epoch)
        if current is not None and current.state.is_prepare:
            error, current = ErrorCode.concurrent_transactions, None
        if current is None:
            return {tp: error for tp in partitions}
        return {
            tp: ErrorCode.none if tp in current.partitions else ErrorCode.transaction_abortable
            for tp in partitions
        }

    def _producer_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> tuple[ErrorCode, TransactionMetadata | None]:
        """The durable metadata of the producer's transactional id, or (None and) the error
        Kafka gives a request whose id, producer id or epoch does not match it."""
        if not transactional_id:
            return ErrorCode.invalid_request, None
        current = self._txns.get(transactional_id)
        if current is None or current.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping, None
        if current.producer_epoch != producer_epoch:
            return ErrorCode.producer_fenced, None
        return ErrorCode.none, current

    def is_in_transaction(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
        *,
        produce_version: int = 0,
    ) -> ErrorCode:
        """KIP-890 part 1 for the produce path: NONE if the producer's open transaction contains
        the partition, else the Produce error Kafka gives for that ``produce_version``
        (INVALID_PRODUCER_ID_MAPPING, INVALID_PRODUCER_EPOCH, NOT_ENOUGH_REPLICAS while the
        transaction completes, INVALID_TXN_STATE or, from v11, TRANSACTION_ABORTABLE)."""
        tp = (topic, partition)
        error = self._verify(transactional_id, producer_id, producer_epoch, [tp])[tp]
        return produce_error_for_verification(error, produce_version)

    # -- EndTxn and markers ----------------------------------------------------------------

    def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> CoordinatorResult[ErrorCode]:
        """EndTxn v0-4 (transactions version 0/1 clients): the epoch stays."""
        if (meta := self._txns.get(transactional_id)) is not None and supports_epoch_bump(
            meta.client_transaction_version
        ):
            # As Kafka: the transaction's version decides, whatever the request's version.
            result = self.end_transaction(
                transactional_id, producer_id, producer_epoch, commit, client_transaction_version=0
            )
            return CoordinatorResult(
                result.records,
                result.response.error,
                markers=result.markers,
                transactional_id=result.transactional_id,
            )
        return self._end_txn_v1(transactional_id, producer_id, producer_epoch, commit)

    def end_transaction(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        client_transaction_version: int,
    ) -> CoordinatorResult[EndTxnResponse]:
        """EndTxn of any version, answered with the producer id and epoch to go on with (v5).

        A transaction last changed by a version 2 client follows Kafka's version 2 rules: the
        request's epoch must be the current one (Ongoing, Empty), or the one just before the
        bump (a retry of the EndTxn that bumped it: answered as it was once Complete*, or
        CONCURRENT_TRANSACTIONS while the markers are written), or the last one of the previous
        producer id (a retry after the epochs were exhausted); any other epoch is fenced."""
        current = self._txns.get(transactional_id)
        if not transactional_id:
            return CoordinatorResult([], EndTxnResponse(ErrorCode.invalid_request))
        if current is None:
            return CoordinatorResult([], EndTxnResponse(ErrorCode.invalid_producer_id_mapping))
        if not supports_epoch_bump(current.client_transaction_version) and not (
            supports_epoch_bump(client_transaction_version)
        ):
            classic = self._end_txn_v1(transactional_id, producer_id, producer_epoch, commit)
            return CoordinatorResult(
                classic.records,
                self._end_answer(classic.response, current),
                markers=classic.markers,
                transactional_id=classic.transactional_id,
            )
        state = current.state
        retry_on_overflow = (
            supports_epoch_bump(current.client_transaction_version)
            and current.previous_producer_id == producer_id
            and producer_epoch == MAX_PRODUCER_EPOCH - 1
            and current.producer_epoch == 0
        )
        retry_on_bump = (
            supports_epoch_bump(current.client_transaction_version)
            and current.producer_epoch == producer_epoch + 1
        )
        if state.is_prepare:
            valid_epoch = retry_on_bump
        elif state in (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT):
            valid_epoch = retry_on_bump or retry_on_overflow
            if producer_epoch == current.producer_epoch and producer_id == current.producer_id:
                # The next transaction's EndTxn (it added nothing) rather than a retry.
                valid_epoch, retry_on_bump, retry_on_overflow = True, False, False
        else:
            valid_epoch = producer_epoch == current.producer_epoch
        if current.producer_id != producer_id and not retry_on_overflow:
            return CoordinatorResult([], EndTxnResponse(ErrorCode.invalid_producer_id_mapping))
        if not valid_epoch:
            return CoordinatorResult([], EndTxnResponse(ErrorCode.producer_fenced))
        if transactional_id in self._pending:
            return CoordinatorResult([], EndTxnResponse(ErrorCode.concurrent_transactions))
        same_result = (
            (TransactionState.PREPARE_COMMIT, TransactionState.COMPLETE_COMMIT)
            if commit
            else (TransactionState.PREPARE_ABORT, TransactionState.COMPLETE_ABORT)
        )
        if retry_on_bump or retry_on_overflow:
            if state is same_result[1]:
                return CoordinatorResult([], self._end_answer(ErrorCode.none, current))
            if state is same_result[0]:
                return CoordinatorResult([], EndTxnResponse(ErrorCode.concurrent_transactions))
            return CoordinatorResult([], EndTxnResponse(ErrorCode.invalid_txn_state))
        if state is not TransactionState.ONGOING and (
            commit or not supports_epoch_bump(client_transaction_version)
        ):
            # Nothing begun: only a version 2 client may abort it (its Produce failed before
            # the partition was added, so it cannot know).
            return CoordinatorResult([], EndTxnResponse(ErrorCode.invalid_txn_state))
        records: list[Record] = []
        next_producer_id = NO_PRODUCER_ID
        if supports_epoch_bump(client_transaction_version) and current.is_producer_epoch_exhausted:
            next_producer_id, records = self._producer_ids.allocate()
        target = current.prepare_abort_or_commit(
            commit, self._clock(), client_transaction_version, next_producer_id
        )
        return self._pending_result(
            target,
            self._end_answer(ErrorCode.none, target),
            markers=self._marker_job(target),
            extra_records=records,
        )

    @staticmethod
    def _end_answer(error: ErrorCode, meta: TransactionMetadata) -> EndTxnResponse:
        """EndTxn's answer: with no error, the producer id and epoch the producer goes on with
        (a new producer id at epoch 0 once the epochs are exhausted, as the client expects)."""
        if error != ErrorCode.none:
            return EndTxnResponse(error)
        if meta.next_producer_id != NO_PRODUCER_ID:
            return EndTxnResponse(error, meta.next_producer_id, 0)
        return EndTxnResponse(error, meta.producer_id, meta.producer_epoch)

    def _end_txn_v1(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> CoordinatorResult[ErrorCode]:
        error, current = self._producer_txn(transactional_id, producer_id, producer_epoch)
        if current is None:
            return CoordinatorResult([], error)
        if transactional_id in self._pending:
            return CoordinatorResult([], ErrorCode.concurrent_transactions)
        state = current.state
        if state is TransactionState.ONGOING:
            target = current.prepare_abort_or_commit(commit, self._clock())
            return self._pending_result(target, ErrorCode.none, markers=self._marker_job(target))
        committed_state = (
            (TransactionState.PREPARE_COMMIT, TransactionState.COMPLETE_COMMIT)
            if commit
            else (TransactionState.PREPARE_ABORT, TransactionState.COMPLETE_ABORT)
        )
        if state is committed_state[1]:
            return CoordinatorResult([], ErrorCode.none)  # a retry of a completed EndTxn
        if state is committed_state[0]:
            return CoordinatorResult([], ErrorCode.concurrent_transactions)
        # Empty (nothing begun), or the other result already decided.
        return CoordinatorResult([], ErrorCode.invalid_txn_state)

    def markers_written(
        self, transactional_id: str, producer_epoch: int
    ) -> CoordinatorResult[ErrorCode]:
        """Every marker of the job is written: Prepare* -> Complete*."""
        current = self._txns.get(transactional_id)
        if current is None:
            return CoordinatorResult([], ErrorCode.transactional_id_not_found)
        if transactional_id in self._pending:
            return CoordinatorResult([], ErrorCode.concurrent_transactions)
        if current.producer_epoch != producer_epoch:
            return CoordinatorResult([], ErrorCode.producer_fenced)
        if not current.state.is_prepare:
            return CoordinatorResult([], ErrorCode.invalid_txn_state)
        return self._pending_result(current.prepare_complete(self._clock()), ErrorCode.none)

    def in_doubt(self) -> list[MarkerJob]:
        """Transactions decided (Prepare*) whose markers may be missing: after loading, the
        broker writes their markers (again) and calls :meth:`markers_written`."""
        return [
            self._marker_job(meta)
            for txn_id, meta in sorted(self._txns.items())
            if meta.state.is_prepare and txn_id not in self._pending
        ]

    # -- timers ---------------------------------------------------------------------------

    def expire_timed_out(self) -> list[CoordinatorResult[ErrorCode]]:
        """Ongoing transactions past start + timeout: fence the producer (epoch + 1) and abort,
        as Kafka's abortTimedOutTransactions."""
        now = self._clock()
        results: list[CoordinatorResult[ErrorCode]] = []
        for txn_id, meta in sorted(self._txns.items()):
            if txn_id in self._pending or meta.state is not TransactionState.ONGOING:
                continue
            if meta.txn_start_timestamp + meta.txn_timeout_ms < now:
                target = meta.prepare_fence_and_abort(now)
                results.append(
                    self._pending_result(target, ErrorCode.none, markers=self._marker_job(target))
                )
        return results

    def expire_transactional_ids(self) -> list[CoordinatorResult[ErrorCode]]:
        """Transactional ids idle past ``transactional.id.expiration.ms`` with no transaction
        open: a tombstone each (Dead)."""
        now = self._clock()
        results: list[CoordinatorResult[ErrorCode]] = []
        for txn_id, meta in sorted(self._txns.items()):
            if txn_id in self._pending or not meta.state.is_expiration_allowed:
                continue
            if meta.txn_last_update_timestamp <= now - self._expiration_ms:
                results.append(self._pending_result(meta.prepare_dead(), ErrorCode.none))
        return results

    # -- the log ----------------------------------------------------------------------------

    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one durable record: the pending transition it carries, or while loading any
        record of the log, in log order."""
        parsed = decode_key(key)
        if isinstance(parsed, ProducerIdBlockKey):
            if value is None:
                raise TransactionLogRecordError("tombstone for the producer id block key")
            self._producer_ids.replay(decode_producer_id_block_value(value))
            return
        txn_id = parsed.transactional_id
        new = None if value is None else decode_value(value)
        pending = self._pending.pop(txn_id, None)
        if pending is not None:
            target = pending.target
            matches = (
                new is None
                if target.state is TransactionState.DEAD
                else new == target.to_log_value()
            )
            if not matches:
                raise TransactionLogReplayError(
                    f"{txn_id}: replayed {new} while {target} was pending"
                )
        elif new is not None:
            check_replayed_transition(self._txns.get(txn_id), new)
        previous = self._txns.get(txn_id)
        if previous is not None and self._owners.get(previous.producer_id) == txn_id:
            del self._owners[previous.producer_id]
        if new is None:
            self._txns.pop(txn_id, None)
        else:
            meta = TransactionMetadata.from_log_value(txn_id, new)
            self._txns[txn_id] = meta
            if meta.producer_id >= 0:
                self._owners[meta.producer_id] = txn_id

    def abort_pending(self, transactional_id: str) -> None:
        """The records of the id's pending transition were not written: forget the transition
        (the state is unchanged). Idempotent."""
        self._pending.pop(transactional_id, None)

    # -- admin ----------------------------------------------------------------------------

    def describe(self, ids: list[str]) -> list[TxnDescription]:
        """DescribeTransactions, from the durable state."""
        out: list[TxnDescription] = []
        for txn_id in ids:
            if not txn_id:
                out.append(TxnDescription(txn_id, ErrorCode.invalid_request))
                continue
            meta = self._txns.get(txn_id)
            if meta is None or meta.state is TransactionState.DEAD:
                out.append(TxnDescription(txn_id, ErrorCode.transactional_id_not_found))
                continue
            by_topic: dict[str, list[int]] = {}
            for topic, partition in meta.partitions:
                by_topic.setdefault(topic, []).append(partition)
            out.append(
                TxnDescription(
                    transactional_id=txn_id,
                    error=ErrorCode.none,
                    state=meta.state.kafka_name,
                    producer_id=meta.producer_id,
                    producer_epoch=meta.producer_epoch,
                    transaction_timeout_ms=meta.txn_timeout_ms,
                    transaction_start_time_ms=meta.txn_start_timestamp,
                    topics=tuple(
                        (topic, tuple(sorted(parts))) for topic, parts in sorted(by_topic.items())
                    ),
                )
            )
        return out

    def was_issued(self, producer_id: int) -> bool:
        """Could this coordinator have handed out `producer_id`? Ids are handed out only from
        blocks whose record is durable, so one at or past the end of the highest durable block
        never was (it is durable too: the answer holds across restarts)."""
        return 0 <= producer_id < self._producer_ids.durable_end

    def owner_of(self, producer_id: int) -> str | None:
        """The transactional id whose durable metadata holds `producer_id`, if any."""
        return self._owners.get(producer_id)

    def get(self, transactional_id: str) -> TransactionMetadata | None:
        """The durable metadata of a transactional id (None if unknown or expired)."""
        return self._txns.get(transactional_id)

    def transactions(self) -> Mapping[str, TransactionMetadata]:
        """A copy of every transactional id's durable metadata."""
        return dict(self._txns)

    def has_pending(self, transactional_id: str) -> bool:
        return transactional_id in self._pending

    # -- internals ------------------------------------------------------------------------

    def _pending_result(
        self,
        target: TransactionMetadata,
        response: T,
        *,
        markers: MarkerJob | None = None,
        extra_records: list[Record] | None = None,
    ) -> CoordinatorResult[T]:
        txn_id = target.transactional_id
        if txn_id in self._pending:
            raise IllegalTransitionError(f"{txn_id}: a transition is already pending")
        value = None if target.state is TransactionState.DEAD else target.to_log_value()
        records = [*(extra_records or []), transaction_record(txn_id, value)]
        self._pending[txn_id] = _Pending(target)
        return CoordinatorResult(records, response, markers=markers, transactional_id=txn_id)

    def _marker_job(self, meta: TransactionMetadata) -> MarkerJob:
        return MarkerJob(
            transactional_id=meta.transactional_id,
            producer_id=meta.producer_id,
            producer_epoch=meta.producer_epoch,
            commit=meta.state is TransactionState.PREPARE_COMMIT,
            coordinator_epoch=self._coordinator_epoch,
            partitions=tuple(sorted(meta.partitions)),
            transaction_version=meta.client_transaction_version,
        )

    @staticmethod
    def _init_error(error: ErrorCode) -> CoordinatorResult[InitProducerIdResponse]:
        return CoordinatorResult([], InitProducerIdResponse(error))

    # Last in the class, and with builtins.list, since the method shadows `list` in the class.
    def list(
        self,
        state_filters: Iterable[str],
        producer_id_filters: Iterable[int],
        duration_filter_ms: int = -1,
    ) -> builtins.list[TxnListing]:
        """ListTransactions. An unknown state name matches nothing (the broker reports it with
        ``transaction_state.unknown_state_filters``); ``duration_filter_ms`` >= 0 keeps the
        transactions started more than that long ago (KIP-994)."""
        state_names = set(state_filters)
        states = {s for name in state_names if (s := TransactionState.from_name(name)) is not None}
        producer_ids = set(producer_id_filters)
        now = self._clock()
        out: builtins.list[TxnListing] = []
        for txn_id, meta in sorted(self._txns.items()):
            if meta.state is TransactionState.DEAD:
                continue
            if producer_ids and meta.producer_id not in producer_ids:
                continue
            if state_names and meta.state not in states:
                continue
            if duration_filter_ms >= 0 and now - meta.txn_start_timestamp <= duration_filter_ms:
                continue
            out.append(TxnListing(txn_id, meta.producer_id, meta.state.kafka_name))
        return out


def _is_valid_producer_id(meta: TransactionMetadata, producer_id: int, epoch: int) -> bool:
    """Whether an InitProducerId presenting (producer id, epoch) may proceed (KIP-360): a just
    created id, the current producer id (the epoch is checked next), or the previous producer id
    with an exhausted epoch (a retry after the coordinator moved to a new producer id)."""
    return (
        meta.producer_epoch == NO_PRODUCER_EPOCH
        or producer_id == meta.producer_id
        or (producer_id == meta.previous_producer_id and is_epoch_exhausted(epoch))
    )
