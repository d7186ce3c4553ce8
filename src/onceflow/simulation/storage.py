"""Simulated durable logs: what a crash keeps, and what the broker glue sees of a log.

`SimulatedLog` holds a partition's batches in memory with the subset of PartitionLog's API that
the broker's glue (`broker.partition.Partition`, the coordinator logs) uses: append, read up to
a bound, iterate headers and batch bytes from an offset, a flushed offset that a group-commit
round advances, and segment rolls (which make `Partition` snapshot its producer state).

Durability is Kafka's contract: everything below `flushed_offset` survives a crash; of the tail
above it, a crash keeps some prefix (power loss may or may not have written it), never a hole.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from onceflow.log.config import LogConfig
from onceflow.log.errors import OffsetOutOfRangeError
from onceflow.log.partition_log import AppendInfo, ReadResult, assign_offsets
from onceflow.records.batch import BatchHeader
from onceflow.records.record import DecodedBatch, decode_batch


@dataclass
class StoredBatch:
    """One batch as the log holds it: header with its offsets, the bytes, decoded on demand."""

    header: BatchHeader
    data: bytes
    _decoded: DecodedBatch | None = field(default=None, repr=False)

    @property
    def decoded(self) -> DecodedBatch:
        if self._decoded is None:
            self._decoded = decode_batch(self.data, verify_crc=False)
        return self._decoded


class SimulatedLog:
    """One partition's log in memory; `segment_batches` batches per segment."""

    def __init__(
        self, directory: Path, *, segment_batches: int = 8, config: LogConfig | None = None
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config = config or LogConfig()
        self.segment_batches = segment_batches
        self.batches: list[StoredBatch] = []
        self._bases: list[int] = []  # base offset of each stored batch, for bisect
        self._segment_bases = [0]
        self._in_segment = 0
        self.log_start_offset = 0
        self._flushed = 0
        self._ticket: int | None = None
        self.on_flushed: Callable[[], None] | None = None  # as PartitionLog.on_flushed

    # -- PartitionLog's API, as the broker glue uses it -----------------------------------

    @property
    def log_end_offset(self) -> int:
        return self.batches[-1].header.next_offset if self.batches else self.log_start_offset

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    @property
    def segment_base_offsets(self) -> list[int]:
        return list(self._segment_bases)

    def append(
        self,
        data: bytes | bytearray | memoryview,
        headers: list[tuple[int, BatchHeader]],
        *,
        leader_epoch: int = 0,
    ) -> AppendInfo:
        if self._in_segment >= self.segment_batches:
            # Roll before the append, as PartitionLog does when the active segment is full.
            self._segment_bases.append(self.log_end_offset)
            self._in_segment = 0
        first = self.log_end_offset
        # LogAppendTime is not simulated: batches keep the timestamps they were sent with.
        buf, assigned = assign_offsets(data, headers, first, leader_epoch=leader_epoch)
        for position, stored in assigned:
            self.batches.append(StoredBatch(stored, bytes(buf[position : position + stored.size])))
            self._bases.append(stored.base_offset)
        self._in_segment += 1
        return AppendInfo(
            first_offset=first,
            last_offset=self.log_end_offset - 1,
            log_append_time=-1,
            log_start_offset=self.log_start_offset,
            headers=assigned,
        )

    def read(
        self, start_offset: int, max_bytes: int, *, max_offset: int | None = None
    ) -> ReadResult:
        end = self.log_end_offset
        if start_offset < self.log_start_offset or start_offset > end:
            raise OffsetOutOfRangeError(start_offset, self.log_start_offset, end)
        bound = end if max_offset is None else min(max_offset, end)
        chunks: list[bytes] = []
        size = 0
        next_offset = start_offset
        for stored in self._from(start_offset):
            if stored.header.base_offset >= bound:
                break
            if chunks and size + len(stored.data) > max_bytes:
                break
            chunks.append(stored.data)
            size += len(stored.data)
            next_offset = stored.header.next_offset
        return ReadResult(b"".join(chunks), next_offset)

    def iter_batch_headers(self, from_offset: int = 0) -> Iterator[BatchHeader]:
        for stored in self._from(from_offset):
            yield stored.header

    def read_batches_bytes(self, from_offset: int = 0) -> Iterator[bytes]:
        for stored in self._from(from_offset):
            yield stored.data

    def iter_stored(self, from_offset: int = 0) -> Iterator[StoredBatch]:
        yield from self._from(from_offset)

    def close(self) -> None:
        """Nothing to release; a clean close of the simulated broker never happens."""

    def _from(self, offset: int) -> list[StoredBatch]:
        # the batch containing `offset`, and every later one
        i = max(bisect.bisect_right(self._bases, offset) - 1, 0)
        if i < len(self.batches) and self.batches[i].header.next_offset <= offset:
            i += 1
        return self.batches[i:]

    # -- group commit --------------------------------------------------------------------

    @property
    def dirty(self) -> bool:
        return self.log_end_offset > self._flushed

    def prepare_flush(self) -> int:
        """Start an fsync round: it covers what is appended now, not what comes after."""
        self._ticket = self.log_end_offset
        return self._ticket

    def complete_flush(self, offset: int) -> None:
        moved = offset > self._flushed
        self._flushed = max(self._flushed, offset)
        if moved and self.on_flushed is not None:
            self.on_flushed()

    # -- crashes -------------------------------------------------------------------------

    def crash(self, keep_offset: int) -> None:
        """Lose every batch at or after `keep_offset` (never below the flushed offset); what is
        left is all on disk after the restart."""
        if keep_offset < self._flushed:
            raise ValueError(f"a crash cannot lose flushed data below {self._flushed}")
        i = bisect.bisect_left(self._bases, keep_offset)
        del self.batches[i:]
        del self._bases[i:]
        end = self.log_end_offset
        self._segment_bases = [b for b in self._segment_bases if b <= end] or [0]
        # Recovery reopens the last segment as the active one; it rolls when full again.
        last_base = self._segment_bases[-1]
        self._in_segment = sum(1 for b in self._bases if b >= last_base)
        self._flushed = end
        self._ticket = None

    def kept_offsets(self) -> list[int]:
        """Every offset a crash may keep up to: the flushed offset, then each batch end."""
        return [self._flushed] + [
            b.header.next_offset for b in self.batches if b.header.next_offset > self._flushed
        ]
