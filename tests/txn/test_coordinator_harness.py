"""A simulated broker around the sans-IO TransactionCoordinator, shared by the coordinator tests.

It plays the broker's part of the contract: append a result's records to a durable log (or
fail the append and call abort_pending), replay them, then answer; write markers after the
Prepare* record is durable and report them with markers_written; restart = a new coordinator
that replays the durable log and re-drives in_doubt(). No tests here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.clock import ManualClock
from onceflow.txn.coordinator import (
    CoordinatorResult,
    InitProducerIdResponse,
    MarkerJob,
    TransactionCoordinator,
)

Record = tuple[bytes, bytes | None]
T = TypeVar("T")

TIMEOUT_MS = 60_000


@dataclass
class Producer:
    """What a client instance holds: its producer id and epoch."""

    transactional_id: str
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass
class SimulatedBroker:
    clock: ManualClock = field(default_factory=ManualClock)
    config: dict[str, Any] = field(default_factory=dict)
    log: list[Record] = field(default_factory=list)
    # Marker jobs whose Prepare* record is durable, waiting for their markers to be written.
    marker_queue: list[MarkerJob] = field(default_factory=list)
    markers_written_log: list[MarkerJob] = field(default_factory=list)
    coordinator: TransactionCoordinator = field(init=False)

    def __post_init__(self) -> None:
        self.coordinator = TransactionCoordinator(self.clock, **self.config)

    # -- the broker's side of the contract --------------------------------------------------

    def write(self, result: CoordinatorResult[T]) -> T:
        """Append the records durably, replay them, queue the markers, return the response."""
        self.log.extend(result.records)
        for key, value in result.records:
            self.coordinator.replay(key, value)
        if result.markers is not None:
            self.marker_queue.append(result.markers)
        return result.response

    def fail(self, result: CoordinatorResult[Any]) -> ErrorCode:
        """The append failed before anything reached the log."""
        if result.transactional_id is not None:
            self.coordinator.abort_pending(result.transactional_id)
        return ErrorCode.coordinator_not_available

    def write_markers(self) -> None:
        """Write every queued marker job, then record completion."""
        while self.marker_queue:
            job = self.marker_queue.pop(0)
            self.markers_written_log.append(job)
            result = self.coordinator.markers_written(job.transactional_id, job.producer_epoch)
            assert result.response == ErrorCode.none, result
            self.write(result)

    def restart(self) -> TransactionCoordinator:
        """Crash and load: a new coordinator replays the durable log; in-doubt work resumes."""
        self.coordinator = TransactionCoordinator(self.clock, **self.config)
        for key, value in self.log:
            self.coordinator.replay(key, value)
        self.marker_queue = self.coordinator.in_doubt()
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
