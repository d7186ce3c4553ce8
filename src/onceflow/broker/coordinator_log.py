"""An internal log written by a coordinator (`__consumer_offsets`, `__transaction_state`).

Coordinators follow Kafka's coordinator runtime: a handler returns records; they are appended
here and made durable, and only then replayed into the coordinator's state. Loading after a
restart replays the same records, so recovery is not a second code path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from onceflow.broker.durability import GroupCommitter
from onceflow.clock import Clock
from onceflow.log.config import LogConfig
from onceflow.log.partition_log import PartitionLog
from onceflow.records.batch import iter_batches
from onceflow.records.builder import build_batch
from onceflow.records.control import build_marker
from onceflow.records.record import DecodedBatch, iter_decoded_batches

KeyValue = tuple[bytes, bytes | None]

# Internal logs keep everything: their state is the replay of all of it (no compaction yet).
INTERNAL_LOG_CONFIG = LogConfig(retention_ms=-1, retention_bytes=-1, segment_bytes=64 << 20)


class CoordinatorLog:
    def __init__(self, directory: Path, committer: GroupCommitter, clock: Clock) -> None:
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

    def close(self) -> None:
        self.log.close()
