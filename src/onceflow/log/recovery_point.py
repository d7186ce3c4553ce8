"""The recovery point checkpoint: below which base offset every segment is known on disk.

After an unclean stop only segments from the recovery point on are CRC-scanned (Kafka's
recovery-point-offset-checkpoint, kept per partition here). A stale value only means more
scanning, so it is advanced at most once per roll, by the flush that made a rolled segment
durable, and written atomically (temp file, fsync, rename, directory fsync).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from onceflow.log.file_handles import FileHandle, file_handles

logger = logging.getLogger(__name__)

RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
_VERSION = 0


class RecoveryPointFile:
    """Writes are serialised and monotonic; safe to call from a flush worker thread."""

    def __init__(self, directory: Path, written: int) -> None:
        self.path = directory / RECOVERY_POINT_FILE
        self._lock = threading.Lock()
        self._written = written
        self._closed = False

    @staticmethod
    def read(directory: Path) -> int:
        """The stored recovery point, or 0 (scan everything) when missing or unreadable."""
        path = directory / RECOVERY_POINT_FILE
        try:
            lines = path.read_text(encoding="ascii").split()
            if len(lines) == 2 and int(lines[0]) == _VERSION and int(lines[1]) >= 0:
                return int(lines[1])
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
