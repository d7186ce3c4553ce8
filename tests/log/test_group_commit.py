"""The broker's group commit over real logs: one flush of a log serves every writer that
gathered for it, logs do not wait for each other, and a failed fsync goes to the failure
handler (the broker's halts) with the data left below the high watermark's reach."""

from __future__ import annotations

import asyncio
import errno
import threading

import pytest
from log_batches import batches, make_batch

from onceflow.broker.durability import GroupCommitter, NotDurableError
from onceflow.log import flush as flush_module
from onceflow.log.errors import LogClosedError, LogStorageError


def append(log, n: int = 3) -> None:
    log.append(*batches(make_batch(n, value=b"g" * 20)))


def test_writers_that_gather_while_a_log_flushes_share_its_next_flush(open_log) -> None:
    log = open_log()
    committer = GroupCommitter()

    async def scenario() -> None:
        append(log)
        first = asyncio.ensure_future(committer.wait_durable([log]))
        await asyncio.sleep(0)  # the first writer's flush starts with it alone
        await asyncio.sleep(0)
        append(log)
        waiting = [asyncio.ensure_future(committer.wait_durable([log])) for _ in range(5)]
        await asyncio.gather(first, *waiting)

    try:
        asyncio.run(scenario())
    finally:
        committer.close()
    assert log.flushed_offset == 6
    assert committer.flushes == 2


def test_a_log_does_not_wait_for_another_logs_flush(
    open_log, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One log's fsync hangs until released; another log's writer is answered meanwhile.
    slow, fast = open_log(name="slow-0"), open_log(name="fast-0")
    release = threading.Event()
    real_run = slow.prepare_flush

    def held_prepare():
        ticket = real_run()
        run = ticket.run

        def held_run() -> None:
            assert release.wait(10)
            run()

        ticket.run = held_run
        return ticket

    monkeypatch.setattr(slow, "prepare_flush", held_prepare)
    committer = GroupCommitter()

    async def scenario() -> None:
        append(slow)
        append(fast)
        held = asyncio.ensure_future(committer.wait_durable([slow]))
        await asyncio.wait_for(committer.wait_durable([fast]), 10)
        assert fast.flushed_offset == 3 and slow.flushed_offset == 0 and not held.done()
        release.set()
        await asyncio.wait_for(held, 10)

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        committer.close()
    assert slow.flushed_offset == 3


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
    assert committer.flushes == 0


def test_the_broker_halts_on_a_failed_fsync() -> None:
    from onceflow.halt import halt

    assert GroupCommitter().on_failure is halt


# -- a flush never dies: a log that cannot be prepared fails its own waiters only ------------


def _emfile_once(log, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log's next prepare_flush fails as os.dup does when out of descriptors."""
    real = log.prepare_flush

    def failing():
        monkeypatch.setattr(log, "prepare_flush", real)
        raise LogStorageError("cannot prepare a flush") from OSError(errno.EMFILE, "Too many")

    monkeypatch.setattr(log, "prepare_flush", failing)


def test_a_log_deleted_mid_flush_fails_its_waiters_and_no_one_else(open_log) -> None:
    doomed, other = open_log(name="doomed-0"), open_log(name="other-0")
    committer = GroupCommitter(on_failure=pytest.fail)

    async def scenario() -> tuple[BaseException | None, ...]:
        append(doomed)
        append(other)
        waiters = [
            asyncio.ensure_future(committer.wait_durable([doomed])),
            asyncio.ensure_future(committer.wait_durable([other])),
            asyncio.ensure_future(committer.wait_durable([doomed, other])),
        ]
        doomed.delete()  # DeleteTopics between the appends and the flush
        results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 10)
        # The committer lives on: a later flush serves a later writer.
        append(other)
        await asyncio.wait_for(committer.wait_durable([other]), 10)
        return tuple(results)

    try:
        alone, unaffected, both = asyncio.run(scenario())
    finally:
        committer.close()
    assert isinstance(alone, NotDurableError)
    assert isinstance(alone.failures[doomed], LogClosedError)
    assert unaffected is None
    assert isinstance(both, NotDurableError) and set(both.failures) == {doomed}
    assert other.flushed_offset == 6


def test_emfile_while_preparing_fails_that_log_and_the_next_flush_retries(
    open_log, monkeypatch: pytest.MonkeyPatch
) -> None:
    starved, other = open_log(name="starved-0"), open_log(name="other-0")
    halts: list[OSError] = []
    committer = GroupCommitter(on_failure=halts.append)

    async def scenario() -> tuple[BaseException | None, ...]:
        append(starved)
        append(other)
        _emfile_once(starved, monkeypatch)
        first = await asyncio.wait_for(
            asyncio.gather(
                committer.wait_durable([starved]),
                committer.wait_durable([other]),
                return_exceptions=True,
            ),
            10,
        )
        assert starved.flushed_offset == 0  # nothing of it was synced
        await asyncio.wait_for(committer.wait_durable([starved]), 10)  # descriptors are back
        return tuple(first)

    try:
        starved_result, other_result = asyncio.run(scenario())
    finally:
        committer.close()
    assert isinstance(starved_result, NotDurableError)
    assert starved_result.failures[starved].__cause__.errno == errno.EMFILE
    assert other_result is None
    assert starved.flushed_offset == 3 and other.flushed_offset == 3
    assert halts == []  # EMFILE is not a storage failure


def test_a_bug_in_a_flush_fails_its_waiters_and_the_committer_goes_on(
    open_log, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log()
    committer = GroupCommitter(on_failure=pytest.fail)
    real = log.complete_flush

    def broken(ticket) -> None:
        monkeypatch.setattr(log, "complete_flush", real)
        raise RuntimeError("bug")

    monkeypatch.setattr(log, "complete_flush", broken)

    async def scenario() -> None:
        append(log)
        with pytest.raises(RuntimeError, match="bug"):
            await asyncio.wait_for(committer.wait_durable([log]), 10)
        append(log)
        await asyncio.wait_for(committer.wait_durable([log]), 10)

    try:
        asyncio.run(scenario())
    finally:
        committer.close()
    assert log.flushed_offset == 6


def test_without_fsync_a_deleted_log_fails_its_waiter_too(open_log) -> None:
    doomed = open_log(name="doomed-0")
    committer = GroupCommitter(enabled=False)
    append(doomed)
    doomed.delete()
    with pytest.raises(NotDurableError):
        asyncio.run(committer.wait_durable([doomed]))
    committer.close()
