"""The transaction coordinator at work: its durable log, its markers, its timers.

Each coordinator answer goes the same way (Kafka's coordinator runtime): append the records to
`__transaction_state`, wait until they are durable, replay them into the coordinator, answer;
then, for a decided transaction, write the COMMIT/ABORT markers to every partition in it (and to
the offsets log for its consumer offsets), wait until they are durable, and write Complete*.
After a restart the log is replayed and every transaction found in Prepare* gets its markers
(again): PrepareCommit is the point of no return.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.broker.durability import until_durable
from onceflow.broker.faults import crash_point, delay_point, raise_point
from onceflow.broker.log_limit import RateLimitedLog
from onceflow.broker.storage_failure import halt_on_storage_error
from onceflow.txn.coordinator import (
    OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    CoordinatorResult,
    MarkerJob,
    TransactionCoordinator,
)
from onceflow.txn.errors import TxnError, TxnIndexStorageError

if TYPE_CHECKING:
    from onceflow.broker.partition import Partition
    from onceflow.broker.server import Broker

log = logging.getLogger(__name__)

T = TypeVar("T")
# The longest a client's coordinator request is held (waiting for markers in flight or for the
# transaction log to be durable) before a retriable error answers it. Clients wait far longer
# (librdkafka: socket.timeout.ms, 60 s), so an answer always arrives before they give up.
HELD_REQUEST_TIMEOUT_S = 5.0
MARKER_RETRY_S = 0.5
_marker_errors = RateLimitedLog(log)


class CoordinatorUnavailableError(Exception):
    """The coordinator could not write (or make durable in time) a request's records: the
    client is answered COORDINATOR_NOT_AVAILABLE, retriable, as Kafka maps a failed append
    to its transaction log."""

    error_code = ErrorCode.coordinator_not_available


def _log_completion_failure(future: asyncio.Future[None]) -> None:
    # Seen here even when no client waits for it any more (a bounded wait gave up).
    if not future.cancelled() and future.exception() is not None:
        log.error("transaction records not completed: %r", future.exception())


class Transactions:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        config = broker.config
        self.log = broker.internal_log(
            TRANSACTION_STATE_TOPIC, config.transaction_state_log_segment_bytes
        )
        self.coordinator = TransactionCoordinator(
            broker.clock, transaction_max_timeout_ms=config.transaction_max_timeout_ms
        )
        self._marker_tasks: set[asyncio.Task[None]] = set()
        self._markers_by_id: dict[str, asyncio.Task[None]] = {}
        self._retries: set[MarkerJob] = set()  # marker jobs waiting to be written again
        self._stopping = False

    # -- loading ----------------------------------------------------------------------------

    def load(self) -> None:
        """Replay the transaction log (compacted by the log cleaner while the broker runs)."""
        for batch in self.log.batches():
            for record in batch.records:
                self.coordinator.replay(record.key or b"", record.value)

    def complete_in_doubt(self) -> None:
        """Drive transactions found in PrepareCommit/PrepareAbort to completion."""
        for job in self.coordinator.in_doubt():
            log.info(
                "completing in-doubt transaction %r (%s)",
                job.transactional_id,
                "commit" if job.commit else "abort",
            )
            self._spawn_markers(job)

    # -- running coordinator results --------------------------------------------------------

    async def run(self, result: CoordinatorResult[T], *, bounded: bool = True) -> T:
        """Make the result's records durable, replay them, then start its markers.

        As in Kafka, EndTxn is answered once its PrepareCommit/PrepareAbort is durable (the
        point of no return); the markers and Complete* follow in the background.

        Raises CoordinatorUnavailableError when the records could not be appended (nothing
        was written: the pending transition is dropped, abort_pending) or, `bounded`, when
        they are not durable within HELD_REQUEST_TIMEOUT_S: a client's request is never held
        past what it waits for; the records are written, and replayed once durable.
        """
        if not result.records:
            if result.markers is not None:
                crash_point("txn.after-decision")
                self._spawn_markers(result.markers)
            return result.response
        try:
            self.log.append(result.records)
        except Exception as e:
            halt_on_storage_error(e)  # a write that failed half-way: restart from the disk
            # Surely not written (a closed log, a batch too large): forget the transition,
            # or the id would answer CONCURRENT_TRANSACTIONS forever.
            if result.transactional_id is not None:
                self.coordinator.abort_pending(result.transactional_id)
            log.error("transaction log append failed: %r", e)
            raise CoordinatorUnavailableError(f"transaction log append failed: {e!r}") from e
        # Written: the rest (durable, replay, markers) goes on even if the client stops waiting.
        completion = asyncio.ensure_future(self._complete(result))
        completion.add_done_callback(_log_completion_failure)
        if bounded:
            done, _ = await asyncio.wait([completion], timeout=HELD_REQUEST_TIMEOUT_S)
            if not done:
                raise CoordinatorUnavailableError(
                    "transaction log not durable within the request bound"
                )
        # Shielded: a client that goes away must not cancel the replay of written records.
        await asyncio.shield(completion)
        return result.response

    async def _complete(self, result: CoordinatorResult[Any]) -> None:
        await self._replay_when_durable(result.records)
        if result.markers is not None:
            crash_point("txn.after-decision")
            self._spawn_markers(result.markers)

    async def _replay_when_durable(self, records: list[tuple[bytes, bytes | None]]) -> None:
        # A failed fsync halts the broker; the restart replays what reached the disk. The
        # records are in the log now: the state must follow them, so a round that could not
        # prepare the log (EMFILE) is retried (until_durable), never given up.
        closed = await until_durable(self.broker.committer, [self.log.log])
        if closed:
            raise CoordinatorUnavailableError("the transaction log was closed")
        for key, value in records:
            self.coordinator.replay(key, value)

    def pending_markers(self, transactional_id: str | None) -> asyncio.Task[None] | None:
        """The id's markers in flight (its decided transaction not yet complete), if any.

        Kafka answers CONCURRENT_TRANSACTIONS to InitProducerId, AddPartitionsToTxn and
        AddOffsetsToTxn while markers are in flight, and clients retry after a backoff
        (librdkafka: 20 ms); on one node the markers take a millisecond or two, so those
        requests wait for them instead, and a producer's next transaction starts at once.
        """
        return self._markers_by_id.get(transactional_id or "")

    def _spawn_markers(self, job: MarkerJob) -> None:
        task = asyncio.get_running_loop().create_task(self._write_markers(job))
        self._marker_tasks.add(task)
        self._markers_by_id[job.transactional_id] = task
        task.add_done_callback(lambda done: self._marker_done(job, done))

    def _marker_done(self, job: MarkerJob, task: asyncio.Task[None]) -> None:
        self._marker_tasks.discard(task)
        if self._markers_by_id.get(job.transactional_id) is task:
            del self._markers_by_id[job.transactional_id]
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        halt_on_storage_error(error)
        # Else the transaction would hang in Prepare* (and pin the last stable offset): write
        # its markers again after a pause, as Kafka's marker channel retries.
        meta = self.coordinator.get(job.transactional_id)
        if self._stopping or meta is None or not meta.state.is_prepare:
            log.error("writing transaction markers failed: %r", error)
            return
        _marker_errors.error(
            f"markers:{job.transactional_id}",
            "writing transaction markers of %r failed, retrying: %r",
            job.transactional_id,
            error,
            exc_info=error,
        )
        self._retries.add(job)
        asyncio.get_running_loop().call_later(MARKER_RETRY_S, self._retry_markers, job)

    def _retry_markers(self, job: MarkerJob) -> None:
        self._retries.discard(job)
        if not self._stopping:
            self._spawn_markers(job)

    async def _write_markers(self, job: MarkerJob) -> None:
        await delay_point("txn.before-markers")
        raise_point("txn.markers")
        partitions: list[Partition] = []
        offsets = False
        for topic, index in job.partitions:
            if topic == OFFSETS_TOPIC:
                self.broker.offsets_log.append_marker(
                    job.producer_id, job.producer_epoch, job.commit, job.coordinator_epoch
                )
                offsets = True
                continue
            partition = self.broker.topics.partition(topic, index)
            if partition is None:
                continue  # the topic was deleted since: nothing left to mark
            try:
                partition.append_marker(
                    job.producer_id,
                    job.producer_epoch,
                    job.commit,
                    job.coordinator_epoch,
                    self.broker.clock(),
                )
            except TxnIndexStorageError:
                raise  # the marker is in the log, its aborted-index entry is not: not a fence
            except TxnError as e:
                # A newer epoch already wrote to this partition: that producer fenced this one,
                # and Kafka skips the marker too.
                log.warning("marker for %s-%d skipped: %s", topic, index, e)
                continue
            partitions.append(partition)
            crash_point("txn.after-marker")
        logs = [p.log for p in partitions]
        if offsets:
            logs.append(self.broker.offsets_log.log)
        # Complete* may only follow durable markers: retry a round that could not prepare a log
        # (EMFILE); a partition deleted since needs no marker.
        await until_durable(self.broker.committer, logs)
        for partition in partitions:
            partition.notify()
        if offsets:
            self.broker.groups.complete_transaction(job.producer_id, job.commit)
        crash_point("txn.before-complete")
        await self.run(
            self.coordinator.markers_written(job.transactional_id, job.producer_epoch),
            bounded=False,
        )

    # -- the produce path -------------------------------------------------------------------

    def verify_partition(
        self,
        transactional_id: str | None,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        index: int,
    ) -> bool:
        """KIP-890: is this partition in the producer's ongoing transaction?"""
        if not transactional_id:
            return False
        error = self.coordinator.is_in_transaction(
            transactional_id, producer_id, producer_epoch, topic, index
        )
        return error == ErrorCode.none

    # -- timers -----------------------------------------------------------------------------

    def timeout_delay(self) -> float:
        """transaction.abort.timed.out.transaction.cleanup.interval.ms, in seconds."""
        config = self.broker.config
        return config.transaction_abort_timed_out_transaction_cleanup_interval_ms / 1000

    async def timeout_tick(self) -> None:
        """Abort transactions past their timeout; expire idle transactional ids. The broker
        runs it every timeout_delay() seconds, supervised (server.Broker._every)."""
        for result in self.coordinator.expire_timed_out():
            log.info("aborting transaction %r: it outlived its timeout", result.transactional_id)
            await self._run_logged(result)
        for result in self.coordinator.expire_transactional_ids():
            await self._run_logged(result)

    async def _run_logged(self, result: CoordinatorResult[Any]) -> None:
        # One result failing must not skip the others: each holds a pending transition.
        try:
            await self.run(result, bounded=False)
        except Exception as e:
            halt_on_storage_error(e)
            log.error("transaction log write failed: %r", e)

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._marker_tasks):
            task.cancel()
        await asyncio.gather(*self._marker_tasks, return_exceptions=True)
        self.log.close()
