"""Sparse offset index (`.index`): relative offset -> file position of a batch.

An entry (relative last offset of a batch, int32 position where that batch starts) is added
whenever more than `index.interval.bytes` were written since the previous entry, as Kafka does.
A lookup gives a position at or before the batch containing an offset; a short forward scan
of batch headers finishes the job.
"""

from __future__ import annotations

import bisect
import struct
from pathlib import Path

from onceflow.log.index_file import IndexFile


class OffsetIndex(IndexFile):
    ENTRY = struct.Struct(">ii")

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        super().__init__(path, base_offset, max_index_bytes)
        self._relative_offsets: list[int] = []
        self._positions: list[int] = []

    @classmethod
    def create(cls, path: Path, base_offset: int, max_index_bytes: int) -> OffsetIndex:
        index = cls(path, base_offset, max_index_bytes)
        index._write_all([])
        return index

    @classmethod
    def load(
        cls, path: Path, base_offset: int, max_index_bytes: int, log_size: int
    ) -> OffsetIndex | None:
        """The index stored at `path`, or None when it is missing or fails the sanity checks."""
        index = cls(path, base_offset, max_index_bytes)
        raw = index.read_raw_entries()
        if raw is None:
            return None
        last_relative, last_position = -1, -1
        for relative, position in raw:
            if relative <= last_relative or position <= last_position or position >= log_size:
                return None
            last_relative, last_position = relative, position
        index._relative_offsets = [r for r, _ in raw]
        index._positions = [p for _, p in raw]
        index._entries = len(raw)
        return index

    def append(self, last_offset: int, position: int) -> None:
        relative = last_offset - self.base_offset
        self._write_entry(relative, position)
        self._relative_offsets.append(relative)
        self._positions.append(position)

    def replace(self, entries: list[tuple[int, int]]) -> None:
        """Rewrite the whole index from (last offset, position) pairs (a rebuild)."""
        self._relative_offsets = [o - self.base_offset for o, _ in entries]
        self._positions = [p for _, p in entries]
        self._write_all(list(zip(self._relative_offsets, self._positions, strict=True)))

    def lookup(self, offset: int) -> int:
        """Position of the last indexed batch ending at or before `offset` (0 when none)."""
        i = bisect.bisect_right(self._relative_offsets, offset - self.base_offset)
        return self._positions[i - 1] if i else 0

    @property
    def last_entry(self) -> tuple[int, int] | None:
        """(absolute last offset, position) of the newest entry."""
        if not self._positions:
            return None
        return self.base_offset + self._relative_offsets[-1], self._positions[-1]
