"""Flush tickets: what one fsync round must make durable, runnable on a worker thread.

The owning thread prepares a ticket (duplicating the descriptors to sync, so that rolls,
retention and close may go on meanwhile), a worker runs it, and the owning thread
completes it, which advances the log's flushed offset. This is the unit of group commit:
every append before prepare_flush() is covered by one run().
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from onceflow.log.errors import LogStorageError
from onceflow.log.recovery_point import RecoveryPointFile

if TYPE_CHECKING:
    from onceflow.log.segment import Segment

_sync_data = getattr(os, "fdatasync", os.fsync)  # size changes are included; mtime is not needed


class FlushTicket:
    """One flush: fsync these files, then the directory, then advance the recovery point."""

    def __init__(
        self,
        *,
        offset: int,
        fds: list[int],
        dir_fd: int | None,
        dir_generation: int,
        finalized: Sequence[Segment],
        recovery_point: int | None,
        recovery_point_file: RecoveryPointFile,
    ) -> None:
        self.offset = offset  # the log's flushed_offset once this ticket is completed
        self.dir_generation = dir_generation
        self.finalized = tuple(finalized)  # rolled segments made wholly durable by this run
        self._fds = fds
        self._dir_fd = dir_fd
        self._recovery_point = recovery_point
        self._recovery_point_file = recovery_point_file
        self._done = False
        self._failed = False

    @property
    def done(self) -> bool:
        """run() completed: everything the ticket covers is on disk."""
        return self._done

    @property
    def failed(self) -> bool:
        """run() raised: nothing can be assumed about the files it covers."""
        return self._failed

    def run(self) -> None:
        """fsync everything the ticket covers. Thread-safe with respect to the owning log.

        Raises LogStorageError when the disk refuses; the ticket is then spent and the data
        stays dirty, so the next prepare_flush() covers it again.
        """
        try:
            for fd in self._fds:
                _sync_data(fd)
            if self._dir_fd is not None:
                os.fsync(self._dir_fd)
                if self._recovery_point is not None:
                    self._recovery_point_file.advance(self._recovery_point, self._dir_fd)
            self._done = True
        except OSError as exc:
            self._failed = True
            raise LogStorageError(f"flush failed: {exc}") from exc
        finally:
            self.close()

    def close(self) -> None:
        """Release the duplicated descriptors (idempotent; run() does it itself)."""
        fds, self._fds = self._fds, []
        if self._dir_fd is not None:
            fds.append(self._dir_fd)
            self._dir_fd = None
        for fd in fds:
            os.close(fd)
