"""The broker's group commit over real logs: one fsync round serves every waiter, and a failed
fsync goes to the failure handler (the broker's halts) with the data left below the
high watermark's reach."""

from __future__ import annotations

import asyncio

import pytest
from log_batches import batches, make_batch

from onceflow.broker.durability import GroupCommitter
from onceflow.log import flush as flush_module


def append(log, n: int = 3) -> None:
    log.append(*batches(make_batch(n, value=b"g" * 20)))


def test_waiters_that_gather_during_a_round_share_the_next_one(open_log) -> None:
    logs = [open_log(name=f"t-{i}") for i in range(3)]
    committer = GroupCommitter()

    async def scenario() -> None:
        for log in logs:
            append(log)
        first = asyncio.ensure_future(committer.wait_durable([logs[0]]))
        await asyncio.sleep(0)  # the first round starts with logs[0] alone
        waiting = [asyncio.ensure_future(committer.wait_durable([log])) for log in logs[1:]]
        await asyncio.gather(first, *waiting)

    try:
        asyncio.run(scenario())
    finally:
        committer.close()
    assert [log.flushed_offset for log in logs] == [3, 3, 3]
    assert committer.rounds == 2


def test_a_failed_fsync_goes_to_the_failure_handler_and_moves_nothing(
    open_log, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log()
    append(log)
    failures: list[OSError] = []
    committer = GroupCommitter(on_failure=failures.append)

    def failing_sync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(flush_module, "_sync_data", failing_sync)
    try:
        with pytest.raises(OSError):
            asyncio.run(committer.wait_durable([log]))
    finally:
        committer.close()
    assert len(failures) == 1 and "Input/output error" in str(failures[0])
    assert log.flushed_offset == 0
    assert committer.rounds == 0


def test_the_broker_halts_on_a_failed_fsync() -> None:
    from onceflow.broker.storage_failure import halt

    assert GroupCommitter().on_failure is halt
