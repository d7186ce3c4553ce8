from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from log_batches import batches, make_batch, stored

from onceflow.log import file_handles
from onceflow.log import flush as flush_module
from onceflow.log.config import LogConfig
from onceflow.log.errors import LogStorageError
from onceflow.log.recovery import CLEAN_SHUTDOWN_FILE
from onceflow.log.recovery_point import RecoveryPointFile

CONFIG = LogConfig(segment_bytes=600, index_interval_bytes=100, retention_bytes=4000)


def append_one(log, n=2):
    raw = make_batch(n, value=b"f" * 25)
    info = log.append(*batches(raw))
    return info.first_offset, stored(raw, info.first_offset)


def flush(log):
    ticket = log.prepare_flush()
    if ticket is not None:
        ticket.run()
        log.complete_flush(ticket)


def test_prepare_flush_is_none_until_something_is_dirty(open_log):
    log = open_log(CONFIG)
    assert log.prepare_flush() is None
    append_one(log)
    assert log.flushed_offset == 0
    ticket = log.prepare_flush()
    assert ticket is not None and ticket.offset == 2
    append_one(log)  # after prepare: not covered by this ticket
    ticket.run()
    log.complete_flush(ticket)
    assert log.flushed_offset == 2
    flush(log)
    assert log.flushed_offset == 4
    assert log.prepare_flush() is None


def test_a_new_logs_directory_is_synced_by_its_first_flush(open_log, monkeypatch):
    """open() of a new log syncs no directory of its own (CreateTopics of 10,000 partitions):
    the first flush, which makes its first records durable, syncs the directory with them."""
    synced: list[object] = []
    log = open_log(CONFIG)
    directory = log.directory
    original = file_handles.FileHandleCache.fsync

    def recording(cache, handle, sync=None):
        synced.append(handle.path)
        return original(cache, handle, sync)

    monkeypatch.setattr(file_handles.FileHandleCache, "fsync", recording)
    append_one(log)
    flush(log)
    assert directory in synced, synced
    synced.clear()
    append_one(log)
    flush(log)
    assert directory not in synced, synced  # once is enough


def test_a_roll_makes_the_next_ticket_advance_the_recovery_point(open_log):
    log = open_log(CONFIG)
    append_one(log)
    flush(log)
    log.roll()
    ticket = log.prepare_flush()  # nothing new appended, but a segment to finalise
    assert ticket is not None
    ticket.run()
    log.complete_flush(ticket)
    assert RecoveryPointFile.read(log.directory) == 2
    assert log.prepare_flush() is None


def test_a_ticket_whose_run_failed_is_refused_and_the_data_stays_dirty(open_log, monkeypatch):
    log = open_log(CONFIG)
    append_one(log)
    ticket = log.prepare_flush()

    def failing_sync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(flush_module, "_sync_data", failing_sync)
    with pytest.raises(LogStorageError) as raised:
        ticket.run()
    assert isinstance(raised.value, OSError)  # the broker's group commit catches OSError
    with pytest.raises(LogStorageError):
        log.complete_flush(ticket)
    assert log.flushed_offset == 0
    monkeypatch.undo()
    flush(log)
    assert log.flushed_offset == 2


def test_completing_an_unrun_ticket_waives_durability_but_not_the_recovery_point(open_log):
    # The broker's no-fsync mode: prepare, then complete without running.
    log = open_log(CONFIG)
    append_one(log)
    log.roll()
    append_one(log)
    log.complete_flush(log.prepare_flush())
    assert log.flushed_offset == 4
    assert log.prepare_flush() is None
    assert RecoveryPointFile.read(log.directory) == 0  # a crash now scans everything
    log.roll()
    append_one(log)
    flush(log)  # a real flush cannot vouch for the waived segment
    assert RecoveryPointFile.read(log.directory) == 0
    log.close()  # but a clean close syncs everything, waived segments included
    assert RecoveryPointFile.read(log.directory) == 4


def test_tickets_run_on_a_worker_while_appends_rolls_and_retention_go_on(open_log):
    log = open_log(CONFIG)
    expected: dict[int, bytes] = {}
    flushed_seen = []
    with ThreadPoolExecutor(max_workers=1) as worker:
        in_flight = None
        for i in range(600):
            first, raw = append_one(log, n=1 + i % 3)
            expected[first] = raw
            if i % 37 == 0:
                log.roll()
            if i % 53 == 0:
                log.delete_expired_segments()
            if in_flight is not None and i % 100 == 99:
                in_flight[1].result(timeout=30)  # now and then, let one finish for sure
            if in_flight is not None and in_flight[1].done():
                ticket, future = in_flight
                future.result()  # re-raises a failure of the worker
                log.complete_flush(ticket)
                flushed_seen.append(log.flushed_offset)
                in_flight = None
            if in_flight is None:
                ticket = log.prepare_flush()
                if ticket is not None:
                    in_flight = (ticket, worker.submit(ticket.run))
        if in_flight is not None:
            in_flight[1].result(timeout=30)
            log.complete_flush(in_flight[0])
    flush(log)
    assert log.flushed_offset == log.log_end_offset
    assert flushed_seen == sorted(flushed_seen) and len(flushed_seen) > 5
    assert RecoveryPointFile.read(log.directory) == log.segment_base_offsets[-1]
    assert log.prepare_flush() is None

    start = log.log_start_offset
    survivors = b"".join(raw for first, raw in sorted(expected.items()) if first >= start)
    assert log.read(start, 1 << 22).data == survivors
    log._abandon()  # unclean: only the active segment should need a scan
    log = open_log(CONFIG)
    assert log.read(start, 1 << 22).data == survivors


def run_reporting(ticket, errors: list[Exception]) -> None:
    try:
        ticket.run()
    except Exception as exc:  # handed to the test thread, which asserts there is none
        errors.append(exc)


def test_a_ticket_outlives_close_and_delete_of_its_log(open_log):
    for end in ("close", "delete"):
        log = open_log(CONFIG, name=f"p-{end}")
        for _ in range(20):
            append_one(log)
        ticket = log.prepare_flush()
        getattr(log, end)()
        errors: list[Exception] = []
        thread = threading.Thread(target=run_reporting, args=(ticket, errors))
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive() and errors == []
        assert ticket.done


def test_close_flushes_and_leaves_the_marker_open_removes_it(open_log):
    log = open_log(CONFIG)
    for _ in range(10):
        append_one(log)
    log.close()
    assert log.flushed_offset == 20
    assert (log.directory / CLEAN_SHUTDOWN_FILE).exists()
    log.close()  # idempotent
    log = open_log(CONFIG)
    assert not (log.directory / CLEAN_SHUTDOWN_FILE).exists()
    assert log.flushed_offset == log.log_end_offset == 20


def test_delete_removes_the_directory(open_log):
    log = open_log(CONFIG)
    append_one(log)
    log.delete()
    assert not log.directory.exists()
