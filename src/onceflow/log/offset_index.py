"""Sparse offset index (`.index`): relative offset -> file position of a batch.

An entry (relative last offset of a batch, int32 position where that batch starts) is added
whenever more than `index.interval.bytes` were written since the previous entry, as Kafka does.
A lookup gives a position at or before the batch containing an offset; a short forward scan
of batch headers finishes the job.
"""

from __future__ import annotations

import struct
from pathlib import Path

from onceflow.log.index_file import IndexFile


class OffsetIndex(IndexFile):
    """Entries (offset relative to the base, position)."""

    ENTRY = struct.Struct(">ii")

    @classmethod
    def load(
        cls, path: Path, base_offset: int, max_index_bytes: int, log_size: int
    ) -> OffsetIndex | None:
        """The index stored at `path`, or None when it is missing or fails the sanity checks."""

        def sane(raw: list[tuple[int, ...]]) -> bool:
            last_relative, last_position = -1, -1
            for relative, position in raw:
                if relative <= last_relative or position <= last_position or position >= log_size:
                    return False
                last_relative, last_position = relative, position
            return True

        return cls._load_checked(path, base_offset, max_index_bytes, sane)

    def append(self, last_offset: int, position: int) -> None:
        self._append_entry(last_offset - self.base_offset, position)

    def replace(self, entries: list[tuple[int, int]]) -> None:
        """Rewrite the whole index from (last offset, position) pairs (a rebuild)."""
        self._replace_entries([(o - self.base_offset, p) for o, p in entries])

    def lookup(self, offset: int) -> int:
        """Position of the last indexed batch ending at or before `offset` (0 when none)."""
        position = self._floor(offset - self.base_offset)
        return 0 if position is None else position

    @property
    def last_entry(self) -> tuple[int, int] | None:
        """(absolute last offset, position) of the newest entry."""
        last = self._last()
        return None if last is None else (self.base_offset + last[0], last[1])
