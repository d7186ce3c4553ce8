"""The coordinator runtime: the one driver of both coordinators, as Kafka's CoordinatorRuntime.

A coordinator (the sans-IO shards `TransactionCoordinator` and `GroupCoordinator`) answers a
request with a `CoordinatorResult`: records plus a response. This module does the rest, the same
way for every caller: append the records to the coordinator's log, wait until they are durable,
replay them (the state changes only there), answer; for a decided transaction, write the
COMMIT/ABORT markers to every partition in it (and to the offsets log), wait until they are
durable, settle the transactional offsets, then write Complete* the same way. Markers that fail
are written again after MARKER_RETRY_S while the transaction is still Prepare*; a request is
held at most HELD_REQUEST_TIMEOUT_S. Loading after a restart replays the same records.

It is written against small interfaces, in continuation style so that both worlds can run it:
the asyncio broker (coordinator/coordinators.py) and the deterministic simulation
(simulation/broker.py, a single-threaded event scheduler) each implement `CoordinatorLog`,
`Durability`, `MarkerWriter` and `Timer`; the coordinator tests use in-memory ones.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.coordinator.result import CoordinatorResult, MarkerJob, Record
from onceflow.fault_points import crash_point, raise_point
from onceflow.groups.coordinator import GroupCoordinator
from onceflow.log.producer_errors import TxnError, TxnIndexStorageError
from onceflow.rate_limited_log import RateLimitedLog
from onceflow.records.control import ControlType, parse_control_record
from onceflow.records.record import DecodedBatch
from onceflow.txn.coordinator import OFFSETS_TOPIC, TransactionCoordinator

log = logging.getLogger(__name__)
_marker_errors = RateLimitedLog(log)

T = TypeVar("T")
# Where a log is: what `Durability` waits for (the broker: the log itself; the simulation: a
# log and an offset; the tests: an index).
Position = Hashable

# The longest a client's coordinator request is held (waiting for markers in flight or for the
# transaction log to be durable) before a retriable error answers it. Clients wait far longer
# (librdkafka: socket.timeout.ms, 60 s), so an answer always arrives before they give up.
HELD_REQUEST_TIMEOUT_S = 5.0
MARKER_RETRY_S = 0.5


class CoordinatorUnavailableError(Exception):
    """The coordinator could not write (or make durable in time) a request's records: the
    client is answered COORDINATOR_NOT_AVAILABLE, retriable, as Kafka maps a failed append
    to its transaction log."""

    error_code = ErrorCode.coordinator_not_available


# -- the interfaces ------------------------------------------------------------------------


@dataclass(frozen=True)
class Durable:
    """How a wait for durability ended: `closed` if a log was closed (deleted) before it was
    durable, `error` if the wait failed (a failed fsync: the broker halts)."""

    closed: bool = False
    error: BaseException | None = None


@dataclass(frozen=True)
class BatchProducer:
    """Whose batch a coordinator appends: nobody's (-1), or a transactional producer's
    (TxnOffsetCommit: the offsets stay pending until that transaction's marker)."""

    producer_id: int = -1
    producer_epoch: int = -1

    @property
    def transactional(self) -> bool:
        return self.producer_id >= 0


NO_PRODUCER = BatchProducer()


class CoordinatorLog(Protocol):
    """A coordinator's own log (`__transaction_state`, `__consumer_offsets`)."""

    def append(self, records: Sequence[Record], producer: BatchProducer) -> Position:
        """Append the records as one batch; raises if they were not written."""
        ...

    def append_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> Position:
        """Append a COMMIT/ABORT marker the coordinator decided (no producer-state checks)."""
        ...


class MarkerWriter(Protocol):
    """The partitions of the topics, as the markers reach them."""

    def append_marker(self, topic: str, index: int, job: MarkerJob) -> Position | None:
        """Append the job's marker to a partition; None if the partition is gone. Raises
        TxnError (nothing written) when the partition refuses it (a newer epoch wrote there)."""
        ...


class Durability(Protocol):
    def when_durable(self, positions: Sequence[Position], then: Callable[[Durable], None]) -> None:
        """Call `then` once every position is durable (it may be called at once)."""
        ...


class Timer(Protocol):
    def schedule(
        self, delay_s: float, label: str, callback: Callable[[], None]
    ) -> Callable[[], None]:
        """Call `callback` after `delay_s` seconds; returns what cancels it."""
        ...

    def run_soon(self, label: str, callback: Callable[[], None]) -> None:
        """Run `callback` as a task of its own, soon (marker jobs)."""
        ...


def replay_offsets_batch(groups: GroupCoordinator, batch: DecodedBatch) -> None:
    """One batch of `__consumer_offsets` read back: a marker settles its producer's pending
    offsets, records replay (transactional ones pending until their marker)."""
    header = batch.header
    if header.is_control:
        if batch.records:  # (an emptied control batch, kept by the cleaner, settles nothing)
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


def records_of(batches: Iterable[DecodedBatch]) -> Iterator[Record]:
    """The (key, value) records of a coordinator log's batches, in log order."""
    for batch in batches:
        for record in batch.records:
            yield record.key or b"", record.value


# -- the runtime ---------------------------------------------------------------------------


@dataclass(eq=False)
class _Reply(Generic[T]):
    """The one answer of a request: the first of respond/fail wins, later ones are dropped
    (a failure is logged where it happens)."""

    respond: Callable[[T], None]
    fail: Callable[[Exception], None]
    done: bool = False
    cancel_timer: Callable[[], None] | None = None

    def answer(self, response: T) -> None:
        if self._finish():
            self.respond(response)

    def refuse(self, error: Exception) -> None:
        if self._finish():
            self.fail(error)

    def _finish(self) -> bool:
        if self.done:
            return False
        self.done = True
        if self.cancel_timer is not None:
            self.cancel_timer()
        return True


@dataclass(eq=False)
class _MarkerRun:
    """One attempt at a job's markers; `waiters` are called when it ends, written or not."""

    job: MarkerJob
    waiters: list[Callable[[], None]] = field(default_factory=list)


def _raise(error: BaseException) -> None:
    raise error


@dataclass(eq=False)
class CoordinatorRuntime:
    """Drives the two coordinators (the shards) over the interfaces given."""

    coordinator: TransactionCoordinator
    groups: GroupCoordinator
    transaction_log: CoordinatorLog
    offsets_log: CoordinatorLog
    partitions: MarkerWriter
    durability: Durability
    timer: Timer
    # Sees every exception of a write before it is answered or retried: the broker halts on
    # a storage failure there, the simulation raises it.
    on_error: Callable[[BaseException], None] = _raise
    _marker_runs: dict[str, _MarkerRun] = field(default_factory=dict)
    _stopping: bool = False

    # -- loading ------------------------------------------------------------------------------

    def load_transactions(self, records: Iterable[Record]) -> None:
        """Replay the transaction log (compacted by the log cleaner while the broker runs)."""
        for key, value in records:
            self.coordinator.replay(key, value)

    def load_offsets(self, batches: Iterable[DecodedBatch]) -> None:
        """Replay the offsets log, markers included."""
        for batch in batches:
            replay_offsets_batch(self.groups, batch)

    def complete_in_doubt(self) -> None:
        """Drive transactions found in PrepareCommit/PrepareAbort to completion."""
        for job in self.coordinator.in_doubt():
            log.info(
                "completing in-doubt transaction %r (%s)",
                job.transactional_id,
                "commit" if job.commit else "abort",
            )
            self._spawn_markers(job)

    # -- transaction coordinator results -------------------------------------------------------

    def run(
        self,
        result: CoordinatorResult[T],
        respond: Callable[[T], None],
        fail: Callable[[Exception], None],
        *,
        bounded: bool = True,
    ) -> None:
        """Make the result's records durable, replay them, answer, then start its markers.

        As in Kafka, EndTxn is answered once its PrepareCommit/PrepareAbort is durable (the
        point of no return); the markers and Complete* follow in the background.

        `fail` gets CoordinatorUnavailableError when the records could not be appended (nothing
        was written: the pending transition is dropped, abort_pending) or, `bounded`, when
        they are not durable within HELD_REQUEST_TIMEOUT_S: a client's request is never held
        past what it waits for; the records are written, and replayed once durable.
        """
        reply = _Reply(respond, fail)
        if not result.records:
            if result.markers is not None:
                crash_point("txn.after-decision")
                self._spawn_markers(result.markers)
            reply.answer(result.response)
            return
        try:
            position = self.transaction_log.append(result.records, NO_PRODUCER)
        except Exception as e:
            self.on_error(e)  # a write that failed half-way: the broker restarts from the disk
            # Surely not written (a closed log, a batch too large): forget the transition,
            # or the id would answer CONCURRENT_TRANSACTIONS forever.
            if result.transactional_id is not None:
                self.coordinator.abort_pending(result.transactional_id)
            log.error("transaction log append failed: %r", e)
            error = CoordinatorUnavailableError(f"transaction log append failed: {e!r}")
            error.__cause__ = e
            reply.refuse(error)
            return
        # Written: the rest (durable, replay, markers) goes on even if the client stops waiting.
        if bounded:
            reply.cancel_timer = self.timer.schedule(
                HELD_REQUEST_TIMEOUT_S,
                "held request",
                lambda: reply.refuse(
                    CoordinatorUnavailableError(
                        "transaction log not durable within the request bound"
                    )
                ),
            )
        self.durability.when_durable(
            [position], lambda outcome: self._records_durable(result, reply, outcome)
        )

    def _records_durable(
        self, result: CoordinatorResult[T], reply: _Reply[T], outcome: Durable
    ) -> None:
        # A failed fsync halts the broker; the restart replays what reached the disk. The
        # records are in the log now: the state must follow them, so a round that could not
        # prepare the log (EMFILE) is retried by the Durability, never given up.
        error = outcome.error
        if error is None and outcome.closed:
            error = CoordinatorUnavailableError("the transaction log was closed")
        if error is None:
            try:
                for key, value in result.records:
                    self.coordinator.replay(key, value)
            except Exception as e:
                error = e
        if error is not None:
            # Seen here even when no client waits for it any more (the bound passed).
            log.error("transaction records not completed: %r", error)
            reply.refuse(error if isinstance(error, Exception) else RuntimeError(repr(error)))
            return
        if result.markers is not None:
            crash_point("txn.after-decision")
            self._spawn_markers(result.markers)
        reply.answer(result.response)

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

    def expire(self) -> list[CoordinatorResult[ErrorCode]]:
        """Abort transactions past their timeout; expire idle transactional ids (Kafka's
        abortTimedOutTransactions and removeExpiredTransactionalIds). Returns what it ran."""
        timed_out = self.coordinator.expire_timed_out()
        for result in timed_out:
            log.info("aborting transaction %r: it outlived its timeout", result.transactional_id)
            self.run(result, _ignore, _log_write_failure, bounded=False)
        expired = self.coordinator.expire_transactional_ids()
        for result in expired:
            self.run(result, _ignore, _log_write_failure, bounded=False)
        return [*timed_out, *expired]

    # -- group coordinator results -------------------------------------------------------------

    def write_offsets(
        self,
        records: Sequence[Record],
        respond: Callable[[], None],
        fail: Callable[[BaseException], None],
        *,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> None:
        """Append a group coordinator's records, then (once durable) replay them and answer.

        With a producer id (TxnOffsetCommit) they are a transactional batch of that producer,
        pending until its transaction's marker, as `load_offsets` replays them after a restart.
        An append that fails raises here (nothing was written).
        """
        producer = BatchProducer(producer_id, producer_epoch)
        position = self.offsets_log.append(records, producer)

        def durable(outcome: Durable) -> None:
            # Written: the state must follow the log, never answered as if nothing was written.
            if outcome.error is not None:
                fail(outcome.error)
                return
            for key, value in records:
                self.groups.replay(key, value, producer_id, producer_epoch, producer.transactional)
            respond()

        self.durability.when_durable([position], durable)

    # -- markers -------------------------------------------------------------------------------

    def marker_jobs(self) -> list[MarkerJob]:
        """The marker jobs in flight, oldest first."""
        return [run.job for run in self._marker_runs.values()]

    def markers_in_flight(self, transactional_id: str) -> bool:
        """Whether the id's decided transaction has its markers being written now."""
        return transactional_id in self._marker_runs

    def when_markers_done(self, transactional_id: str, callback: Callable[[], None]) -> None:
        """Call `callback` when the id's markers in flight are written (or failed); at once if
        none are."""
        run = self._marker_runs.get(transactional_id)
        if run is None:
            callback()
        else:
            run.waiters.append(callback)

    def _spawn_markers(self, job: MarkerJob) -> None:
        run = _MarkerRun(job)
        self._marker_runs[job.transactional_id] = run
        label = f"markers {job.transactional_id} {'commit' if job.commit else 'abort'}"
        self.timer.run_soon(label, lambda: self._write_markers(run))

    def _write_markers(self, run: _MarkerRun) -> None:
        job = run.job
        positions: list[Position] = []
        offsets = False
        try:
            raise_point("txn.markers")
            for topic, index in job.partitions:
                if topic == OFFSETS_TOPIC:
                    positions.append(
                        self.offsets_log.append_marker(
                            job.producer_id, job.producer_epoch, job.commit, job.coordinator_epoch
                        )
                    )
                    offsets = True
                    continue
                try:
                    position = self.partitions.append_marker(topic, index, job)
                except TxnIndexStorageError:
                    raise  # the marker is in the log, its aborted-index entry is not: no fence
                except TxnError as e:
                    # A newer epoch already wrote to this partition: that producer fenced this
                    # one, and Kafka skips the marker too.
                    log.warning("marker for %s-%d skipped: %s", topic, index, e)
                    continue
                if position is None:
                    continue  # the topic was deleted since: nothing left to mark
                positions.append(position)
                crash_point("txn.after-marker")
        except Exception as e:
            self._markers_done(run, e)
            return
        # Complete* may only follow durable markers (a partition deleted since needs none).
        self.durability.when_durable(
            positions, lambda outcome: self._markers_durable(run, offsets, outcome)
        )

    def _markers_durable(self, run: _MarkerRun, offsets: bool, outcome: Durable) -> None:
        if outcome.error is not None:
            self._markers_done(run, outcome.error)
            return
        job = run.job
        try:
            # (each partition woke its readers itself when its high watermark moved)
            if offsets:
                self.groups.complete_transaction(job.producer_id, job.commit)
            crash_point("txn.before-complete")
            result = self.coordinator.markers_written(job.transactional_id, job.producer_epoch)
        except Exception as e:
            self._markers_done(run, e)
            return
        self.run(
            result,
            lambda _: self._markers_done(run, None),
            lambda error: self._markers_done(run, error),
            bounded=False,
        )

    def _markers_done(self, run: _MarkerRun, error: BaseException | None) -> None:
        job = run.job
        if self._marker_runs.get(job.transactional_id) is run:
            del self._marker_runs[job.transactional_id]
        for waiter in run.waiters:
            waiter()
        if error is None:
            return
        self.on_error(error)
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
        self.timer.schedule(MARKER_RETRY_S, "marker retry", lambda: self._retry_markers(job))

    def _retry_markers(self, job: MarkerJob) -> None:
        if not self._stopping:
            self._spawn_markers(job)

    def stop(self) -> None:
        """No marker job is started or retried any more (the broker is stopping)."""
        self._stopping = True


def _ignore(_response: object) -> None:
    """A result nobody waits for (timeouts, expirations, Complete*)."""


def _log_write_failure(error: Exception) -> None:
    log.error("transaction log write failed: %r", error)
