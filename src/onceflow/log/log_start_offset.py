"""The log start offset checkpoint: where DeleteRecords moved a partition's log start offset.

Kafka keeps it in log-start-offset-checkpoint (one per data directory, written periodically);
here one per partition, written before DeleteRecords is answered, so an acknowledged deletion
survives kill -9. Written atomically (temp file, fsync, rename, directory fsync); monotonic.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from onceflow.log.file_handles import FileHandle, file_handles

logger = logging.getLogger(__name__)

LOG_START_OFFSET_FILE = "log-start-offset-checkpoint"
_VERSION = 0


class LogStartOffsetFile:
    """Writes are serialised and never move the stored offset back; safe from a thread."""

    def __init__(self, directory: Path, written: int) -> None:
        self.path = directory / LOG_START_OFFSET_FILE
        self._lock = threading.Lock()
        self._written = written

    @staticmethod
    def read(directory: Path) -> int:
        """The stored log start offset, or 0 (none: the first segment's base) when missing or
        unreadable."""
        path = directory / LOG_START_OFFSET_FILE
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

    def advance(self, offset: int, directory: FileHandle) -> None:
        """Durably record `offset` if it is beyond what is recorded."""
        with self._lock:
            if offset <= self._written:
                return
            tmp = self.path.with_name(self.path.name + ".tmp")
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            with file_handles().transient(tmp, flags) as fd:
                os.write(fd, f"{_VERSION}\n{offset}\n".encode("ascii"))
                os.fsync(fd)
            os.replace(tmp, self.path)
            directory.fsync()
            self._written = offset
