"""Group commit: concurrent acks=all writers share one round of fsyncs.

A writer appends, then awaits `wait_durable(logs)`. While a round of fsyncs runs in worker
threads, new writers gather for the next round, so N producers cost one fsync per round, not N.

A failed fsync halts the broker, as Kafka halts when its last log directory fails: after a
failed fsync the kernel may have dropped the dirty pages and a later fsync succeeds (the
error is reported once), so carrying on could acknowledge, and move the high watermark over,
data that is not on disk. The restart rebuilds from what is.

A log that cannot even be *prepared* for a round (deleted by DeleteTopics since its append,
or out of descriptors: EMFILE) synced nothing and lost nothing: only the waiters on that log
fail (NotDurableError), its data stays dirty for the next round, and every other log of the
round completes. The round itself never dies: a waiter is always answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from kio.schema.errors import ErrorCode

from onceflow.broker.faults import delay_point, raise_point
from onceflow.broker.log_limit import RateLimitedLog
from onceflow.broker.storage_failure import halt
from onceflow.log.errors import DescriptorsExhaustedError, LogClosedError
from onceflow.log.partition_log import PartitionLog

log = logging.getLogger(__name__)
_prepare_failures = RateLimitedLog(log)


class NotDurableError(Exception):
    """Some of a waiter's logs were not made durable by its round (the others were).

    `failures` maps each such log to why: LogClosedError (the log was closed or deleted), or
    the OSError of preparing its flush (EMFILE...). Nothing of theirs was synced; the data
    stays dirty and the next round covers it again.
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


_Waiter = tuple[asyncio.Future[None], frozenset[PartitionLog]]


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
        self._pending: set[PartitionLog] = set()
        self._waiters: list[_Waiter] = []
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0

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
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._pending.update(logs)
        self._waiters.append((waiter, logs))
        if self._task is None:
            self._task = loop.create_task(self._run())
        await waiter

    async def _run(self) -> None:
        waiters: list[_Waiter] = []
        try:
            while self._waiters:
                logs, waiters = self._pending, self._waiters
                self._pending, self._waiters = set(), []
                try:
                    failed = await self._round(logs)
                except OSError as e:
                    self.on_failure(e)  # a failed fsync: the broker halts (see the docstring)
                    _fail(waiters, e)
                    continue
                except Exception as e:
                    # A bug in a round must not leave its writers unanswered forever.
                    log.exception("group commit round failed")
                    _fail(waiters, e)
                    continue
                self.rounds += 1
                for waiter, mine in waiters:
                    if waiter.done():
                        continue
                    failures = {one: failed[one] for one in mine if one in failed}
                    if failures:
                        waiter.set_exception(NotDurableError(failures))
                    else:
                        waiter.set_result(None)
        finally:
            self._task = None
            # Cancelled (the loop is closing): nobody may wait on a round that will not come.
            for waiter, _ in waiters + self._waiters:
                if not waiter.done():
                    waiter.cancel()

    async def _round(self, logs: Iterable[PartitionLog]) -> dict[PartitionLog, BaseException]:
        """One round of fsyncs; returns the logs that could not be prepared or completed."""
        loop = asyncio.get_running_loop()
        failed: dict[PartitionLog, BaseException] = {}
        tickets = []
        await delay_point("commit.before-round")
        for one in logs:
            try:
                raise_point("commit.prepare")
                ticket = one.prepare_flush()
            except Exception as e:
                # Deleted since its append (LogClosedError), or no descriptor to dup (EMFILE):
                # nothing was synced, the data stays dirty for the next round.
                _prepare_failures.warning(
                    one.directory.name, "cannot prepare a flush of %s: %r", one.directory.name, e
                )
                failed[one] = e
                continue
            if ticket is not None:
                tickets.append((one, ticket))
        # Each ticket releases its descriptors itself when it has run, failed or not.
        results = await asyncio.gather(
            *(loop.run_in_executor(self._pool, ticket.run) for _, ticket in tickets),
            return_exceptions=True,
        )
        for (one, ticket), result in zip(tickets, results, strict=True):
            if isinstance(result, DescriptorsExhaustedError):
                # A file could not be reopened to sync it: no fsync failed, nothing is lost;
                # the data stays dirty for the next round.
                _prepare_failures.warning(
                    one.directory.name, "cannot flush %s: %r", one.directory.name, result
                )
                failed[one] = result
            elif isinstance(result, BaseException):
                raise result  # a failed fsync (OSError: the caller halts) or a bug
            else:
                one.complete_flush(ticket)
        return failed

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _fail(waiters: list[_Waiter], error: BaseException) -> None:
    for waiter, _ in waiters:
        if not waiter.done():
            waiter.set_exception(error)


RETRY_BACKOFF_S = (0.01, 0.05, 0.2, 1.0)  # then 1 s between tries


async def until_durable(
    committer: GroupCommitter, logs: Iterable[PartitionLog]
) -> dict[PartitionLog, LogClosedError]:
    """Wait until every log is durable, retrying the rounds that could not prepare it (EMFILE):
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
