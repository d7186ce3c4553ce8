"""Group commit: concurrent acks=all writers share fsyncs.

A writer appends, then awaits `wait_durable(logs)`. Each log has at most one flush in flight;
while it runs, the log's new writers gather for its next one, so N producers of a partition
cost one fsync per flush, not N. Logs do not wait for each other: each log's flush starts as
soon as the log is free and answers its writers as soon as it is done. (librdkafka sends a
partition's batch as soon as it is ready, so most Produce requests carry one or two
partitions; with one global round at a time, each waited for the round before it, and for
the slowest file of its own.)

A failed fsync halts the broker, as Kafka halts when its last log directory fails: after a
failed fsync the kernel may have dropped the dirty pages and a later fsync succeeds (the
error is reported once), so carrying on could acknowledge, and move the high watermark over,
data that is not on disk. The restart rebuilds from what is.

A log that cannot even be *prepared* for a flush (deleted by DeleteTopics since its append,
or out of descriptors: EMFILE) synced nothing and lost nothing: only the waiters on that log
fail (NotDurableError), its data stays dirty for the next flush, and every other log's
writers are answered as usual. A flush never dies: a waiter is always answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from kio.schema.errors import ErrorCode

from onceflow.fault_points import delay_point, raise_point
from onceflow.halt import halt
from onceflow.log.errors import DescriptorsExhaustedError, LogClosedError
from onceflow.log.partition_log import PartitionLog
from onceflow.rate_limited_log import RateLimitedLog

log = logging.getLogger(__name__)
_prepare_failures = RateLimitedLog(log)


class NotDurableError(Exception):
    """Some of a waiter's logs were not made durable by their flush (the others were).

    `failures` maps each such log to why: LogClosedError (the log was closed or deleted), or
    the OSError of preparing its flush (EMFILE...). Nothing of theirs was synced; the data
    stays dirty and the next flush covers it again.
    """

    def __init__(self, failures: Mapping[PartitionLog, BaseException]) -> None:
        super().__init__(
            "; ".join(f"{log.directory.name}: {error!r}" for log, error in failures.items())
        )
        self.failures = dict(failures)


class PartitionsNotDurableError(Exception):
    """A produce's partitions that were not made durable, with the error code each answers
    (the broker's make_durable raises it; the other partitions of the request are durable)."""

    def __init__(self, errors: Mapping[tuple[str, int], ErrorCode]) -> None:
        super().__init__(
            "not durable: "
            + ", ".join(f"{topic}-{index} ({code.name})" for (topic, index), code in errors.items())
        )
        self.errors = dict(errors)


class _Waiter:
    """One wait_durable call: the logs it still waits for, and why some failed."""

    __slots__ = ("failures", "future", "remaining")

    def __init__(self, future: asyncio.Future[None], logs: frozenset[PartitionLog]) -> None:
        self.future = future
        self.remaining = set(logs)
        self.failures: dict[PartitionLog, BaseException] = {}

    def served(self, log: PartitionLog, error: BaseException | None) -> None:
        """A flush of `log` begun after this wait has ended (with `error` if it failed);
        answer once none is left. A NotDurableError is gathered with the other logs' (their
        writes may be durable); any other error (a failed fsync, a bug) answers at once."""
        self.remaining.discard(log)
        if self.future.done():
            return
        if isinstance(error, NotDurableError):
            self.failures.update(error.failures)
        elif error is not None:
            self.future.set_exception(error)
            return
        if self.remaining:
            return
        if self.failures:
            self.future.set_exception(NotDurableError(self.failures))
        else:
            self.future.set_result(None)


class GroupCommitter:
    def __init__(
        self,
        enabled: bool = True,
        threads: int = 4,
        on_failure: Callable[[OSError], None] = halt,
    ) -> None:
        self.enabled = enabled
        self.on_failure = on_failure
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fsync")
        # Writers waiting for the next flush of each log (not one already running).
        self._waiting: dict[PartitionLog, list[_Waiter]] = {}
        self._flushing: dict[PartitionLog, asyncio.Task[None]] = {}  # one flush in flight each
        self._start_scheduled = False
        self.flushes = 0
        # Told of each log's flush (log, flushed offset before, writers, seconds): the metrics.
        self.on_flush: Callable[[PartitionLog, int, int, float], None] = _no_observer

    async def wait_durable(self, logs: Iterable[PartitionLog]) -> None:
        """Return once every log's appends so far are durable; raises NotDurableError for the
        logs that could not be (the others are durable), OSError after a failed fsync."""
        logs = frozenset(logs)
        if not self.enabled:
            # No fsync: what the OS has is taken as durable, so the high watermark follows.
            failures: dict[PartitionLog, BaseException] = {}
            for one in logs:
                try:
                    ticket = one.prepare_flush()
                    if ticket is not None:
                        one.complete_flush(ticket)
                except Exception as e:  # a log that cannot be flushed fails its own waiters
                    failures[one] = e
            if failures:
                raise NotDurableError(failures)
            return
        if not logs:
            return
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), logs)
        for one in logs:
            self._waiting.setdefault(one, []).append(waiter)
        self._schedule_start(loop)
        await waiter.future

    def _schedule_start(self, loop: asyncio.AbstractEventLoop) -> None:
        # On the next turn of the loop, so that the writers of this turn share the flush.
        if not self._start_scheduled:
            self._start_scheduled = True
            loop.call_soon(self._start_flushes)

    def _start_flushes(self) -> None:
        self._start_scheduled = False
        loop = asyncio.get_running_loop()
        # A log still flushing keeps its waiters: it starts their flush when it is done.
        for one in [one for one in self._waiting if one not in self._flushing]:
            task = loop.create_task(self._flush(one, self._waiting.pop(one)))
            self._flushing[one] = task
            task.add_done_callback(partial(self._flushed, one))

    async def _flush(self, one: PartitionLog, waiters: list[_Waiter]) -> None:
        started, flushed_from = time.perf_counter(), one.flushed_offset
        try:
            error = await self._sync(one)
        except asyncio.CancelledError:
            for waiter in waiters:
                waiter.future.cancel()
            raise
        except OSError as e:
            self.on_failure(e)  # a failed fsync: the broker halts (see the docstring)
            error = e
        except Exception as e:
            # A bug must not leave the log's writers unanswered forever.
            log.exception("group commit of %s failed", one.directory.name)
            error = e
        else:
            self.flushes += 1
            self.on_flush(one, flushed_from, len(waiters), time.perf_counter() - started)
            if error is not None:
                # Not prepared or not synced (deleted, EMFILE): only this log's writers fail.
                error = NotDurableError({one: error})
        for waiter in waiters:
            waiter.served(one, error)

    def _flushed(self, one: PartitionLog, task: asyncio.Task[None]) -> None:
        del self._flushing[one]
        if task.cancelled():
            # The loop is closing: nobody may wait on a flush that will not come.
            for waiters in self._waiting.values():
                for waiter in waiters:
                    waiter.future.cancel()
        elif one in self._waiting:
            self._schedule_start(asyncio.get_running_loop())

    async def _sync(self, one: PartitionLog) -> BaseException | None:
        """fsync what `one` has appended; returns why it could not be prepared or synced
        (nothing of it was: the data stays dirty for the next flush), None once durable.
        Raises OSError when an fsync failed."""
        await delay_point("commit.before-round")
        try:
            raise_point("commit.prepare")
            ticket = one.prepare_flush()
        except Exception as e:
            # Deleted since its append (LogClosedError), or no descriptor to dup (EMFILE).
            _prepare_failures.warning(
                one.directory.name, "cannot prepare a flush of %s: %r", one.directory.name, e
            )
            return e
        if ticket is None:
            return None
        try:
            # The ticket releases its descriptors itself when it has run, failed or not.
            await asyncio.get_running_loop().run_in_executor(self._pool, ticket.run)
        except DescriptorsExhaustedError as e:
            # A file could not be reopened to sync it: no fsync failed, nothing is lost.
            _prepare_failures.warning(
                one.directory.name, "cannot flush %s: %r", one.directory.name, e
            )
            return e
        one.complete_flush(ticket)
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _no_observer(log: PartitionLog, flushed_from: int, writers: int, seconds: float) -> None:
    pass


RETRY_BACKOFF_S = (0.01, 0.05, 0.2, 1.0)  # then 1 s between tries


async def until_durable(
    committer: GroupCommitter, logs: Iterable[PartitionLog]
) -> dict[PartitionLog, LogClosedError]:
    """Wait until every log is durable, retrying the flushes that could not prepare it (EMFILE):
    for records whose effect must follow them once written (coordinator records, markers),
    where answering "not durable" would leave the state behind the log. Logs closed meanwhile
    (a deleted topic) are given up and returned."""
    remaining = frozenset(logs)
    closed: dict[PartitionLog, LogClosedError] = {}
    attempt = 0
    while remaining:
        try:
            await committer.wait_durable(remaining)
            return closed
        except NotDurableError as e:
            closed.update(
                (one, error)
                for one, error in e.failures.items()
                if isinstance(error, LogClosedError)
            )
            remaining = frozenset(e.failures) - closed.keys()
        if remaining:
            await asyncio.sleep(RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)])
            attempt += 1
    return closed
