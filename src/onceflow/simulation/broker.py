"""A simulated broker: the broker's own coordinator runtime and partitions over simulated
logs, with every asynchronous wait turned into an event the scheduler runs.

What runs is the broker's code: `broker.partition.append_records_to_leader` for Produce
(validation, KIP-890 verification, idempotence checks, append, producer state),
`onceflow.coordinator.runtime` for every coordinator result (append -> durable -> replay ->
answer -> markers -> Complete*, the held-request bound, TxnOffsetCommit, loading at start-up
and in-doubt transactions). This
module only implements the runtime's interfaces for the scheduler: logs in memory
(`SimulatedLog`), durability as waiters released by simulated fsync rounds, tasks and timers as
events. Nothing may fail to be written here, so any exception the runtime meets is raised (a
failing seed), never retried. Start-up loads every partition as `UnifiedLog.open` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from onceflow.broker.partition import append_records_to_leader
from onceflow.clock import Clock
from onceflow.coordinator.result import MarkerJob, Record
from onceflow.coordinator.runtime import (
    BatchProducer,
    CoordinatorRuntime,
    CoordinatorUnavailableError,
    Durable,
    records_of,
)
from onceflow.groups.coordinator import GroupCoordinator
from onceflow.groups.offsets import OffsetAndMetadata
from onceflow.log.unified_log import UnifiedLog
from onceflow.records.batch import iter_batches, transactional_header
from onceflow.records.builder import build_batch
from onceflow.records.control import build_marker
from onceflow.records.validation import AppendRefused
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
from onceflow.txn.coordinator import (
    OFFSETS_TOPIC,
    CoordinatorResult,
    EndTxnResponse,
    InitProducerIdResponse,
    TransactionCoordinator,
    error_for_version,
    produce_error_for_verification,
)

Reply = Callable[[Answer], None]
PRODUCER_ID_EXPIRATION_MS = 86_400_000
# The newest version of each transactional API: errors are answered as such a client sees them.
_VERSIONS = {22: 5, 24: 3, 25: 4, 26: 4, 28: 4}


class BrokerObserver(Protocol):
    """What the checker hears from the broker, as it happens."""

    def appended(self, tp: TopicPartition, batches: list[StoredBatch]) -> None: ...

    def answered(self, request: object, answer: Answer) -> None: ...

    def trace(self, line: str) -> None: ...


@dataclass(frozen=True)
class Position:
    """Where an append ended in a simulated log; `applied` collects the base offsets of the
    coordinator-log batches whose effect the live cores take once durable."""

    log: SimulatedLog
    offset: int
    base_offset: int = -1
    applied: set[int] | None = field(default=None, compare=False, hash=False)


@dataclass
class Waiter:
    """Code to run once each log is durable up to its offset (a group-commit waiter)."""

    needs: list[Position]
    then: Callable[[], None]
    label: str

    def ready(self) -> bool:
        return all(p.log.flushed_offset >= p.offset for p in self.needs)


@dataclass(eq=False)
class Timer:
    """A callback due at a time of the simulated clock (the held-request bound, a retry)."""

    due: int
    label: str
    callback: Callable[[], None]


@dataclass
class Storage:
    """What outlives a crash: the logs and each partition's directory."""

    root: Path
    partitions: dict[TopicPartition, SimulatedLog]
    txn_log: SimulatedLog
    offsets_log: SimulatedLog

    @cached_property
    def all_logs(self) -> list[SimulatedLog]:
        """Every log (the set never changes), for the per-step checks."""
        return [log for _, log in self.logs()]

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


class _CoordinatorLog:
    """The runtime's CoordinatorLog over a simulated log, as coordinator/internal_log.py appends."""

    def __init__(self, log: SimulatedLog, clock: Clock, applied: set[int]) -> None:
        self.log = log
        self.clock = clock
        self.applied = applied

    def append(self, records: Sequence[Record], producer: BatchProducer) -> Position:
        data = build_batch(
            [(key, value, (), self.clock()) for key, value in records],
            producer_id=producer.producer_id,
            producer_epoch=producer.producer_epoch,
            transactional=producer.transactional,
        )
        return self._append(data)

    def append_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> Position:
        data = build_marker(producer_id, producer_epoch, commit, coordinator_epoch, self.clock())
        return self._append(data)

    def _append(self, data: bytes) -> Position:
        info = self.log.append(data, list(iter_batches(data, verify_crc=False)))
        return Position(self.log, self.log.log_end_offset, info.first_offset, self.applied)


@dataclass
class SimBroker:
    """One incarnation of the broker; a crash makes a new one over the same Storage."""

    storage: Storage
    clock: Clock
    settings: BrokerSettings
    observer: BrokerObserver
    incarnation: int = 0
    partitions: dict[TopicPartition, UnifiedLog] = field(default_factory=dict)
    coordinator: TransactionCoordinator = field(init=False)
    groups: GroupCoordinator = field(init=False)
    runtime: CoordinatorRuntime = field(init=False)
    waiters: list[Waiter] = field(default_factory=list)
    # The runtime's tasks (marker jobs) not yet run, and its timers.
    tasks: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    timers: list[Timer] = field(default_factory=list)
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
        self.runtime = CoordinatorRuntime(
            self.coordinator,
            self.groups,
            transaction_log=_CoordinatorLog(self.storage.txn_log, self.clock, self.applied_txn),
            offsets_log=_CoordinatorLog(self.storage.offsets_log, self.clock, self.applied_offsets),
            partitions=self,
            durability=self,
            timer=self,
        )

    # -- start-up (Broker.start) -------------------------------------------------------------

    def start(self) -> None:
        for tp, log in self.storage.partitions.items():
            self.partitions[tp] = open_partition(tp, log, self.clock)
        offsets = list(self.storage.offsets_log.iter_stored())
        self.runtime.load_offsets(stored.decoded for stored in offsets)
        self.applied_offsets.update(stored.header.base_offset for stored in offsets)
        transactions = list(self.storage.txn_log.iter_stored())
        self.runtime.load_transactions(records_of(stored.decoded for stored in transactions))
        self.applied_txn.update(stored.header.base_offset for stored in transactions)
        self.runtime.complete_in_doubt()

    # -- the runtime's Durability: group-commit waiters ---------------------------------------

    def when_durable(self, positions: Sequence[Any], then: Callable[[Durable], None]) -> None:
        def durable() -> None:
            for position in positions:
                if position.applied is not None:
                    position.applied.add(position.base_offset)
            then(Durable())

        waiter = Waiter(list(positions), durable, "durable")
        if waiter.ready():
            durable()
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

    # -- the runtime's Timer: events for the scheduler ----------------------------------------

    def run_soon(self, label: str, callback: Callable[[], None]) -> None:
        self.tasks.append((label, callback))

    def schedule(
        self, delay_s: float, label: str, callback: Callable[[], None]
    ) -> Callable[[], None]:
        timer = Timer(self.clock() + int(delay_s * 1000), label, callback)
        self.timers.append(timer)

        def cancel() -> None:
            if timer in self.timers:
                self.timers.remove(timer)

        return cancel

    def due_timers(self) -> list[Timer]:
        now = self.clock()
        return [timer for timer in self.timers if timer.due <= now]

    def fire(self, timer: Timer) -> None:
        self.timers.remove(timer)
        timer.callback()

    # -- the runtime's MarkerWriter ------------------------------------------------------------

    def append_marker(self, topic: str, index: int, job: MarkerJob) -> Position:
        partition = self.partitions[(topic, index)]
        log = partition.log
        assert isinstance(log, SimulatedLog)
        before = log.log_end_offset
        partition.append_marker(
            job.producer_id,
            job.producer_epoch,
            job.commit,
            job.coordinator_epoch,
            self.clock(),
            transaction_version=job.transaction_version,
        )
        self.observer.appended((topic, index), list(log.iter_stored(before)))
        return Position(log, log.log_end_offset)

    # -- requests ----------------------------------------------------------------------------

    def handle(self, request: object, reply: Reply) -> None:
        if isinstance(request, Produce):
            self._produce(request, reply)
        elif isinstance(request, TxnOffsetCommit):
            self._txn_offset_commit(request, reply)
        elif isinstance(request, OffsetFetch):
            offsets = self.fetch_offsets(
                request.group_id, list(request.partitions), request.require_stable
            )
            reply(Answer(ErrorCode.none, offsets))
        else:
            self._transaction_request(request, reply)

    def _transaction_request(self, request: object, reply: Reply) -> None:
        """The transaction coordinator's requests, as broker/handlers/transactions.py handles
        them (errors as the newest clients see them)."""
        coordinator = self.coordinator
        result: CoordinatorResult[Any]
        if isinstance(request, InitProducerId):
            result = coordinator.init_producer_id(
                request.transactional_id,
                request.timeout_ms,
                request.producer_id,
                request.producer_epoch,
            )
            self.run(result, reply, _init_answer, lambda e: _init_answer(InitProducerIdResponse(e)))
        elif isinstance(request, AddPartitions):
            result = coordinator.add_partitions(*request.producer, list(request.partitions))
            refused = lambda e: _partitions_answer(dict.fromkeys(request.partitions, e))  # noqa: E731
            self.run(result, reply, _partitions_answer, refused)
        elif isinstance(request, AddOffsets):
            result = coordinator.add_offsets(*request.producer, request.group_id)
            self.run(result, reply, _simple_answer(25), _simple_answer(25))
        elif isinstance(request, EndTxn) and request.transaction_version >= 2:
            ended = coordinator.end_transaction(
                *request.producer, request.commit, request.transaction_version
            )
            self.run(ended, reply, _end_txn_answer, lambda e: Answer(e))
        elif isinstance(request, EndTxn):
            result = coordinator.end_txn(*request.producer, request.commit)
            self.run(result, reply, _simple_answer(26), _simple_answer(26))
        else:
            raise TypeError(f"unknown request {request!r}")

    def run(
        self,
        result: CoordinatorResult[Any],
        reply: Reply,
        answer: Callable[[Any], Answer],
        refused: Callable[[ErrorCode], Answer],
    ) -> None:
        """Transactions.run: the runtime runs the result; a refusal answers its error code."""

        def fail(error: Exception) -> None:
            if not isinstance(error, CoordinatorUnavailableError):
                raise error  # nothing else may fail in the simulation: a bug
            reply(refused(error.error_code))

        self.runtime.run(result, lambda response: reply(answer(response)), fail)

    def _add_for_leader(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        tp: TopicPartition,
        then: Callable[[ErrorCode], None],
    ) -> None:
        """Transactions version 2: the leader adds the partition to the producer's transaction
        (broker/handlers/transactions.add_for_leader; markers in flight answer retriable)."""
        if self.runtime.markers_in_flight(transactional_id):
            then(ErrorCode.concurrent_transactions)
            return
        result = self.coordinator.add_partitions(
            transactional_id, producer_id, producer_epoch, [tp], client_transaction_version=2
        )

        def fail(error: Exception) -> None:
            if not isinstance(error, CoordinatorUnavailableError):
                raise error
            then(error.error_code)

        self.runtime.run(result, lambda errors: then(errors[tp]), fail)

    def _produce(self, request: Produce, reply: Reply) -> None:
        header = transactional_header(request.records)
        partition = self.partitions[request.partition]
        if (
            request.transaction_version >= 2
            and request.transactional_id
            and header is not None
            and header.has_producer_id
            and partition.needs_verification(header)
        ):

            def added(error: ErrorCode) -> None:
                if error != ErrorCode.none:
                    reply(Answer(produce_error_for_verification(error, 12)))
                else:
                    self._append(request, reply)

            self._add_for_leader(
                request.transactional_id,
                header.producer_id,
                header.producer_epoch,
                request.partition,
                added,
            )
            return
        self._append(request, reply)

    def _append(self, request: Produce, reply: Reply) -> None:
        partition = self.partitions[request.partition]
        before = partition.log.log_end_offset
        try:
            appended = append_records_to_leader(
                partition, request.records, request.transactional_id, self.coordinator
            )
        except AppendRefused as e:
            reply(Answer(e.code))
            return
        log = partition.log
        assert isinstance(log, SimulatedLog)
        if log.log_end_offset != before:
            self.observer.appended(request.partition, list(log.iter_stored(before)))

        def answer() -> None:
            reply(Answer(ErrorCode.none, appended.first_offset))

        waiter = Waiter([Position(log, log.log_end_offset)], answer, f"produce {request.partition}")
        if waiter.ready():
            answer()
        else:
            self.waiters.append(waiter)

    def _txn_offset_commit(self, request: TxnOffsetCommit, reply: Reply) -> None:
        if request.transaction_version >= 2:
            # TxnOffsetCommit v5: the offsets partition joins the transaction first.
            def added(error: ErrorCode) -> None:
                if error != ErrorCode.none:
                    reply(Answer(error, {tp: error for tp, _ in request.offsets}))
                else:
                    self._commit_offsets(request, reply)

            self._add_for_leader(*request.producer, (OFFSETS_TOPIC, 0), added)
            return
        self._commit_offsets(request, reply)

    def _commit_offsets(self, request: TxnOffsetCommit, reply: Reply) -> None:
        offsets = {tp: OffsetAndMetadata(offset) for tp, offset in request.offsets}
        if not self.runtime.verify_partition(*request.producer, OFFSETS_TOPIC, 0):
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
        self.runtime.write_offsets(
            result.records,
            lambda: reply(Answer(first_error, errors)),
            _raise,
            producer_id=request.producer_id,
            producer_epoch=request.producer_epoch,
        )

    def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition], require_stable: bool
    ) -> dict[TopicPartition, Any]:
        """OffsetFetch of named partitions, as a consumer asks for its assignment."""
        return dict(self.groups.fetch_offsets(group_id, partitions, require_stable))

    # -- timers (Transactions.timeout_tick) --------------------------------------------------

    def expire(self) -> int:
        results = self.runtime.expire()
        for result in results:
            self.observer.trace(f"  expired: {result.transactional_id}")
        return len(results)

    # -- crash -------------------------------------------------------------------------------

    def abandon(self) -> None:
        """The process dies: file descriptors close, nothing is flushed."""
        for partition in self.partitions.values():
            partition.aborted.close()

    def snapshot_state(self) -> CoreState:
        """The live cores at a crash, handed over as they are: this incarnation is dead, so
        nothing else touches them (the comparison after the restart may replay into them)."""
        return CoreState(
            coordinator=self.coordinator,
            groups=self.groups,
            applied_txn=set(self.applied_txn),
            applied_offsets=set(self.applied_offsets),
        )


@dataclass
class CoreState:
    """The live coordinators at a crash, and which batches they had applied."""

    coordinator: TransactionCoordinator
    groups: GroupCoordinator
    applied_txn: set[int]
    applied_offsets: set[int]


def open_partition(tp: TopicPartition, log: SimulatedLog, clock: Clock) -> UnifiedLog:
    """`UnifiedLog.open` with a simulated log in place of `PartitionLog.open`: the newest usable
    producer snapshot, the aborted index, then the replay of the log after the snapshot."""
    simulated: Any = log  # the segments' interface, in memory
    return UnifiedLog.load(tp[0], tp[1], simulated, clock, PRODUCER_ID_EXPIRATION_MS)


def _raise(error: BaseException) -> None:
    raise error  # nothing may fail in the simulation: a bug


def _end_txn_answer(response: EndTxnResponse) -> Answer:
    return Answer(response.error, (response.producer_id, response.producer_epoch))


def _init_answer(response: Any) -> Answer:
    error = error_for_version(response.error, 22, _VERSIONS[22])
    return Answer(error, (response.producer_id, response.producer_epoch))


def _partitions_answer(errors: dict[TopicPartition, ErrorCode]) -> Answer:
    codes = {tp: error_for_version(e, 24, _VERSIONS[24]) for tp, e in errors.items()}
    first = next((e for e in codes.values() if e != ErrorCode.none), ErrorCode.none)
    return Answer(first, codes)


def _simple_answer(api_key: int) -> Callable[[ErrorCode], Answer]:
    return lambda error: Answer(error_for_version(error, api_key, _VERSIONS[api_key]))
