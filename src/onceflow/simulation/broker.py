"""A simulated broker: the real sans-IO cores glued together as `onceflow.broker` glues them,
over simulated logs, with every asynchronous wait turned into an event the scheduler runs.

Mirrored from the broker, step for step:
- Produce: `Partition.append_records` itself (validation, KIP-890 verification, idempotence
  checks, append, producer state), answered once the partition's appended data is durable
  (acks=all).
- Coordinator results (`broker.transactions.Transactions.run`): records appended to
  `__transaction_state`, replayed once durable, then the answer and the markers.
- Markers (`Transactions._write_markers`): all of a job's markers appended at once (to the
  partitions through `Partition.append_marker`, to `__consumer_offsets` as a bare marker),
  then, once all are durable, `GroupCoordinator.complete_transaction` and `markers_written`.
- TxnOffsetCommit and `Broker.write_offsets_records`: a transactional batch on
  `__consumer_offsets`, replayed once durable.
- Start-up (`Broker.start`): every partition opened as `Partition.open` opens it (producer
  snapshot, aborted index, replay of the log after the snapshot), the offsets log and the
  transaction log replayed from the start, then in-doubt transactions completed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from onceflow.broker import partition as partition_module
from onceflow.broker.append_outcome import AppendRefused
from onceflow.broker.partition import Partition
from onceflow.clock import Clock
from onceflow.groups.coordinator import GroupCoordinator
from onceflow.groups.offsets import OffsetAndMetadata
from onceflow.records.batch import iter_batches
from onceflow.records.builder import build_batch
from onceflow.records.control import ControlType, build_marker, parse_control_record
from onceflow.records.record import DecodedBatch
from onceflow.simulation.messages import (
    AddOffsets,
    AddPartitions,
    Answer,
    EndTxn,
    InitProducerId,
    OffsetFetch,
    Produce,
    TopicPartition,
    TxnOffsetCommit,
)
from onceflow.simulation.storage import SimulatedLog, StoredBatch
from onceflow.txn.aborted_index import AbortedTxnIndex
from onceflow.txn.coordinator import (
    OFFSETS_TOPIC,
    CoordinatorResult,
    MarkerJob,
    TransactionCoordinator,
    error_for_version,
)
from onceflow.txn.errors import TxnError

Reply = Callable[[Answer], None]
PRODUCER_ID_EXPIRATION_MS = 86_400_000
# The newest version of each transactional API: errors are answered as such a client sees them.
_VERSIONS = {22: 5, 24: 3, 25: 4, 26: 4, 28: 4}


class BrokerObserver(Protocol):
    """What the checker hears from the broker, as it happens."""

    def appended(self, tp: TopicPartition, batches: list[StoredBatch]) -> None: ...

    def answered(self, request: object, answer: Answer) -> None: ...

    def trace(self, line: str) -> None: ...


@dataclass
class Waiter:
    """Code to run once each log is durable up to its offset (a group-commit waiter)."""

    needs: list[tuple[SimulatedLog, int]]
    then: Callable[[], None]
    label: str

    def ready(self) -> bool:
        return all(log.flushed_offset >= offset for log, offset in self.needs)


@dataclass
class Storage:
    """What outlives a crash: the logs and each partition's directory."""

    root: Path
    partitions: dict[TopicPartition, SimulatedLog]
    txn_log: SimulatedLog
    offsets_log: SimulatedLog

    def logs(self) -> list[tuple[str, SimulatedLog]]:
        named = [(f"{t}-{i}", log) for (t, i), log in self.partitions.items()]
        return [
            *named,
            ("__transaction_state-0", self.txn_log),
            ("__consumer_offsets-0", self.offsets_log),
        ]

    @classmethod
    def create(
        cls, root: Path, partitions: Iterable[TopicPartition], segment_batches: int
    ) -> Storage:
        return cls(
            root=root,
            partitions={
                tp: SimulatedLog(root / f"{tp[0]}-{tp[1]}", segment_batches=segment_batches)
                for tp in partitions
            },
            txn_log=SimulatedLog(root / "__transaction_state-0", segment_batches=1 << 30),
            offsets_log=SimulatedLog(root / "__consumer_offsets-0", segment_batches=1 << 30),
        )


@dataclass
class BrokerSettings:
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 604_800_000


@dataclass
class SimBroker:
    """One incarnation of the broker; a crash makes a new one over the same Storage."""

    storage: Storage
    clock: Clock
    settings: BrokerSettings
    observer: BrokerObserver
    incarnation: int = 0
    partitions: dict[TopicPartition, Partition] = field(default_factory=dict)
    coordinator: TransactionCoordinator = field(init=False)
    groups: GroupCoordinator = field(init=False)
    waiters: list[Waiter] = field(default_factory=list)
    # Marker jobs spawned and not yet run (Transactions._spawn_markers' tasks).
    tasks: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    # Base offsets of the coordinator-log batches whose effect the live cores have taken.
    applied_txn: set[int] = field(default_factory=set)
    applied_offsets: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.coordinator = TransactionCoordinator(
            self.clock,
            transaction_max_timeout_ms=self.settings.transaction_max_timeout_ms,
            transactional_id_expiration_ms=self.settings.transactional_id_expiration_ms,
        )
        self.groups = GroupCoordinator(self.clock, member_id_suffix=lambda: "sim")

    # -- start-up (Broker.start) -------------------------------------------------------------

    def start(self) -> None:
        for tp, log in self.storage.partitions.items():
            self.partitions[tp] = open_partition(tp, log, self.clock)
        self._load_offsets()
        self._load_transactions()
        self.complete_in_doubt()

    def _load_offsets(self) -> None:
        for stored in self.storage.offsets_log.iter_stored():
            apply_offsets_batch(self.groups, stored.decoded)
            self.applied_offsets.add(stored.header.base_offset)

    def _load_transactions(self) -> None:
        for stored in self.storage.txn_log.iter_stored():
            for record in stored.decoded.records:
                self.coordinator.replay(record.key or b"", record.value)
            self.applied_txn.add(stored.header.base_offset)

    def complete_in_doubt(self) -> None:
        for job in self.coordinator.in_doubt():
            self.observer.trace(f"  in doubt: {job.transactional_id} commit={job.commit}")
            self._spawn_markers(job)

    # -- durability --------------------------------------------------------------------------

    def wait(
        self, needs: list[tuple[SimulatedLog, int]], then: Callable[[], None], label: str
    ) -> None:
        waiter = Waiter(needs, then, label)
        if waiter.ready():
            then()
        else:
            self.waiters.append(waiter)

    def release_waiters(self) -> None:
        """After an fsync round: run every waiter now satisfied, in the order they waited."""
        while True:
            ready = next((w for w in self.waiters if w.ready()), None)
            if ready is None:
                return
            self.waiters.remove(ready)
            ready.then()

    # -- requests ----------------------------------------------------------------------------

    def handle(self, request: object, reply: Reply) -> None:
        if isinstance(request, Produce):
            self._produce(request, reply)
        elif isinstance(request, InitProducerId):
            result = self.coordinator.init_producer_id(
                request.transactional_id,
                request.timeout_ms,
                request.producer_id,
                request.producer_epoch,
            )
            self.run(result, lambda r: reply(_init_answer(r)), request)
        elif isinstance(request, AddPartitions):
            add = self.coordinator.add_partitions(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                list(request.partitions),
            )
            self.run(add, lambda errors: reply(_partitions_answer(errors)), request)
        elif isinstance(request, AddOffsets):
            offsets = self.coordinator.add_offsets(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.group_id,
            )
            self.run(
                offsets, lambda e: reply(Answer(error_for_version(e, 25, _VERSIONS[25]))), request
            )
        elif isinstance(request, EndTxn):
            end = self.coordinator.end_txn(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.commit,
            )
            self.run(end, lambda e: reply(Answer(error_for_version(e, 26, _VERSIONS[26]))), request)
        elif isinstance(request, TxnOffsetCommit):
            self._txn_offset_commit(request, reply)
        elif isinstance(request, OffsetFetch):
            offsets = self.fetch_offsets(
                request.group_id, list(request.partitions), request.require_stable
            )
            reply(Answer(ErrorCode.none, offsets))
        else:
            raise TypeError(f"unknown request {request!r}")

    def _produce(self, request: Produce, reply: Reply) -> None:
        partition = self.partitions[request.partition]
        before = partition.log.log_end_offset
        try:
            appended = partition.append_records(
                request.records, request.transactional_id, self.coordinator
            )
        except AppendRefused as e:
            reply(Answer(e.code))
            return
        log = partition.log
        assert isinstance(log, SimulatedLog)
        if log.log_end_offset != before:
            self.observer.appended(request.partition, list(log.iter_stored(before)))

        def answer() -> None:
            partition.notify()
            reply(Answer(ErrorCode.none, appended.first_offset))

        self.wait([(log, log.log_end_offset)], answer, f"produce {request.partition}")

    def verify_partition(
        self,
        transactional_id: str | None,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        index: int,
    ) -> bool:
        """Transactions.verify_partition (KIP-890), for TxnOffsetCommit."""
        if not transactional_id:
            return False
        error = self.coordinator.is_in_transaction(
            transactional_id, producer_id, producer_epoch, topic, index
        )
        return error == ErrorCode.none

    def _txn_offset_commit(self, request: TxnOffsetCommit, reply: Reply) -> None:
        offsets = {tp: OffsetAndMetadata(offset) for tp, offset in request.offsets}
        if not self.verify_partition(
            request.transactional_id, request.producer_id, request.producer_epoch, OFFSETS_TOPIC, 0
        ):
            meta = self.coordinator.get(request.transactional_id)
            error = ErrorCode.invalid_txn_state
            if meta is None or meta.producer_id != request.producer_id:
                error = ErrorCode.invalid_producer_id_mapping
            elif meta.producer_epoch != request.producer_epoch:
                error = error_for_version(ErrorCode.producer_fenced, 28, _VERSIONS[28])
            reply(Answer(error, dict.fromkeys(offsets, error)))
            return
        result = self.groups.txn_commit_offsets(
            request.transactional_id,
            request.group_id,
            request.producer_id,
            request.producer_epoch,
            -1,
            "",
            None,
            offsets,
        )
        errors = dict(result.response)
        first_error = next((e for e in errors.values() if e != ErrorCode.none), ErrorCode.none)
        if not result.records:
            reply(Answer(first_error, errors))
            return
        log = self.storage.offsets_log
        stored = append_coordinator_records(
            log,
            result.records,
            self.clock(),
            producer_id=request.producer_id,
            producer_epoch=request.producer_epoch,
            transactional=True,
        )

        def replay() -> None:
            apply_offsets_batch(self.groups, stored.decoded)
            self.applied_offsets.add(stored.header.base_offset)
            reply(Answer(first_error, errors))

        self.wait([(log, log.log_end_offset)], replay, "txn offset commit")

    def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition], require_stable: bool
    ) -> dict[TopicPartition, Any]:
        """OffsetFetch of named partitions, as a consumer asks for its assignment."""
        return dict(self.groups.fetch_offsets(group_id, partitions, require_stable))

    # -- coordinator results (Transactions.run) ----------------------------------------------

    def run(
        self, result: CoordinatorResult[Any], respond: Callable[[Any], None], request: object = None
    ) -> None:
        if not result.records:
            if result.markers is not None:
                self._spawn_markers(result.markers)
            respond(result.response)
            return
        log = self.storage.txn_log
        stored = append_coordinator_records(log, result.records, self.clock())
        label = type(request).__name__ if request is not None else "coordinator"

        def after_durable() -> None:
            for record in stored.decoded.records:
                self.coordinator.replay(record.key or b"", record.value)
            self.applied_txn.add(stored.header.base_offset)
            if result.markers is not None:
                self._spawn_markers(result.markers)
            respond(result.response)

        self.wait([(log, log.log_end_offset)], after_durable, label)

    def _spawn_markers(self, job: MarkerJob) -> None:
        label = f"markers {job.transactional_id} {'commit' if job.commit else 'abort'}"
        self.tasks.append((label, lambda: self._write_markers(job)))

    def _write_markers(self, job: MarkerJob) -> None:
        needs: list[tuple[SimulatedLog, int]] = []
        marked: list[Partition] = []
        offsets_marker: int | None = None
        for topic, index in job.partitions:
            if topic == OFFSETS_TOPIC:
                # CoordinatorLog.append_marker: no producer-state checks on the offsets log
                log = self.storage.offsets_log
                data = build_marker(
                    job.producer_id,
                    job.producer_epoch,
                    job.commit,
                    job.coordinator_epoch,
                    self.clock(),
                )
                offsets_marker = log.append(
                    data, list(iter_batches(data, verify_crc=False))
                ).first_offset
                needs.append((log, log.log_end_offset))
                continue
            partition = self.partitions[(topic, index)]
            log = partition.log
            assert isinstance(log, SimulatedLog)
            before = log.log_end_offset
            try:
                partition.append_marker(
                    job.producer_id,
                    job.producer_epoch,
                    job.commit,
                    job.coordinator_epoch,
                    self.clock(),
                )
            except TxnError as e:
                self.observer.trace(f"  marker for {topic}-{index} skipped: {e}")
                continue
            self.observer.appended((topic, index), list(log.iter_stored(before)))
            marked.append(partition)
            needs.append((log, log.log_end_offset))

        def after_durable() -> None:
            for partition in marked:
                partition.notify()
            if offsets_marker is not None:
                self.groups.complete_transaction(job.producer_id, job.commit)
                self.applied_offsets.add(offsets_marker)
            self.run(
                self.coordinator.markers_written(job.transactional_id, job.producer_epoch),
                lambda _: None,
                "markers_written",
            )

        self.wait(needs, after_durable, f"markers durable {job.transactional_id}")

    # -- timers (Transactions.timeout_loop) --------------------------------------------------

    def expire(self) -> int:
        results = self.coordinator.expire_timed_out()
        for result in results:
            self.observer.trace(f"  timeout abort of {result.transactional_id}")
            self.run(result, lambda _: None, "timeout")
        expired = self.coordinator.expire_transactional_ids()
        for result in expired:
            self.observer.trace(f"  expire id {result.transactional_id}")
            self.run(result, lambda _: None, "expire id")
        return len(results) + len(expired)

    # -- crash -------------------------------------------------------------------------------

    def abandon(self) -> None:
        """The process dies: file descriptors close, nothing is flushed."""
        for partition in self.partitions.values():
            partition.aborted.close()

    def snapshot_state(self) -> CoreState:
        return CoreState(
            coordinator=copy.deepcopy(self.coordinator),
            groups=copy.deepcopy(self.groups),
            applied_txn=set(self.applied_txn),
            applied_offsets=set(self.applied_offsets),
        )


@dataclass
class CoreState:
    """A deep copy of the live coordinators at a crash, and which batches they had applied."""

    coordinator: TransactionCoordinator
    groups: GroupCoordinator
    applied_txn: set[int]
    applied_offsets: set[int]


def open_partition(tp: TopicPartition, log: SimulatedLog, clock: Clock) -> Partition:
    """`Partition.open` with a simulated log in place of `PartitionLog.open`: the newest usable
    producer snapshot, the aborted index, then the replay of the log after the snapshot."""
    producers = partition_module._load_snapshot(
        log.directory, log.log_end_offset, clock, PRODUCER_ID_EXPIRATION_MS
    )
    aborted = AbortedTxnIndex.open(log.directory)
    partition = Partition(tp[0], tp[1], log, producers, aborted)  # type: ignore[arg-type]
    partition._replay_from(producers.map_end_offset)
    partition._segments_seen = len(log.segment_base_offsets)
    return partition


def append_coordinator_records(
    log: SimulatedLog,
    records: list[tuple[bytes, bytes | None]],
    now: int,
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    transactional: bool = False,
) -> StoredBatch:
    """CoordinatorLog.append: one batch holding the result's records."""
    data = build_batch(
        [(key, value, (), now) for key, value in records],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=transactional,
    )
    log.append(data, list(iter_batches(data, verify_crc=False)))
    return log.batches[-1]


def apply_offsets_batch(groups: GroupCoordinator, batch: DecodedBatch) -> None:
    """Broker._load_offsets for one batch: a marker completes a transaction, records replay."""
    header = batch.header
    if header.is_control:
        commit = parse_control_record(batch.records[0])[0] == ControlType.COMMIT
        groups.complete_transaction(header.producer_id, commit)
        return
    for record in batch.records:
        groups.replay(
            record.key or b"",
            record.value,
            header.producer_id,
            header.producer_epoch,
            header.is_transactional,
        )


def _init_answer(response: Any) -> Answer:
    error = error_for_version(response.error, 22, _VERSIONS[22])
    return Answer(error, (response.producer_id, response.producer_epoch))


def _partitions_answer(errors: dict[TopicPartition, ErrorCode]) -> Answer:
    codes = {tp: error_for_version(e, 24, _VERSIONS[24]) for tp, e in errors.items()}
    first = next((e for e in codes.values() if e != ErrorCode.none), ErrorCode.none)
    return Answer(first, codes)
