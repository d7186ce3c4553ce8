"""An internal log written by a coordinator (`__consumer_offsets`, `__transaction_state`).

Coordinators follow Kafka's coordinator runtime: a handler returns records; they are appended
here and made durable, and only then replayed into the coordinator's state. Loading after a
restart replays the same records, so recovery is not a second code path.

As in Kafka, both logs are `cleanup.policy=compact` topics (keys are the coordinator record
keys, a None value is a tombstone) and the broker's log cleaner compacts them while it runs, so
a load replays about the live state plus the active segment, not every record ever written.
Each log is therefore a partition (the broker opens it and hands it here): its producer state
and aborted-transaction index are what the cleaner's transaction rules need (the offsets log
holds TxnOffsetCommit batches and their markers), and its segments roll at
`offsets.topic.segment.bytes` / `transaction.state.log.segment.bytes` so that there are closed
segments to clean.

A compacted log replays to the state of the whole log: for each key the cleaner keeps the last
record below its clean point and every record after it, a suffix of that key's history, so
every transition replayed is one the coordinator made; aborted transactional records go, which
their ABORT marker would have dropped anyway.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

from onceflow.clock import Clock
from onceflow.log.partition_log import PartitionLog, fsync_dir
from onceflow.records.batch import BatchHeader, iter_batches
from onceflow.records.builder import build_batch
from onceflow.records.control import build_marker
from onceflow.records.record import DecodedBatch, iter_decoded_batches

log = logging.getLogger(__name__)

KeyValue = tuple[bytes, bytes | None]


def internal_log_configs(segment_bytes: int) -> dict[str, str]:
    """The topic configs Kafka creates an internal topic with (the broker's defaults for the
    rest: min.cleanable.dirty.ratio, delete.retention.ms, the compaction lags)."""
    return {"cleanup.policy": "compact", "segment.bytes": str(segment_bytes)}


class InternalPartition(Protocol):
    """The partition an internal log is written to, as the broker opened it."""

    @property
    def log(self) -> PartitionLog: ...

    def after_append(self, headers: list[BatchHeader]) -> None:
        """Record the appended batches in the producer state."""
        ...

    def append_coordinator_marker(self, data: bytes, commit: bool, coordinator_epoch: int) -> None:
        """Append a marker the transaction coordinator decided, without producer checks."""
        ...

    def close(self) -> None: ...


class InternalLog:
    """A coordinator's log as the broker writes it (the runtime's `CoordinatorLog` is the
    interface the runtime appends through; coordinators.py adapts this class to it)."""

    def __init__(self, partition: InternalPartition, clock: Clock) -> None:
        self.partition = partition
        self.clock = clock

    @property
    def log(self) -> PartitionLog:
        return self.partition.log

    def append(
        self,
        records: Sequence[KeyValue],
        *,
        producer_id: int = -1,
        producer_epoch: int = -1,
        transactional: bool = False,
    ) -> None:
        if not records:
            return
        now = self.clock()
        data = build_batch(
            [(key, value, (), now) for key, value in records],
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            transactional=transactional,
        )
        info = self.log.append(data, list(iter_batches(data, verify_crc=False)))
        self.partition.after_append([h for _, h in info.headers])

    def append_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> None:
        data = build_marker(producer_id, producer_epoch, commit, coordinator_epoch, self.clock())
        self.partition.append_coordinator_marker(data, commit, coordinator_epoch)

    def batches(self) -> Iterator[DecodedBatch]:
        """Every batch from the start of the log, decoded, for loading."""
        for data in self.log.read_batches_bytes(self.log.log_start_offset):
            yield from iter_decoded_batches(data)

    def close(self) -> None:
        self.partition.close()


def finish_legacy_rewrite(directory: Path) -> None:
    """A data directory of an older broker, which rewrote these logs at start into
    `<dir>.rewritten` and swapped it in through `<dir>.replaced`: after a crash in between, the
    new log replaces the old one once the old one was moved aside (it was complete by then);
    before that, the old one stays. Either way no such directory is left."""
    fresh_dir = directory.with_name(directory.name + ".rewritten")
    old_dir = directory.with_name(directory.name + ".replaced")
    if not directory.exists() and old_dir.exists() and fresh_dir.exists():
        os.rename(fresh_dir, directory)
        fsync_dir(directory.parent)
    if fresh_dir.exists() or old_dir.exists():
        log.info("removing what an interrupted rewrite of %s left", directory.name)
    shutil.rmtree(fresh_dir, ignore_errors=True)
    shutil.rmtree(old_dir, ignore_errors=True)
