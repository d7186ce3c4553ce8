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

from onceflow.broker.coordinator_log import CoordinatorLog
from onceflow.broker.faults import crash_point, delay_point
from onceflow.broker.storage_failure import halt_on_storage_error
from onceflow.log.errors import DescriptorsExhaustedError
from onceflow.records.control import build_marker
from onceflow.txn.coordinator import CoordinatorResult, MarkerJob, TransactionCoordinator
from onceflow.txn.errors import TxnError, TxnIndexStorageError

if TYPE_CHECKING:
    from onceflow.broker.partition import Partition
    from onceflow.broker.server import Broker

log = logging.getLogger(__name__)
MARKER_RETRY_BACKOFF_S = 0.5  # after running out of file descriptors

T = TypeVar("T")
OFFSETS_TOPIC = "__consumer_offsets"


class Transactions:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        config = broker.config
        self.log = CoordinatorLog(
            config.data_dir / "__transaction_state-0", broker.committer, broker.clock
        )
        self.coordinator = TransactionCoordinator(
            broker.clock, transaction_max_timeout_ms=config.transaction_max_timeout_ms
        )
        self._marker_tasks: set[asyncio.Task[None]] = set()
        self._markers_by_id: dict[str, asyncio.Task[None]] = {}

    # -- loading ----------------------------------------------------------------------------

    def load(self) -> None:
        """Replay the transaction log; rewrite it when it holds far more than its state."""
        replayed = 0
        for batch in self.log.batches():
            for record in batch.records:
                self.coordinator.replay(record.key or b"", record.value)
                replayed += 1
        self.log.rewrite_if_large(replayed, lambda: [(self.coordinator.state_records(), None)])

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

    async def run(self, result: CoordinatorResult[T]) -> T:
        """Make the result's records durable, replay them, then start its markers.

        As in Kafka, EndTxn is answered once its PrepareCommit/PrepareAbort is durable (the
        point of no return); the markers and Complete* follow in the background.
        """
        if result.records:
            self.log.append(result.records)
            # A failed fsync halts the broker; the restart replays what reached the disk.
            await self.log.durable()
            for key, value in result.records:
                self.coordinator.replay(key, value)
        if result.markers is not None:
            crash_point("txn.after-decision")
            self._spawn_markers(result.markers)
        return result.response

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
        transactional_id = job.transactional_id
        self._marker_tasks.discard(task)
        if self._markers_by_id.get(transactional_id) is task:
            del self._markers_by_id[transactional_id]
        if not task.cancelled() and isinstance(task.exception(), DescriptorsExhaustedError):
            # Nothing failed on disk; write the markers again once descriptors are free, as
            # loading does for an in-doubt transaction (a marker written twice is harmless).
            log.warning("transaction markers postponed: %s", task.exception())
            asyncio.get_running_loop().call_later(MARKER_RETRY_BACKOFF_S, self._spawn_markers, job)
            return
        if not task.cancelled() and task.exception() is not None:
            halt_on_storage_error(task.exception())  # else the transaction hangs in Prepare*
            log.error("writing transaction markers failed: %r", task.exception())

    async def _write_markers(self, job: MarkerJob) -> None:
        await delay_point("txn.before-markers")
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
            data = build_marker(
                job.producer_id,
                job.producer_epoch,
                job.commit,
                job.coordinator_epoch,
                self.broker.clock(),
            )
            try:
                partition.append_marker(
                    data, job.producer_id, job.producer_epoch, job.commit, job.coordinator_epoch
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
        await self.broker.committer.wait_durable(logs)
        for partition in partitions:
            partition.notify()
        if offsets:
            self.broker.groups.complete_transaction(job.producer_id, job.commit)
        crash_point("txn.before-complete")
        await self.run(self.coordinator.markers_written(job.transactional_id, job.producer_epoch))

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

    async def timeout_loop(self) -> None:
        interval = self.broker.config.transaction_abort_timed_out_transaction_cleanup_interval_ms
        while True:
            await asyncio.sleep(interval / 1000)
            for result in self.coordinator.expire_timed_out():
                log.info(
                    "aborting transaction %r: it outlived its timeout", result.transactional_id
                )
                await self._run_logged(result)
            for result in self.coordinator.expire_transactional_ids():
                await self._run_logged(result)

    async def _run_logged(self, result: CoordinatorResult[Any]) -> None:
        try:
            await self.run(result)
        except OSError as e:
            halt_on_storage_error(e)
            log.error("transaction log write failed: %s", e)

    async def stop(self) -> None:
        for task in list(self._marker_tasks):
            task.cancel()
        await asyncio.gather(*self._marker_tasks, return_exceptions=True)
        self.log.close()
