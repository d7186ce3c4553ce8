"""Sparse time index (`.timeindex`): max timestamp so far -> the offset that reached it.

Entries (int64 timestamp, int32 relative offset) have strictly increasing timestamps: one is
added next to each offset-index entry when the segment's max timestamp grew, and one last
entry when the segment is rolled, so that the final entry holds the segment's max timestamp.
"""

from __future__ import annotations

import struct
from pathlib import Path

from onceflow.log.index_file import IndexFile


class TimeIndex(IndexFile):
    """Entries (timestamp, offset relative to the base)."""

    ENTRY = struct.Struct(">qi")

    @classmethod
    def load(cls, path: Path, base_offset: int, max_index_bytes: int) -> TimeIndex | None:
        """The index stored at `path`, or None when it is missing or fails the sanity checks."""

        def sane(raw: list[tuple[int, ...]]) -> bool:
            last_timestamp, last_relative = -1, 0
            for timestamp, relative in raw:
                if timestamp <= last_timestamp or relative < last_relative:
                    return False
                last_timestamp, last_relative = timestamp, relative
            return True

        return cls._load_checked(path, base_offset, max_index_bytes, sane)

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> None:
        """Add (timestamp, offset) if the timestamp is newer than the last entry's."""
        if self._keys and timestamp <= self._keys[-1]:
            return
        if timestamp < 0 or (self.is_full and not skip_full_check):
            return
        self._append_entry(timestamp, offset - self.base_offset)

    def replace(self, entries: list[tuple[int, int]]) -> None:
        """Rewrite the whole index from (timestamp, absolute offset) pairs (a rebuild)."""
        self._replace_entries([(t, o - self.base_offset) for t, o in entries])

    def lookup(self, timestamp: int) -> int:
        """Offset of the newest entry whose timestamp is <= `timestamp` (base offset if none).

        Every batch before that offset has a max timestamp below the entry's, so a search for
        the first batch reaching `timestamp` can start at that offset's batch.
        """
        relative = self._floor(timestamp)
        return self.base_offset + (0 if relative is None else relative)

    @property
    def last_entry(self) -> tuple[int, int] | None:
        """(timestamp, absolute offset) of the newest entry: the max timestamp once rolled."""
        last = self._last()
        return None if last is None else (last[0], self.base_offset + last[1])
