"""Flush tickets: what one fsync round must make durable, runnable on a worker thread.

The owning thread prepares a ticket (the file handles to sync: a worker pins each in turn,
reopening it by path if the descriptor cache evicted it, so that rolls, retention and close
may go on meanwhile), a worker runs it, and the owning thread completes it, which advances
the log's flushed offset. This is the unit of group commit:
every append before prepare_flush() is covered by one run().
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from onceflow.log.errors import DescriptorsExhaustedError, LogStorageError
from onceflow.log.file_handles import FileHandle
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
        files: list[FileHandle],
        directory: FileHandle | None,
        dir_generation: int,
        finalized: Sequence[Segment],
        recovery_point: int | None,
        recovery_point_file: RecoveryPointFile,
    ) -> None:
        self.offset = offset  # the log's flushed_offset once this ticket is completed
        self.dir_generation = dir_generation
        self.syncs_directory = directory is not None
        self.finalized = tuple(finalized)  # rolled segments made wholly durable by this run
        self._files = files
        self._directory = directory
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
        stays dirty, so the next prepare_flush() covers it again. Raises
        DescriptorsExhaustedError (no fsync failed: the broker need not halt) when a file
        could not be reopened; the ticket is then spent and refused by complete_flush too,
        and the next one covers its files again.
        """
        try:
            for file in self._files:
                file.fsync(_sync_data)
            if self._directory is not None:
                self._directory.fsync()
                if self._recovery_point is not None:
                    self._recovery_point_file.advance(self._recovery_point, self._directory)
            self._done = True
        except OSError as exc:
            self._failed = True
            raise LogStorageError(f"flush failed: {exc}") from exc
        except DescriptorsExhaustedError:
            self._failed = True  # refused by complete_flush: this data is not durable yet
            raise
        finally:
            self.close()

    def close(self) -> None:
        """Drop the handles (idempotent; run() does it itself). They belong to the log."""
        self._files = []
        self._directory = None
