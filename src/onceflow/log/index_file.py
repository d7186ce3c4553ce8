"""An append-only file of fixed-size big-endian entries, mirrored in memory.

The common mechanics of the offset index and the time index (and later the
aborted-transaction index): Kafka's on-disk layout, kept in Python lists for lookups,
rewritten from scratch when a rebuild is needed. Not preallocated, so no trimming on roll.

Appended entries reach the file only at `write_pending()` (on roll, and before the file is
synced), in one write, as Kafka's memory-mapped indexes reach the disk: a file write per entry
cost two system calls per batch on the produce path. Nothing is lost by waiting: the indexes
of the active segment are never trusted after a crash (recovery rebuilds them from the log).
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Self

from onceflow.log.file_handles import FileHandle, file_handles
from onceflow.log.full_disk import check_space


class IndexFile:
    """Two-field entries of one `struct` layout in one file, sorted by their first field (the
    key a lookup searches; the second is what it finds); subclasses give them meaning."""

    ENTRY: struct.Struct

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max_index_bytes // self.ENTRY.size
        self._file: FileHandle | None = None  # opened on demand through the broker's cache
        self._entries = 0
        self._written = 0  # entries in the file; the rest are only in memory (see above)
        self._keys: list[int] = []
        self._values: list[int] = []

    @classmethod
    def _load_checked(
        cls,
        path: Path,
        base_offset: int,
        max_index_bytes: int,
        sane: Callable[[list[tuple[int, ...]]], bool],
    ) -> Self | None:
        """The index stored at `path`, or None when it is missing or its entries are not `sane`."""
        index = cls(path, base_offset, max_index_bytes)
        raw = index.read_raw_entries()
        if raw is None or not sane(raw):
            return None
        index._keys = [k for k, _ in raw]
        index._values = [v for _, v in raw]
        index._entries = index._written = len(raw)
        return index

    def _append_entry(self, key: int, value: int) -> None:
        self._keys.append(key)
        self._values.append(value)
        self._entries += 1  # written by the next write_pending()

    def _replace_entries(self, entries: list[tuple[int, int]]) -> None:
        """Rewrite the whole index (a rebuild)."""
        self._keys = [k for k, _ in entries]
        self._values = [v for _, v in entries]
        self._write_all(entries)

    def _floor(self, key: int) -> int | None:
        """The value of the last entry whose key is <= `key`, None when there is none."""
        i = bisect.bisect_right(self._keys, key)
        return self._values[i - 1] if i else None

    def _last(self) -> tuple[int, int] | None:
        return (self._keys[-1], self._values[-1]) if self._keys else None

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def is_full(self) -> bool:
        return self._entries >= self.max_entries

    def read_raw_entries(self) -> list[tuple[int, ...]] | None:
        """The entries stored in the file, or None when it is missing or not whole entries."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) % self.ENTRY.size:
            return None
        return list(self.ENTRY.iter_unpack(raw))

    def write_pending(self) -> None:
        """Write the entries that are only in memory, in one write."""
        if self._written == self._entries:
            return
        check_space()
        size = self.ENTRY.size
        pack = self.ENTRY.pack
        data = b"".join(
            pack(self._keys[i], self._values[i]) for i in range(self._written, self._entries)
        )
        with self.file.pinned() as fd:
            os.pwrite(fd, data, self._written * size)
        self._written = self._entries

    def _write_all(self, entries: list[tuple[int, ...]]) -> None:
        """Replace the file's content with `entries` (used by rebuilds)."""
        check_space()
        data = b"".join(self.ENTRY.pack(*e) for e in entries)
        with self.file.pinned() as fd:
            os.ftruncate(fd, 0)
            if data:
                os.pwrite(fd, data, 0)
        self._entries = self._written = len(entries)

    @property
    def file(self) -> FileHandle:
        """The index file's handle (created if missing when first opened)."""
        if self._file is None:
            self._file = file_handles().handle(self.path, os.O_RDWR | os.O_CREAT)
        return self._file

    def close(self) -> None:
        """Release the file; the in-memory entries stay usable for lookups."""
        if self._file is not None:
            self._file.close()
            self._file = None
