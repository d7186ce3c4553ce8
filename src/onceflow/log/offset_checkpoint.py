"""A per-partition offset checkpoint file: one offset, written atomically (temp file, fsync,
rename, directory fsync) and never moved back except on purpose (`store`). The recovery point
and the log start offset are kept so."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import ClassVar

from onceflow.log.file_handles import FileHandle, file_handles

logger = logging.getLogger(__name__)

_VERSION = 0


class OffsetCheckpoint:
    """Writes are serialised and monotonic; safe to call from a flush worker thread. A
    subclass names its file (FILE_NAME)."""

    FILE_NAME: ClassVar[str]

    def __init__(self, directory: Path, written: int) -> None:
        self.path = directory / self.FILE_NAME
        self._lock = threading.Lock()
        self._written = written
        self._closed = False

    @classmethod
    def read(cls, directory: Path) -> int:
        """The stored offset, or 0 when missing or unreadable (what 0 means is the caller's:
        scan everything, or the first segment's base)."""
        path = directory / cls.FILE_NAME
        try:
            fields = path.read_text(encoding="ascii").split()
            if len(fields) == 2 and int(fields[0]) == _VERSION and int(fields[1]) >= 0:
                return int(fields[1])
        except FileNotFoundError:
            return 0
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            logger.warning("ignoring unreadable %s: %s", path, exc)
            return 0
        logger.warning("ignoring malformed %s", path)
        return 0

    @property
    def written(self) -> int:
        return self._written

    def advance(self, offset: int, directory: FileHandle) -> None:
        """Durably record `offset` if it is beyond what is recorded; no-op once closed."""
        with self._lock:
            if self._closed or offset <= self._written:
                return
            tmp = self.path.with_name(self.path.name + ".tmp")
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            with file_handles().transient(tmp, flags) as fd:
                os.write(fd, f"{_VERSION}\n{offset}\n".encode("ascii"))
                os.fsync(fd)
            os.replace(tmp, self.path)
            directory.fsync()
            self._written = offset

    def store(self, offset: int, directory: FileHandle) -> None:
        """Durably record `offset` even if lower (at open, to match the segments found)."""
        with self._lock:
            self._written = -1
        self.advance(offset, directory)

    def close(self) -> None:
        """Stop writing (the log is closing or being deleted); waits for a write under way."""
        with self._lock:
            self._closed = True
