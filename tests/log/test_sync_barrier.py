"""The barrier a start or a stop of many logs owes its fsyncs to: one syncfs per file system,
or each file's fsync where syncfs is missing; nothing is synced before `sync()`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from onceflow.log import sync_barrier
from onceflow.log.file_handles import file_handles
from onceflow.log.sync_barrier import SyncBarrier


def _handles(tmp_path: Path, n: int) -> list:
    paths = []
    for i in range(n):
        path = tmp_path / f"f{i}"
        path.write_bytes(b"x")
        paths.append(file_handles().handle(path, os.O_RDWR))
    return paths


def test_one_syncfs_per_file_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(sync_barrier, "_syncfs", lambda fd: calls.append(fd) or 0)
    barrier = SyncBarrier()
    for handle in _handles(tmp_path, 50):
        barrier.defer(handle)
    assert calls == []  # deferred
    barrier.sync()
    assert len(calls) == 1
    barrier.sync()  # nothing owed any more
    assert len(calls) == 1


def test_a_failed_syncfs_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_barrier, "_syncfs", lambda fd: -1)
    barrier = SyncBarrier()
    barrier.defer(_handles(tmp_path, 1)[0])
    with pytest.raises(OSError):
        barrier.sync()


def test_without_syncfs_each_file_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    barrier = SyncBarrier(use_syncfs=False)
    for handle in _handles(tmp_path, 5):
        barrier.defer(handle)
    barrier.sync()
    assert len(synced) == 5


def test_syncfs_is_found_on_linux() -> None:
    if os.uname().sysname != "Linux":
        pytest.skip("syncfs(2) is Linux's")
    assert sync_barrier._syncfs is not None
