"""The recovery point checkpoint: below which base offset every segment is known on disk.

After an unclean stop only segments from the recovery point on are CRC-scanned (Kafka's
recovery-point-offset-checkpoint, kept per partition here). A stale value only means more
scanning, so it is advanced at most once per roll, by the flush that made a rolled segment
durable, and written atomically (temp file, fsync, rename, directory fsync).
"""

from __future__ import annotations

from onceflow.log.offset_checkpoint import OffsetCheckpoint

RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"


class RecoveryPointFile(OffsetCheckpoint):
    """0 when missing: scan everything."""

    FILE_NAME = RECOVERY_POINT_FILE
