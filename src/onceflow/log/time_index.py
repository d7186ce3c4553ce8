"""Sparse time index (`.timeindex`): max timestamp so far -> the offset that reached it.

Entries (int64 timestamp, int32 relative offset) have strictly increasing timestamps: one is
added next to each offset-index entry when the segment's max timestamp grew, and one last
entry when the segment is rolled, so that the final entry holds the segment's max timestamp.
"""

from __future__ import annotations

import bisect
import struct
from pathlib import Path

from onceflow.log.index_file import IndexFile


class TimeIndex(IndexFile):
    ENTRY = struct.Struct(">qi")

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        super().__init__(path, base_offset, max_index_bytes)
        self._timestamps: list[int] = []
        self._relative_offsets: list[int] = []

    @classmethod
    def create(cls, path: Path, base_offset: int, max_index_bytes: int) -> TimeIndex:
        index = cls(path, base_offset, max_index_bytes)
        index._write_all([])
        return index

    @classmethod
    def load(cls, path: Path, base_offset: int, max_index_bytes: int) -> TimeIndex | None:
        """The index stored at `path`, or None when it is missing or fails the sanity checks."""
        index = cls(path, base_offset, max_index_bytes)
        raw = index.read_raw_entries()
        if raw is None:
            return None
        last_timestamp, last_relative = -1, 0
        for timestamp, relative in raw:
            if timestamp <= last_timestamp or relative < last_relative:
                return None
            last_timestamp, last_relative = timestamp, relative
        index._timestamps = [t for t, _ in raw]
        index._relative_offsets = [r for _, r in raw]
        index._entries = len(raw)
        return index

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> None:
        """Add (timestamp, offset) if the timestamp is newer than the last entry's."""
        if self._timestamps and timestamp <= self._timestamps[-1]:
            return
        if timestamp < 0 or (self.is_full and not skip_full_check):
            return
        relative = offset - self.base_offset
        self._write_entry(timestamp, relative)
        self._timestamps.append(timestamp)
        self._relative_offsets.append(relative)

    def replace(self, entries: list[tuple[int, int]]) -> None:
        """Rewrite the whole index from (timestamp, absolute offset) pairs (a rebuild)."""
        self._timestamps = [t for t, _ in entries]
        self._relative_offsets = [o - self.base_offset for _, o in entries]
        self._write_all(list(zip(self._timestamps, self._relative_offsets, strict=True)))

    def lookup(self, timestamp: int) -> int:
        """Offset of the newest entry whose timestamp is <= `timestamp` (base offset if none).

        Every batch before that offset has a max timestamp below the entry's, so a search for
        the first batch reaching `timestamp` can start at that offset's batch.
        """
        i = bisect.bisect_right(self._timestamps, timestamp)
        return self.base_offset + (self._relative_offsets[i - 1] if i else 0)

    @property
    def last_entry(self) -> tuple[int, int] | None:
        """(timestamp, absolute offset) of the newest entry: the max timestamp once rolled."""
        if not self._timestamps:
            return None
        return self._timestamps[-1], self.base_offset + self._relative_offsets[-1]
