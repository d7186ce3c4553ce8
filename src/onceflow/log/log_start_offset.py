"""The log start offset checkpoint: where DeleteRecords moved a partition's log start offset.

Kafka keeps it in log-start-offset-checkpoint (one per data directory, written periodically);
here one per partition, written before DeleteRecords is answered, so an acknowledged deletion
survives kill -9. Written atomically (temp file, fsync, rename, directory fsync); monotonic.
"""

from __future__ import annotations

from onceflow.log.offset_checkpoint import OffsetCheckpoint

LOG_START_OFFSET_FILE = "log-start-offset-checkpoint"


class LogStartOffsetFile(OffsetCheckpoint):
    """0 when missing: no deletion, the first segment's base."""

    FILE_NAME = LOG_START_OFFSET_FILE
