"""Group commit: concurrent acks=all writers share one round of fsyncs.

A writer appends, then awaits `wait_durable(logs)`. While a round of fsyncs runs in worker
threads, new writers gather for the next round, so N producers cost one fsync per round, not N.

A failed fsync halts the broker, as Kafka halts when its last log directory fails: after a
failed fsync the kernel may have dropped the dirty pages and a later fsync succeeds (the
error is reported once), so carrying on could acknowledge, and move the high watermark over,
data that is not on disk. The restart rebuilds from what is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from onceflow.broker.storage_failure import halt
from onceflow.log.errors import DescriptorsExhaustedError
from onceflow.log.partition_log import PartitionLog


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
        self._waiters: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0

    async def wait_durable(self, logs: Iterable[PartitionLog]) -> None:
        if not self.enabled:
            # No fsync: what the OS has is taken as durable, so the high watermark follows.
            for log in logs:
                ticket = log.prepare_flush()
                if ticket is not None:
                    log.complete_flush(ticket)
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._pending.update(logs)
        self._waiters.append(waiter)
        if self._task is None:
            self._task = loop.create_task(self._run())
        await waiter

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiters:
                logs, waiters = self._pending, self._waiters
                self._pending, self._waiters = set(), []
                tickets = [(log, log.prepare_flush()) for log in logs]
                tickets = [(log, t) for log, t in tickets if t is not None]
                results = await asyncio.gather(
                    *(loop.run_in_executor(self._pool, t.run) for _, t in tickets),
                    return_exceptions=True,
                )
                errors = [r for r in results if isinstance(r, BaseException)]
                failure = next((e for e in errors if not _out_of_descriptors(e)), None)
                if failure is not None and not isinstance(failure, OSError):
                    raise failure  # a bug, not the disk
                if isinstance(failure, OSError):
                    self.on_failure(failure)
                else:
                    for log, ticket in tickets:
                        if ticket.done:
                            log.complete_flush(ticket)
                if errors:
                    # A failed fsync halted above. Out of descriptors: those logs stay dirty
                    # and the next round covers them; these writers get a retriable error.
                    for w in waiters:
                        if not w.done():
                            w.set_exception(failure or errors[0])
                    continue
                self.rounds += 1
                for w in waiters:
                    if not w.done():
                        w.set_result(None)
        finally:
            self._task = None

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _out_of_descriptors(error: BaseException) -> bool:
    return isinstance(error, DescriptorsExhaustedError)
