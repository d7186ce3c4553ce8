"""An append-only file of fixed-size big-endian entries, mirrored in memory.

The common mechanics of the offset index and the time index (and later the
aborted-transaction index): Kafka's on-disk layout, kept in Python lists for lookups,
rewritten from scratch when a rebuild is needed. Not preallocated, so no trimming on roll.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from onceflow.log.file_handles import FileHandle, file_handles
from onceflow.log.full_disk import check_space


class IndexFile:
    """Entries of one `struct` layout in one file; subclasses give them meaning."""

    ENTRY: struct.Struct

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max_index_bytes // self.ENTRY.size
        self._file: FileHandle | None = None  # opened on demand through the broker's cache
        self._entries = 0

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

    def _write_entry(self, *values: int) -> None:
        check_space()
        with self.file.pinned() as fd:
            os.pwrite(fd, self.ENTRY.pack(*values), self._entries * self.ENTRY.size)
        self._entries += 1

    def _write_all(self, entries: list[tuple[int, ...]]) -> None:
        """Replace the file's content with `entries` (used by rebuilds)."""
        check_space()
        data = b"".join(self.ENTRY.pack(*e) for e in entries)
        with self.file.pinned() as fd:
            os.ftruncate(fd, 0)
            if data:
                os.pwrite(fd, data, 0)
        self._entries = len(entries)

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
