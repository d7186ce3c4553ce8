"""Both coordinators (transactions and groups) at work in the asyncio broker: the coordinator
runtime's interfaces over the broker's logs, its group commit and its event loop.

The broker hands `Coordinators` its collaborators, each as a narrow interface (the two internal
logs, the partitions markers go to, a wait until logs are durable, what a storage error does),
never itself. The driving (append -> durable -> replay -> answer -> markers -> Complete*,
marker retries, the held-request bound) is `onceflow.coordinator.runtime`, which the
deterministic simulation runs too; here are only the asyncio side of it and the handlers'
entry points. After a restart the log is replayed and every transaction found in Prepare* gets
its markers (again): PrepareCommit is the point of no return.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from onceflow.clock import Clock
from onceflow.coordinator.internal_log import InternalLog
from onceflow.coordinator.result import CoordinatorResult, MarkerJob, Record
from onceflow.coordinator.runtime import (
    HELD_REQUEST_TIMEOUT_S,
    MARKER_RETRY_S,
    BatchProducer,
    CoordinatorRuntime,
    CoordinatorUnavailableError,
    Durable,
    records_of,
)
from onceflow.fault_points import delay_point
from onceflow.groups.coordinator import GroupCoordinator
from onceflow.log.partition_log import PartitionLog
from onceflow.txn.coordinator import OFFSETS_TOPIC, TransactionCoordinator

__all__ = [
    "HELD_REQUEST_TIMEOUT_S",
    "MARKER_RETRY_S",
    "OFFSETS_TOPIC",
    "CoordinatorUnavailableError",
    "Coordinators",
]

T = TypeVar("T")


class _Log:
    """A coordinator's log as the runtime appends to it; a position is the log itself (a
    group-commit wait covers everything appended before it)."""

    def __init__(self, log: InternalLog) -> None:
        self._log = log

    def append(self, records: Sequence[Record], producer: BatchProducer) -> PartitionLog:
        self._log.append(
            records,
            producer_id=producer.producer_id,
            producer_epoch=producer.producer_epoch,
            transactional=producer.transactional,
        )
        return self._log.log

    def append_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> PartitionLog:
        self._log.append_marker(producer_id, producer_epoch, commit, coordinator_epoch)
        return self._log.log


class MarkedPartition(Protocol):
    """A topic's partition, as a transaction's marker reaches it."""

    @property
    def log(self) -> PartitionLog: ...

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        timestamp: int,
        *,
        transaction_version: int = 0,
    ) -> None:
        """Append a COMMIT/ABORT marker; raises TxnError (nothing written) if refused."""
        ...


class Partitions(Protocol):
    """The topics' partitions (the broker's topic registry)."""

    def partition(self, name: str, index: int) -> MarkedPartition | None: ...


# Wait until every log is durable, retrying what could not be prepared (EMFILE); the logs
# closed meanwhile (a deleted topic) are given up and returned (broker/durability.py).
UntilDurable = Callable[[Sequence[PartitionLog]], Awaitable[dict[PartitionLog, Exception]]]


class _Partitions:
    """The topics' partitions, as the markers reach them."""

    def __init__(self, partitions: Partitions, clock: Clock) -> None:
        self._partitions = partitions
        self._clock = clock

    def append_marker(self, topic: str, index: int, job: MarkerJob) -> PartitionLog | None:
        partition = self._partitions.partition(topic, index)
        if partition is None:
            return None
        partition.append_marker(
            job.producer_id,
            job.producer_epoch,
            job.commit,
            job.coordinator_epoch,
            self._clock(),
            transaction_version=job.transaction_version,
        )
        return partition.log


class _EventLoop:
    """Durability, timers and tasks on the running event loop; all cancelled by stop()."""

    def __init__(self, until_durable: UntilDurable) -> None:
        self._until_durable = until_durable
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: set[asyncio.TimerHandle] = set()

    def when_durable(
        self, positions: Sequence[PartitionLog], then: Callable[[Durable], None]
    ) -> None:
        # A round that could not prepare a log (EMFILE) is retried (until_durable): the state
        # must follow records once written; a log closed meanwhile (a deleted topic) is given up.
        task = self._start(self._until_durable(positions))

        def done(task: asyncio.Task[Any]) -> None:
            if task.cancelled():
                return
            error = task.exception()
            then(Durable(error=error) if error is not None else Durable(closed=bool(task.result())))

        task.add_done_callback(done)

    def schedule(
        self, delay_s: float, label: str, callback: Callable[[], None]
    ) -> Callable[[], None]:
        handle: asyncio.TimerHandle

        def fire() -> None:
            self._timers.discard(handle)
            callback()

        handle = asyncio.get_running_loop().call_later(delay_s, fire)
        self._timers.add(handle)

        def cancel() -> None:
            self._timers.discard(handle)
            handle.cancel()

        return cancel

    def run_soon(self, label: str, callback: Callable[[], None]) -> None:
        async def markers() -> None:
            await delay_point("txn.before-markers")
            callback()

        self._start(markers())

    def _start(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self) -> None:
        for handle in list(self._timers):
            handle.cancel()
        self._timers.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Coordinators:
    """The transaction and group coordinators driven by one CoordinatorRuntime on the event
    loop: the handlers' entry points (run, write_offsets, pending_markers) and the broker's
    (load, complete_in_doubt, the timeout tick, stop)."""

    def __init__(
        self,
        coordinator: TransactionCoordinator,
        groups: GroupCoordinator,
        *,
        transaction_log: InternalLog,
        offsets_log: InternalLog,
        partitions: Partitions,
        until_durable: UntilDurable,
        on_error: Callable[[BaseException | None], None],
        clock: Clock,
        cleanup_interval_ms: int,
    ) -> None:
        self._transaction_log = transaction_log
        self.transaction_coordinator = coordinator
        # transaction.abort.timed.out.transaction.cleanup.interval.ms
        self._cleanup_interval_ms = cleanup_interval_ms
        self._loop = _EventLoop(until_durable)
        self.runtime = CoordinatorRuntime(
            coordinator,
            groups,
            transaction_log=_Log(transaction_log),
            offsets_log=_Log(offsets_log),
            partitions=_Partitions(partitions, clock),
            durability=self._loop,
            timer=self._loop,
            on_error=on_error,
        )
        # KIP-890: is this partition in the producer's ongoing transaction? (TxnOffsetCommit)
        self.verify_partition = self.runtime.verify_partition

    # -- loading ----------------------------------------------------------------------------

    def load(self) -> None:
        """Replay the transaction log (compacted by the log cleaner while the broker runs)."""
        self.runtime.load_transactions(records_of(self._transaction_log.batches()))

    def complete_in_doubt(self) -> None:
        """Drive transactions found in PrepareCommit/PrepareAbort to completion."""
        self.runtime.complete_in_doubt()

    # -- running coordinator results --------------------------------------------------------

    async def run(self, result: CoordinatorResult[T], *, bounded: bool = True) -> T:
        """CoordinatorRuntime.run, awaited: the response once the records are durable and
        replayed; raises CoordinatorUnavailableError as it fails."""
        if not result.records:
            self.runtime.run(result, _no_wait, _no_wait)
            return result.response
        answer: asyncio.Future[T] = _future()
        self.runtime.run(result, _resolver(answer), _rejecter(answer), bounded=bounded)
        # Shielded: a client that goes away must not cancel anything of the written records.
        return await asyncio.shield(answer)

    def write_offsets(
        self,
        records: list[Record],
        response: Any,
        *,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> asyncio.Future[Any]:
        """CoordinatorRuntime.write_offsets: appended now (raises if not written), the returned
        future gives `response` once the records are durable and replayed."""
        answer: asyncio.Future[Any] = _future()
        self.runtime.write_offsets(
            records,
            lambda: _resolver(answer)(response),
            _rejecter(answer),
            producer_id=producer_id,
            producer_epoch=producer_epoch,
        )
        return answer

    def pending_markers(self, transactional_id: str | None) -> asyncio.Future[None] | None:
        """The id's markers in flight (its decided transaction not yet complete), if any.

        Kafka answers CONCURRENT_TRANSACTIONS to InitProducerId, AddPartitionsToTxn and
        AddOffsetsToTxn while markers are in flight, and clients retry after a backoff
        (librdkafka: 20 ms); on one node the markers take a millisecond or two, so those
        requests wait for them instead, and a producer's next transaction starts at once.
        """
        if not self.runtime.markers_in_flight(transactional_id or ""):
            return None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.runtime.when_markers_done(transactional_id or "", lambda: _resolver(done)(None))
        return done

    # -- timers -----------------------------------------------------------------------------

    def timeout_delay(self) -> float:
        """transaction.abort.timed.out.transaction.cleanup.interval.ms, in seconds."""
        return self._cleanup_interval_ms / 1000

    async def timeout_tick(self) -> None:
        """Abort transactions past their timeout; expire idle transactional ids. The broker
        runs it every timeout_delay() seconds, supervised."""
        self.runtime.expire()

    async def stop(self) -> None:
        self.runtime.stop()
        await self._loop.stop()
        self._transaction_log.close()


def _future() -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    # Retrieved even when nobody awaits it any more (the runtime logged the failure).
    future.add_done_callback(lambda done: done.cancelled() or done.exception())
    return future


def _resolver(future: asyncio.Future[Any]) -> Callable[[Any], None]:
    def resolve(value: Any) -> None:
        if not future.done():
            future.set_result(value)

    return resolve


def _rejecter(future: asyncio.Future[Any]) -> Callable[[BaseException], None]:
    def reject(error: BaseException) -> None:
        if not future.done():
            future.set_exception(error)

    return reject


def _no_wait(_value: object) -> None:
    """A result with no records is answered at once: run() returns its response itself."""
