"""The broker's coordinator runtime over in-memory logs, shared by the coordinator tests.

`SimulatedBroker` runs `onceflow.coordinator.runtime.CoordinatorRuntime` (the driver the broker
and the simulation run) with the runtime's interfaces in memory: the transaction log is a list
of records, an append is durable at once (or, with `hold`, when `release` says so), marker jobs
and timers wait until the test runs them. Restart = a new coordinator and runtime that replay
the durable log and re-drive in_doubt(). A helper module: no tests here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.clock import ManualClock
from onceflow.coordinator.runtime import (
    BatchProducer,
    CoordinatorRuntime,
    CoordinatorUnavailableError,
    Durable,
)
from onceflow.groups.coordinator import GroupCoordinator
from onceflow.txn.coordinator import (
    CoordinatorResult,
    InitProducerIdResponse,
    MarkerJob,
    TransactionCoordinator,
)

Record = tuple[bytes, bytes | None]
T = TypeVar("T")

TIMEOUT_MS = 60_000


class AppendFailedError(OSError):
    """An append the test made fail: nothing reached the log."""


@dataclass
class Producer:
    """What a client instance holds: its producer id and epoch."""

    transactional_id: str
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass
class OffsetsLog:
    """`__consumer_offsets` in memory: the markers the runtime appends there."""

    markers: list[tuple[int, bool]] = field(default_factory=list)

    def append(self, records: Sequence[Record], producer: BatchProducer) -> int:
        raise AssertionError("these tests commit no offsets")

    def append_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> int:
        self.markers.append((producer_id, commit))
        return len(self.markers)


@dataclass
class SimulatedBroker:
    clock: ManualClock = field(default_factory=ManualClock)
    config: dict[str, Any] = field(default_factory=dict)
    # The durable transaction log; appended records wait in `staged` until they are durable.
    log: list[Record] = field(default_factory=list)
    staged: dict[tuple[str, int], list[Record]] = field(default_factory=dict)
    # Called with each record as it becomes durable, in log order.
    on_durable: Callable[[Record], None] = lambda _record: None
    # Markers appended to the topics' partitions: (topic, index, job).
    markers: list[tuple[str, int, MarkerJob]] = field(default_factory=list)
    offsets: OffsetsLog = field(default_factory=OffsetsLog)
    # The runtime's tasks (marker jobs) and timers (marker retries), run by the test.
    tasks: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    timers: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    # With `hold`, durability waits until release(); `fail_appends` appends fail first.
    hold: bool = False
    held: list[tuple[Sequence[Any], Callable[[Durable], None]]] = field(default_factory=list)
    fail_appends: int = 0
    appends: int = 0
    errors: list[BaseException] = field(default_factory=list)
    coordinator: TransactionCoordinator = field(init=False)
    runtime: CoordinatorRuntime = field(init=False)

    def __post_init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self.coordinator = TransactionCoordinator(self.clock, **self.config)
        self.runtime = CoordinatorRuntime(
            self.coordinator,
            GroupCoordinator(self.clock),
            transaction_log=self,
            offsets_log=self.offsets,
            partitions=self,
            durability=self,
            timer=self,
            on_error=self.errors.append,
        )

    # -- the runtime's interfaces -----------------------------------------------------------

    def append(self, records: Sequence[Record], producer: BatchProducer) -> tuple[str, int]:
        if self.fail_appends:
            self.fail_appends -= 1
            raise AppendFailedError("the append failed")
        self.appends += 1
        position = ("transaction log", self.appends)
        self.staged[position] = list(records)
        return position

    def append_marker(self, topic: str, index: int, job: MarkerJob) -> tuple[str, int]:
        self.markers.append((topic, index, job))
        return ("markers", len(self.markers))

    def when_durable(self, positions: Sequence[Any], then: Callable[[Durable], None]) -> None:
        if self.hold:
            self.held.append((positions, then))
        else:
            self._durable(positions)
            then(Durable())

    def _durable(self, positions: Sequence[Any]) -> None:
        for position in positions:
            for record in self.staged.pop(position, []):
                self.on_durable(record)
                self.log.append(record)

    def schedule(
        self, delay_s: float, label: str, callback: Callable[[], None]
    ) -> Callable[[], None]:
        entry = (label, callback)
        self.timers.append(entry)
        return lambda: self.timers.remove(entry) if entry in self.timers else None

    def run_soon(self, label: str, callback: Callable[[], None]) -> None:
        self.tasks.append((label, callback))

    # -- the broker's side of the contract --------------------------------------------------

    def submit(
        self,
        result: CoordinatorResult[T],
        respond: Callable[[T], None],
        fail: Callable[[Exception], None],
    ) -> None:
        """Transactions.run, as the handlers call it (bounded)."""
        self.runtime.run(result, respond, fail)

    def write(self, result: CoordinatorResult[T]) -> T:
        """Run the result through the runtime (durable at once); its response."""
        answers: list[T] = []
        failures: list[Exception] = []
        self.submit(result, answers.append, failures.append)
        if failures:
            raise failures[0]
        (answer,) = answers
        return answer

    def fail(self, result: CoordinatorResult[Any]) -> ErrorCode:
        """The append fails before anything reached the log."""
        if not result.records:
            return ErrorCode.coordinator_not_available  # nothing to append, nothing pending
        self.fail_appends += 1
        try:
            self.write(result)
        except CoordinatorUnavailableError as e:
            return e.error_code
        raise AssertionError("the append did not fail")

    def release(self, index: int = 0) -> None:
        """The index-th held wait for durability ends (its records are durable)."""
        positions, then = self.held.pop(index)
        self._durable(positions)
        then(Durable())

    @property
    def marker_queue(self) -> list[MarkerJob]:
        """Marker jobs whose Prepare* record is durable, their markers not yet written."""
        return self.runtime.marker_jobs()

    def write_markers(self) -> None:
        """Run every queued marker job (and those they queue): markers, then Complete*."""
        while self.tasks:
            _, task = self.tasks.pop(0)
            task()

    def restart(self) -> TransactionCoordinator:
        """Crash and load: a new coordinator replays the durable log; in-doubt work resumes."""
        self.tasks.clear()
        self.timers.clear()
        self.held.clear()
        self.staged.clear()
        self._start()
        self.runtime.load_transactions(self.log)
        self.runtime.complete_in_doubt()
        return self.coordinator

    # -- client calls that are written at once -----------------------------------------------

    def init(
        self, producer: Producer, timeout_ms: int = TIMEOUT_MS, *, kip360: bool = False
    ) -> InitProducerIdResponse:
        """InitProducerId; with kip360 the producer presents its current id and epoch."""
        pid, epoch = (producer.producer_id, producer.producer_epoch) if kip360 else (-1, -1)
        response = self.write(
            self.coordinator.init_producer_id(producer.transactional_id, timeout_ms, pid, epoch)
        )
        if response.error == ErrorCode.none:
            producer.producer_id = response.producer_id
            producer.producer_epoch = response.producer_epoch
        return response

    def new_producer(self, transactional_id: str, timeout_ms: int = TIMEOUT_MS) -> Producer:
        producer = Producer(transactional_id)
        response = self.init(producer, timeout_ms)
        assert response.error == ErrorCode.none, response
        return producer

    def add(self, producer: Producer, *partitions: tuple[str, int]) -> dict[Any, ErrorCode]:
        return self.write(
            self.coordinator.add_partitions(
                producer.transactional_id,
                producer.producer_id,
                producer.producer_epoch,
                list(partitions),
            )
        )

    def add_offsets(self, producer: Producer, group_id: str = "group") -> ErrorCode:
        return self.write(
            self.coordinator.add_offsets(
                producer.transactional_id, producer.producer_id, producer.producer_epoch, group_id
            )
        )

    def end(self, producer: Producer, commit: bool) -> ErrorCode:
        return self.write(
            self.coordinator.end_txn(
                producer.transactional_id, producer.producer_id, producer.producer_epoch, commit
            )
        )

    def state(self, transactional_id: str) -> str:
        (description,) = self.coordinator.describe([transactional_id])
        return description.state
