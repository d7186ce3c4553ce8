"""The fsyncs that opening thousands of logs owes, made at once before anything is served.

After a kill -9 each partition owes one fsync (its recovered active segment's log, whose bytes
become committed data), after a clean stop one directory fsync (its removed clean-shutdown
marker, which must be gone from the disk before anything is appended). Nothing depends on
them until the broker serves, so they are owed to a barrier passed once every log is open:
Linux's syncfs(2) makes every file of the file system durable in one call (as PostgreSQL's
`recovery_init_sync_method=syncfs` does at its start; since Linux 5.8 it reports writeback
errors), elsewhere each file is fsynced.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Callable

from onceflow.log.file_handles import FileHandle, file_handles


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return None
    syncfs.argtypes = [ctypes.c_int]
    syncfs.restype = ctypes.c_int
    return syncfs  # type: ignore[no-any-return]


_syncfs = _load_syncfs()


class SyncBarrier:
    """fsyncs deferred by `defer`, all made by `sync`; safe to use from several threads."""

    def __init__(self, *, use_syncfs: bool = True) -> None:
        self._handles: list[FileHandle] = []
        self._lock = threading.Lock()
        self._syncfs = _syncfs if use_syncfs else None

    def defer(self, handle: FileHandle) -> None:
        with self._lock:
            self._handles.append(handle)

    def __len__(self) -> int:
        return len(self._handles)

    def sync(self) -> None:
        """Make every deferred file durable (raises OSError as fsync would)."""
        with self._lock:
            handles, self._handles = self._handles, []
        if not handles:
            return
        if self._syncfs is None:
            for handle in handles:
                handle.fsync()
            return
        # One file of each file system the handles live on (a data directory is usually one).
        by_device: dict[int, FileHandle] = {}
        for handle in handles:
            try:
                by_device.setdefault(os.stat(handle.path).st_dev, handle)
            except FileNotFoundError:
                continue  # deleted since: nothing left to make durable
        for handle in by_device.values():
            with file_handles().transient(handle.path, os.O_RDONLY) as fd:
                if self._syncfs(fd) != 0:
                    error = ctypes.get_errno()
                    raise OSError(error, f"syncfs of {handle.path}: {os.strerror(error)}")
