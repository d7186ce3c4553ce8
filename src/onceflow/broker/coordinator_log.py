"""An internal log written by a coordinator (`__consumer_offsets`, `__transaction_state`).

Coordinators follow Kafka's coordinator runtime: a handler returns records; they are appended
here and made durable, and only then replayed into the coordinator's state. Loading after a
restart replays the same records, so recovery is not a second code path.

Kafka keeps these logs small by compaction (the last record per key). A coordinator log here
is instead rewritten at start, once loaded, when it holds many more records than the state
they replay to: the coordinator writes its state out as records (`rewrite`), so the next load
replays those alone.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from onceflow.broker.durability import GroupCommitter
from onceflow.clock import Clock
from onceflow.log.config import LogConfig
from onceflow.log.partition_log import PartitionLog, fsync_dir
from onceflow.records.batch import iter_batches
from onceflow.records.builder import build_batch
from onceflow.records.control import build_marker
from onceflow.records.record import DecodedBatch, iter_decoded_batches

log = logging.getLogger(__name__)

KeyValue = tuple[bytes, bytes | None]
# Records to write together, and the producer id of the open transaction they belong to (None:
# plain records); its marker, written later, then still applies to them.
StateBatch = tuple[Sequence[KeyValue], int | None]

# Internal logs keep everything until they are rewritten: their state is the replay of it all.
INTERNAL_LOG_CONFIG = LogConfig(retention_ms=-1, retention_bytes=-1, segment_bytes=64 << 20)
RECORDS_PER_BATCH = 1000  # a rewrite's batches
REWRITE_MIN_RECORDS = 10_000


def should_rewrite(replayed: int, state_records: int) -> bool:
    """Whether a log whose `replayed` records load to `state_records` is worth rewriting:
    over twice what the state needs, and not small."""
    return replayed >= REWRITE_MIN_RECORDS and replayed > 2 * state_records


class CoordinatorLog:
    def __init__(self, directory: Path, committer: GroupCommitter, clock: Clock) -> None:
        _finish_rewrite(directory)
        self.log = PartitionLog.open(directory, INTERNAL_LOG_CONFIG, clock)
        self.committer = committer
        self.clock = clock

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
        self.log.append(data, list(iter_batches(data, verify_crc=False)))

    def append_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> None:
        data = build_marker(producer_id, producer_epoch, commit, coordinator_epoch, self.clock())
        self.log.append(data, list(iter_batches(data, verify_crc=False)))

    async def durable(self) -> None:
        await self.committer.wait_durable([self.log])

    def batches(self) -> Iterator[DecodedBatch]:
        """Every batch from the start of the log, decoded, for loading."""
        for data in self.log.read_batches_bytes(self.log.log_start_offset):
            yield from iter_decoded_batches(data)

    def rewrite_if_large(self, replayed: int, state: Callable[[], Sequence[StateBatch]]) -> None:
        """After a load that replayed `replayed` records: rewrite the log as `state()` when
        should_rewrite says so (the state is only written out for a log that may qualify)."""
        if replayed < REWRITE_MIN_RECORDS:
            return
        batches = state()
        kept = sum(len(records) for records, _ in batches)
        if should_rewrite(replayed, kept):
            name = self.log.directory.name
            log.info("rewriting %s: %d records replay to %d", name, replayed, kept)
            self.rewrite(batches)

    def rewrite(self, batches: Iterable[StateBatch]) -> None:
        """Replace the whole log by `batches` (its coordinator's state written out), while
        nothing else is being written to it. The new log is complete and durable before it
        takes the old one's place, so a crash at any step leaves one of the two whole."""
        directory = self.log.directory
        fresh_dir, old_dir = _rewrite_dirs(directory)
        shutil.rmtree(fresh_dir, ignore_errors=True)
        fresh = PartitionLog.open(fresh_dir, INTERNAL_LOG_CONFIG, self.clock)
        now = self.clock()
        for records, producer_id in batches:
            for start in range(0, len(records), RECORDS_PER_BATCH):
                data = build_batch(
                    [(k, v, (), now) for k, v in records[start : start + RECORDS_PER_BATCH]],
                    producer_id=-1 if producer_id is None else producer_id,
                    producer_epoch=-1 if producer_id is None else 0,
                    transactional=producer_id is not None,
                )
                fresh.append(data, list(iter_batches(data, verify_crc=False)))
        fresh.close()  # flushes every file, then marks the log cleanly closed
        self.log.close()
        os.rename(directory, old_dir)  # from here on, _finish_rewrite completes the swap
        os.rename(fresh_dir, directory)
        fsync_dir(directory.parent)
        shutil.rmtree(old_dir)
        self.log = PartitionLog.open(directory, INTERNAL_LOG_CONFIG, self.clock)

    def close(self) -> None:
        self.log.close()


def _rewrite_dirs(directory: Path) -> tuple[Path, Path]:
    return directory.with_name(directory.name + ".rewritten"), directory.with_name(
        directory.name + ".replaced"
    )


def _finish_rewrite(directory: Path) -> None:
    """After a crash during `rewrite`: the new log replaces the old one once the old one was
    moved aside (it was complete by then); before that, the old one stays."""
    fresh_dir, old_dir = _rewrite_dirs(directory)
    if not directory.exists() and old_dir.exists() and fresh_dir.exists():
        os.rename(fresh_dir, directory)
        fsync_dir(directory.parent)
    shutil.rmtree(fresh_dir, ignore_errors=True)
    shutil.rmtree(old_dir, ignore_errors=True)
