"""Focused tests of the aborted-transaction index (`.txnindex` files)."""

from __future__ import annotations

import logging
import os
import struct
import threading
from pathlib import Path

import pytest

from onceflow.log.aborted_index import (
    ENTRY_SIZE,
    AbortedTxn,
    AbortedTxnIndex,
    txn_index_file,
)
from onceflow.log.producer_errors import CorruptTxnIndexError, TxnIndexStorageError
from onceflow.log.producer_state import CompletedTxn


def aborted(pid: int, first: int, last: int, lso: int | None = None) -> CompletedTxn:
    return CompletedTxn(pid, first, last, True, last + 1 if lso is None else lso)


def make_segments(directory: Path, *bases: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for base in bases:
        (directory / f"{base:020d}.log").touch()


def filled_index(
    directory: Path, txns: list[tuple[int, ...]], segments: tuple[int, ...] = ()
) -> AbortedTxnIndex:
    """An index over the segments with these bases, holding `txns` as aborted(*txn) adds."""
    make_segments(directory, *segments)
    index = AbortedTxnIndex.open(directory)
    for txn in txns:
        index.add(aborted(*txn))
    return index


def test_entries_are_kafkas_34_byte_records(tmp_path: Path) -> None:
    index = AbortedTxnIndex.open(tmp_path)
    assert index.add(aborted(7, 3, 9, lso=4)) == AbortedTxn(7, 3, 9, 4)
    index.flush()
    raw = txn_index_file(tmp_path, 0).read_bytes()
    assert ENTRY_SIZE == 34
    assert raw == struct.pack(">hqqqq", 0, 7, 3, 9, 4)
    assert txn_index_file(tmp_path, 0).name == "00000000000000000000.txnindex"


def test_commits_need_no_entry(tmp_path: Path) -> None:
    index = AbortedTxnIndex.open(tmp_path)
    assert index.add(CompletedTxn(1, 0, 5, False, 6)) is None
    assert len(index) == 0
    assert not txn_index_file(tmp_path, 0).exists()


def test_collect_returns_the_aborted_transactions_overlapping_the_fetch(tmp_path: Path) -> None:
    index = filled_index(tmp_path, [(1, 0, 10, 11), (2, 5, 20, 21), (3, 25, 30, 31)])
    assert index.collect(0, 100) == [(1, 0), (2, 5), (3, 25)]
    assert index.collect(11, 100) == [(2, 5), (3, 25)]  # last offset >= fetch offset
    assert index.collect(10, 25) == [(1, 0), (2, 5)]  # first offset < upper bound
    assert index.collect(21, 25) == []
    assert index.collect(31, 1000) == []


def test_entries_go_to_the_segment_holding_the_marker(tmp_path: Path) -> None:
    txns = [(1, 10, 50), (1, 90, 150), (2, 120, 199), (2, 210, 250)]
    index = filled_index(tmp_path, txns, segments=(0, 100, 200))
    index.add(aborted(3, 260, 270), segment_base_offset=260)  # the caller knows better
    assert index.segment_base_offsets == [0, 100, 200, 260]
    sizes = {b: txn_index_file(tmp_path, b).stat().st_size for b in index.segment_base_offsets}
    assert sizes == {0: 34, 100: 68, 200: 34, 260: 34}
    with pytest.raises(ValueError):
        index.add(aborted(4, 280, 290), segment_base_offset=300)


def test_reopen_reads_every_entry_back(tmp_path: Path) -> None:
    make_segments(tmp_path, 0, 100)
    index = AbortedTxnIndex.open(tmp_path)
    for i in range(10):
        index.add(aborted(i, 20 * i, 20 * i + 15, lso=20 * i + 16))
    index.close()
    again = AbortedTxnIndex.open(tmp_path)
    assert again.entries() == index.entries()
    assert again.segment_base_offsets == [0, 100]
    again.add(aborted(99, 300, 301))  # appends continue after the loaded entries
    assert AbortedTxnIndex.open(tmp_path).entries()[-1] == AbortedTxn(99, 300, 301, 302)


def test_a_torn_last_entry_is_dropped_on_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    filled_index(tmp_path, [(1, 0, 5), (2, 6, 9)]).close()
    path = txn_index_file(tmp_path, 0)
    with path.open("ab") as f:
        f.write(b"\0\0\0\0\0\0\0\x03\0\0")  # a crash in the middle of a third entry
    with caplog.at_level(logging.WARNING):
        again = AbortedTxnIndex.open(tmp_path)
    assert "torn" in caplog.text
    assert [t.producer_id for t in again.entries()] == [1, 2]
    assert path.stat().st_size == 2 * ENTRY_SIZE
    again.add(aborted(3, 10, 12))
    assert [t.producer_id for t in AbortedTxnIndex.open(tmp_path).entries()] == [1, 2, 3]


def test_unknown_version_is_corrupt(tmp_path: Path) -> None:
    txn_index_file(tmp_path, 0).write_bytes(struct.pack(">hqqqq", 1, 1, 0, 5, 6))
    with pytest.raises(CorruptTxnIndexError, match="version"):
        AbortedTxnIndex.open(tmp_path)
    AbortedTxnIndex.delete_files(tmp_path)
    assert len(AbortedTxnIndex.open(tmp_path)) == 0


def test_out_of_order_entries_are_corrupt(tmp_path: Path) -> None:
    raw = struct.pack(">hqqqq", 0, 1, 0, 9, 10) + struct.pack(">hqqqq", 0, 2, 3, 8, 10)
    txn_index_file(tmp_path, 0).write_bytes(raw)
    with pytest.raises(CorruptTxnIndexError):
        AbortedTxnIndex.open(tmp_path)


def test_entry_below_its_segment_is_corrupt(tmp_path: Path) -> None:
    txn_index_file(tmp_path, 100).write_bytes(struct.pack(">hqqqq", 0, 1, 0, 50, 51))
    with pytest.raises(CorruptTxnIndexError):
        AbortedTxnIndex.open(tmp_path)


def test_last_offsets_must_increase(tmp_path: Path) -> None:
    index = AbortedTxnIndex.open(tmp_path)
    index.add(aborted(1, 0, 10))
    with pytest.raises(ValueError):
        index.add(aborted(2, 3, 10))
    with pytest.raises(ValueError):
        index.add(aborted(2, 3, 8))
    with pytest.raises(ValueError):
        index.add(aborted(2, 30, 20))
    # a recovery replay re-adding an entry that is there already gets the stored one
    assert index.add(aborted(1, 0, 10)) == AbortedTxn(1, 0, 10, 11)
    assert len(index) == 1


def test_truncate_after_drops_markers_at_or_after_the_new_end(tmp_path: Path) -> None:
    make_segments(tmp_path, 0, 100, 200)
    index = AbortedTxnIndex.open(tmp_path)
    for last in (20, 60, 120, 180, 220):
        index.add(aborted(last, last - 5, last))
    index.truncate_after(120)
    assert [t.last_offset for t in index.entries()] == [20, 60]
    assert index.segment_base_offsets == [0, 100]  # the file of segment 200 is gone
    assert txn_index_file(tmp_path, 100).stat().st_size == 0
    assert not txn_index_file(tmp_path, 200).exists()
    index.add(aborted(1, 110, 130))
    index.close()
    assert [t.last_offset for t in AbortedTxnIndex.open(tmp_path).entries()] == [20, 60, 130]


def test_delete_before_removes_the_files_of_deleted_segments(tmp_path: Path) -> None:
    index = filled_index(tmp_path, [(1, 10, 50), (2, 150, 160), (3, 210, 220)], (0, 100, 200))
    (tmp_path / f"{0:020d}.log").unlink()  # retention dropped segment 0, log start is 100
    index.delete_before(100)
    assert index.segment_base_offsets == [100, 200]
    assert not txn_index_file(tmp_path, 0).exists()
    index.delete_before(150)  # segment 100 still holds offset 150
    assert index.segment_base_offsets == [100, 200]
    index.delete_before(200)
    assert index.segment_base_offsets == [200]
    assert index.collect(0, 1000) == [(3, 210)]


def test_segment_files_deleted_by_the_log_are_noticed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index = AbortedTxnIndex.open(tmp_path)
    index.add(aborted(1, 0, 5))
    txn_index_file(tmp_path, 0).unlink()  # the log deleted segment 0 with its .txnindex
    with caplog.at_level(logging.WARNING):
        index.add(aborted(2, 6, 8))  # a new segment 0 (the log was truncated fully)
    assert "deleted externally" in caplog.text
    assert index.entries() == [AbortedTxn(2, 6, 8, 9)]
    index.close()
    assert AbortedTxnIndex.open(tmp_path).entries() == [AbortedTxn(2, 6, 8, 9)]


def test_flush_on_a_worker_thread_while_appending(tmp_path: Path) -> None:
    make_segments(tmp_path, 0)
    index = AbortedTxnIndex.open(tmp_path)
    stop = threading.Event()
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                index.flush()
        except BaseException as exc:  # surfaced to the test below
            errors.append(exc)

    worker = threading.Thread(target=flusher)
    worker.start()
    try:
        for i in range(400):
            if i % 100 == 99:
                make_segments(tmp_path, i * 10)
            index.add(aborted(i, i * 10, i * 10 + 5))
    finally:
        stop.set()
        worker.join(timeout=30)
    assert not worker.is_alive()
    assert errors == []
    index.close()
    assert len(AbortedTxnIndex.open(tmp_path)) == 400


def test_a_failed_fsync_is_a_storage_error_and_stays_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = AbortedTxnIndex.open(tmp_path)
    index.add(aborted(1, 0, 5))

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(TxnIndexStorageError):
        index.flush()
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    index.flush()
    assert len(synced) == 2  # the file and the directory are still synced afterwards
