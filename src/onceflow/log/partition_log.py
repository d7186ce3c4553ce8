"""One partition's durable log: a directory of segments, appended to and read by offset.

Layout, as in Kafka: `{base_offset:020d}.log` segments of raw RecordBatch bytes (only the base
offset and partition leader epoch are rewritten, both outside the CRC; LogAppendTime topics
also get the max timestamp set and the CRC recomputed), each with a sparse `.index` and
`.timeindex`; plus `recovery-point-offset-checkpoint` and, after a clean close, a marker.

Single-threaded by design: one owning thread calls everything except FlushTicket.run(),
which a worker thread may run while the owner keeps appending (group commit).
"""

from __future__ import annotations

import bisect
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from onceflow.clock import Clock, system_clock
from onceflow.log.config import LogConfig
from onceflow.log.errors import (
    LogClosedError,
    LogStorageError,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
    SegmentsChangedError,
)
from onceflow.log.file_handles import FileHandle, file_handles
from onceflow.log.flush import FlushTicket
from onceflow.log.log_start_offset import LogStartOffsetFile
from onceflow.log.recovery import (
    load_segments,
    remove_clean_shutdown_marker,
    write_clean_shutdown_marker,
)
from onceflow.log.recovery_point import RecoveryPointFile
from onceflow.log.segment import Segment
from onceflow.log.swap import Crash, no_crash, swap_in
from onceflow.log.sync_barrier import SyncBarrier
from onceflow.records.batch import (
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    set_attributes,
    set_base_offset,
    set_crc,
    set_max_timestamp,
    set_partition_leader_epoch,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AppendInfo:
    first_offset: int
    last_offset: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    headers: list[tuple[int, BatchHeader]]  # positions in the appended data, offsets assigned


@dataclass(frozen=True, slots=True)
class ReadResult:
    data: bytes  # whole batches, possibly empty
    next_offset: int  # the offset to read next (start_offset when data is empty)


def assign_offsets(
    data: bytes | bytearray | memoryview,
    headers: list[tuple[int, BatchHeader]],
    first_offset: int,
    *,
    leader_epoch: int,
    append_time: int | None = None,
) -> tuple[bytearray, list[tuple[int, BatchHeader]]]:
    """The batches as the log stores them: consecutive offsets from `first_offset`, the leader
    epoch, and with `append_time` the LogAppendTime type and timestamp (so a new CRC).

    Returns the rewritten bytes and each batch's (position, header) with those values; shared
    by every log that assigns offsets, so they all store what Kafka's log stores.
    """
    buf = bytearray(data)
    assigned: list[tuple[int, BatchHeader]] = []
    offset = first_offset
    for position, header in headers:
        set_base_offset(buf, position, offset)
        set_partition_leader_epoch(buf, position, leader_epoch)
        if append_time is not None:
            attributes = header.attributes | TIMESTAMP_TYPE_MASK
            set_attributes(buf, position, attributes)
            set_max_timestamp(buf, position, append_time)
            crc = set_crc(buf, position, header.size)
            header = replace(header, attributes=attributes, max_timestamp=append_time, crc=crc)
        assigned.append((position, header.placed(offset, leader_epoch)))
        offset += header.last_offset_delta + 1
    return buf, assigned


class PartitionLog:
    """A partition's segments; see the module docstring for the threading contract."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        clock: Clock,
        segments: list[Segment],
        directory_file: FileHandle,
        recovery_point_file: RecoveryPointFile,
    ) -> None:
        self.directory = directory
        self.config = config  # may be replaced (AlterConfigs); read at each append and roll
        self._clock = clock
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._dir_file = directory_file  # for fsyncs of the directory; opened on demand
        self._recovery_point_file = recovery_point_file
        self.log_start_offset = segments[0].base_offset
        # DeleteRecords may have moved it past the first segment's base (never past the end:
        # without fsync the records it was moved over may be lost).
        stored_start = LogStartOffsetFile.read(directory)
        self._log_start_offset_file = LogStartOffsetFile(directory, stored_start)
        if stored_start > self.log_start_offset:
            self.log_start_offset = min(stored_start, self.log_end_offset)
        self._flushed_offset = self.log_end_offset
        # Called each time flushed_offset (the high watermark) moves: the partition holding
        # this log updates its producer state and wakes its readers there, and only there.
        self.on_flushed: Callable[[], None] | None = None
        self._unsynced_rolled: list[Segment] = []  # rolled, not yet wholly fsynced
        self._waived_rolled: list[Segment] = []  # rolled, sync waived (no-fsync mode)
        self._dir_generation = 0  # bumped when segment files are created or deleted
        self._dir_synced_generation = 0
        # A new log's directory: synced by its first flush, with its first records (open()).
        self._new_dir_unsynced = False
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig,
        clock: Clock = system_clock,
        *,
        sync_parent: bool = True,
        barrier: SyncBarrier | None = None,
    ) -> PartitionLog:
        """Open (creating it if new) and, after an unclean stop, recover the log.

        `sync_parent=False`: the caller fsyncs the parent directory itself once it has made
        many new logs (CreateTopics), before it records them anywhere. With a `barrier`, the
        fsyncs nothing else here waits for (the recovered active segment's log, the removed
        clean-shutdown marker) are owed to it: the caller syncs it before serving or appending.
        """
        directory = Path(directory)
        is_new = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        dir_file = file_handles().handle(directory, os.O_RDONLY | os.O_DIRECTORY)
        segments: list[Segment] = []
        try:
            loaded = load_segments(directory, config, clock())
            segments = loaded.segments
            # Make what recovery rewrote durable before anything new is appended after it.
            # The active segment's indexes are never trusted after a crash (recovery rebuilds
            # them), so only its log is synced: 1 fsync a partition instead of 4 after kill -9.
            rolled_recovered = False
            for segment in loaded.recovered:
                if segment is not segments[-1]:
                    _sync_segment(segment)
                    segment.close_index_files()
                    rolled_recovered = True
                elif barrier is None:
                    segment.log_file.fsync()
                else:
                    barrier.defer(segment.log_file)
            if is_new and sync_parent:
                fsync_dir(directory.parent)
            # A new log's own directory is synced by its first flush, with its first records
            # (until then a crash loses only empty files, which open() makes again): a
            # CreateTopics of 10,000 partitions then costs no fsync a partition.
            if not is_new and (loaded.files_changed or rolled_recovered):
                dir_file.fsync()
            stored = RecoveryPointFile.read(directory)
            recovery_point_file = RecoveryPointFile(directory, stored)
            active_base = segments[-1].base_offset
            if stored > active_base or (stored < active_base and len(segments) > 1):
                recovery_point_file.store(active_base, dir_file)
            if loaded.clean:
                remove_clean_shutdown_marker(directory, dir_file, barrier)
        except BaseException:
            for segment in segments:
                segment.close()
            dir_file.close()
            raise
        log = cls(directory, config, clock, segments, dir_file, recovery_point_file)
        log._new_dir_unsynced = is_new  # its segment files' entries are not durable yet
        return log

    def close(self, barrier: SyncBarrier | None = None) -> None:
        """Clean shutdown: flush everything, then leave the marker that lets open() skip
        the recovery scan (durable at once, or when the caller syncs `barrier`)."""
        if self._closed:
            return
        try:
            self._segments[-1].on_become_inactive()
            ticket = self._prepare_flush(include_active_indexes=True)
            if ticket is not None:
                ticket.run()
                self.complete_flush(ticket)
            write_clean_shutdown_marker(self.directory, self._dir_file, barrier)
        except OSError as exc:
            raise LogStorageError(f"clean close of {self.directory} failed: {exc}") from exc
        finally:
            self._release()

    def delete(self) -> None:
        """DeleteTopics: close without flushing and remove the directory."""
        if not self._closed:
            self._release()
        shutil.rmtree(self.directory, ignore_errors=False)

    def _release(self) -> None:
        self._closed = True
        self._recovery_point_file.close()
        for segment in self._segments:
            segment.close()
        self._dir_file.close()

    def _abandon(self) -> None:
        """Drop every descriptor without flushing or marking: a crash, for tests."""
        if not self._closed:
            self._release()

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self.directory} is closed")

    # -- state --------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        """The next offset to assign."""
        return self._segments[-1].next_offset

    @property
    def flushed_offset(self) -> int:
        """Every offset below it is on disk."""
        return self._flushed_offset

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        return list(self._bases)

    # -- appends ------------------------------------------------------------------------

    def append(
        self,
        data: bytes | bytearray | memoryview,
        headers: list[tuple[int, BatchHeader]],
        *,
        leader_epoch: int = 0,
    ) -> AppendInfo:
        """Append already-validated batches; `headers` are their (position, header) pairs."""
        self._check_open()
        if not headers:
            raise ValueError("append needs at least one batch")
        expected = 0
        for position, header in headers:
            if position != expected:
                raise ValueError(f"batch at {position} does not follow the previous one")
            expected += header.size
        if expected != len(data):
            raise ValueError(f"batches cover {expected} of {len(data)} bytes")
        config = self.config
        if len(data) > config.segment_bytes:
            raise RecordBatchTooLargeError(
                f"{len(data)} bytes exceed segment.bytes={config.segment_bytes}"
            )
        now = self._clock()
        log_append_time = config.log_append_time
        first_offset = self.log_end_offset
        last_offset = first_offset + sum(h.last_offset_delta + 1 for _, h in headers) - 1
        max_timestamp = now if log_append_time else max(h.max_timestamp for _, h in headers)
        if self._segments[-1].should_roll(
            config,
            messages_size=len(data),
            max_timestamp=max_timestamp,
            last_offset=last_offset,
            now=now,
        ):
            self._roll(now)

        buf, assigned = assign_offsets(
            data,
            headers,
            first_offset,
            leader_epoch=leader_epoch,
            append_time=now if log_append_time else None,
        )
        self._segments[-1].append(buf, assigned, config)
        return AppendInfo(
            first_offset=first_offset,
            last_offset=last_offset,
            log_append_time=now if log_append_time else -1,
            log_start_offset=self.log_start_offset,
            headers=assigned,
        )

    def roll(self) -> None:
        """Start a new segment at the log end offset (no-op if the active one is empty)."""
        self._check_open()
        self._roll(self._clock())

    def _roll(self, now: int) -> None:
        active = self._segments[-1]
        if active.size == 0:
            return
        # Pinned first: writing the index entries kept in memory, the roll's last one
        # included, must not fail for want of a descriptor once the new segment exists.
        with active.offset_index.file.pinned(), active.time_index.file.pinned():
            try:
                segment = Segment.create(self.directory, active.next_offset, self.config, now)
            except OSError as exc:
                raise LogStorageError(
                    f"cannot create a segment in {self.directory}: {exc}"
                ) from exc
            active.on_become_inactive()
        self._unsynced_rolled.append(active)
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        self._dir_generation += 1

    # -- reads --------------------------------------------------------------------------

    def read(
        self, start_offset: int, max_bytes: int, *, max_offset: int | None = None
    ) -> ReadResult:
        """Whole batches from the one containing `start_offset`, at most `max_bytes` except
        that the first batch is always returned whole; only batches whose base offset is
        below `max_offset` (exclusive: high watermark or last stable offset)."""
        self._check_open()
        end = self.log_end_offset
        if start_offset < self.log_start_offset or start_offset > end:
            raise OffsetOutOfRangeError(start_offset, self.log_start_offset, end)
        bound = end if max_offset is None else min(max_offset, end)
        if start_offset >= bound:
            return ReadResult(b"", start_offset)
        i = bisect.bisect_right(self._bases, start_offset) - 1
        located = self._segments[i].translate_offset(start_offset)
        while located is None and i + 1 < len(self._segments):
            # past the segment's last batch (a gap compaction left at its end): the next one
            i += 1
            located = self._segments[i].translate_offset(start_offset)
        if located is None or located[1].base_offset >= bound:
            return ReadResult(b"", start_offset)
        position, first = located
        chunks: list[bytes] = []
        budget = max_bytes
        next_offset = start_offset
        min_size = first.size
        while True:
            data, segment_next, reached_end = self._segments[i].read_batches(
                position, budget, bound, min_size
            )
            if data:
                chunks.append(data)
                budget -= len(data)
                next_offset = segment_next if segment_next is not None else next_offset
            i += 1
            if not reached_end or budget <= 0 or i >= len(self._segments):
                break
            if next_offset >= bound:
                break
            position, min_size = 0, 0
        return ReadResult(chunks[0] if len(chunks) == 1 else b"".join(chunks), next_offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(base offset, max timestamp) of the first batch whose max timestamp is at least
        `timestamp_ms`, or None if there is none (ListOffsets by time)."""
        self._check_open()
        for segment in self._segments:
            found = segment.find_offset_by_timestamp(timestamp_ms)
            if found is not None:
                return found
        return None

    def max_timestamp_and_offset(self) -> tuple[int, int] | None:
        """(largest timestamp, last offset of the batch holding it) from the segments' own
        bookkeeping (Kafka's maxTimestampSoFar: no batch is read), the earliest segment winning
        a tie; None if no batch has a timestamp (ListOffsets MAX_TIMESTAMP)."""
        self._check_open()
        best: tuple[int, int] | None = None
        for segment in self._segments:
            if segment.offset_of_max_timestamp >= 0 and (
                best is None or segment.max_timestamp > best[0]
            ):
                best = (segment.max_timestamp, segment.offset_of_max_timestamp)
        return best

    def iter_batch_headers(self, from_offset: int = 0) -> Iterator[BatchHeader]:
        """Headers of the batches from the one containing `from_offset` (replay)."""
        for header, _ in self._iter_batches(from_offset, with_bytes=False):
            yield header

    def read_batches_bytes(self, from_offset: int = 0) -> Iterator[bytes]:
        """Each whole batch from the one containing `from_offset` (replay)."""
        for _, data in self._iter_batches(from_offset, with_bytes=True):
            assert data is not None
            yield data

    def _iter_batches(
        self, from_offset: int, *, with_bytes: bool
    ) -> Iterator[tuple[BatchHeader, bytes | None]]:
        self._check_open()
        start = max(from_offset, self.log_start_offset)
        if start >= self.log_end_offset:
            return
        i = bisect.bisect_right(self._bases, start) - 1
        for segment in list(self._segments[i:]):
            yield from segment.iter_batches(start, with_bytes=with_bytes)

    # -- compaction ---------------------------------------------------------------------

    @property
    def segments(self) -> list[Segment]:
        """Every segment, the active one last (a copy: planning a clean)."""
        return list(self._segments)

    def segments_below(self, offset: int) -> list[Segment]:
        """The rolled segments starting below `offset` (never the active one): what a clean
        reads, from a worker thread; `replace_segments` checks they are still the log's."""
        self._check_open()
        return [s for s in self._segments[:-1] if s.base_offset < offset]

    def replace_segments(self, base: int, replaced: list[Segment], crash: Crash = no_crash) -> None:
        """Swap the synced `.cleaned` segment `base` in for `replaced` (consecutive rolled
        segments, the first at `base`), by the crash-safe protocol of swap.py; on the owning
        thread. Raises SegmentsChangedError (nothing renamed) when they are not the log's."""
        self._check_open()
        if not replaced or replaced[0].base_offset != base:
            raise ValueError(f"segment {base} must replace a run of segments starting at it")
        try:
            i = next(n for n, s in enumerate(self._segments) if s is replaced[0])
        except StopIteration:
            raise SegmentsChangedError(f"segment {base} of {self.directory} is gone") from None
        end = i + len(replaced)
        if self._segments[i:end] != replaced or end >= len(self._segments):
            raise SegmentsChangedError(f"segments from {base} of {self.directory} changed")
        next_base = self._segments[end].base_offset
        for segment in replaced:
            segment.close()  # descriptors of the old inodes: never used again
        try:
            swap_in(
                self.directory,
                base,
                [s.base_offset for s in replaced],
                self._dir_file.fsync,
                crash,
            )
            segment = Segment.open_existing(self.directory, base, self.config, self._clock())
            if not segment.load(self.config, next_base):
                segment.recover(self.config, next_base)
                _sync_segment(segment)
            segment.close_index_files()
        except OSError as exc:
            raise LogStorageError(f"swap of cleaned segment {base} failed: {exc}") from exc
        if segment.next_offset != next_base:
            raise LogStorageError(
                f"cleaned segment {base} ends at {segment.next_offset}, not at {next_base}"
            )
        self._segments[i:end] = [segment]
        self._bases = [s.base_offset for s in self._segments]
        for pending in (self._unsynced_rolled, self._waived_rolled):
            pending[:] = [s for s in pending if s not in replaced]

    # -- DeleteRecords ------------------------------------------------------------------

    def advance_log_start_offset(self, offset: int) -> bool:
        """DeleteRecords: nothing below `offset` is served from now on (the caller checked it
        is at most the high watermark); the segments wholly below it go at the next retention
        check, as in Kafka. False when it is not beyond the log start offset already."""
        self._check_open()
        if offset <= self.log_start_offset:
            return False
        self.log_start_offset = offset
        return True

    def store_log_start_offset(self) -> None:
        """Make the log start offset durable (it fsyncs: run it off the event loop)."""
        self._check_open()
        self._log_start_offset_file.advance(self.log_start_offset, self._dir_file)

    # -- retention ----------------------------------------------------------------------

    def delete_expired_segments(self, *, high_watermark: int | None = None) -> int:
        """Kafka's time then size retention, whole segments only, oldest first; returns how
        many segments were deleted. Nothing at or above `high_watermark` (default: the log
        end offset) is deleted. When every segment goes, the log rolls first, as Kafka does,
        so it always keeps an (empty) active segment at the log end offset."""
        self._check_open()
        config = self.config
        upper = self.log_end_offset if high_watermark is None else high_watermark
        now = self._clock()
        deleted = 0
        # Segments wholly below a log start offset DeleteRecords moved (Kafka's
        # deleteLogStartOffsetBreachedSegments).
        deleted += self._delete_oldest(
            lambda s: s.next_offset <= self.log_start_offset, upper, now, "DeleteRecords"
        )
        if not config.delete:
            # cleanup.policy without `delete` (Kafka's UnifiedLog.deleteOldSegments): retention
            # never applies; such a log is only ever shortened by the cleaner.
            return deleted
        if config.retention_ms >= 0:
            deleted += self._delete_oldest(
                lambda s: now - s.largest_timestamp() > config.retention_ms, upper, now
            )
        if config.retention_bytes >= 0:
            excess = self.size_in_bytes - config.retention_bytes

            def breaches_size(segment: Segment) -> bool:
                nonlocal excess
                if excess - segment.size < 0:
                    return False
                excess -= segment.size
                return True

            if excess >= 0:
                deleted += self._delete_oldest(breaches_size, upper, now)
        return deleted

    def _delete_oldest(
        self,
        predicate: Callable[[Segment], bool],
        upper_bound: int,
        now: int,
        reason: str = "retention",
    ) -> int:
        doomed: list[Segment] = []
        for i, segment in enumerate(self._segments):
            is_last = i + 1 == len(self._segments)
            if is_last and segment.size == 0:
                break
            segment_end = segment.next_offset
            if segment_end > upper_bound or not predicate(segment):
                break
            doomed.append(segment)
        if not doomed:
            return 0
        if len(doomed) == len(self._segments):
            self._roll(now)
        for segment in doomed:
            logger.info(
                "deleting segment %s (offsets %d..%d) by %s",
                segment.log_path,
                segment.base_offset,
                segment.next_offset - 1,
                reason,
            )
            self._segments.remove(segment)
            for pending in (self._unsynced_rolled, self._waived_rolled):
                if segment in pending:
                    pending.remove(segment)
            segment.delete_files()
        self._bases = [s.base_offset for s in self._segments]
        self.log_start_offset = max(self.log_start_offset, self._segments[0].base_offset)
        self._dir_generation += 1
        return len(doomed)

    # -- durability ---------------------------------------------------------------------

    def prepare_flush(self) -> FlushTicket | None:
        """What one fsync round must cover now; None when nothing is dirty."""
        self._check_open()
        return self._prepare_flush(include_active_indexes=False)

    def _prepare_flush(self, *, include_active_indexes: bool) -> FlushTicket | None:
        active = self._segments[-1]
        end = self.log_end_offset
        active_dirty = end > self._flushed_offset
        rolled = list(self._unsynced_rolled)
        waived_left = bool(self._waived_rolled)
        if include_active_indexes:
            rolled += self._waived_rolled  # a clean close syncs even what was waived
            waived_left = False
        # While waived segments are not on disk the recovery point must stay below them.
        recovery_point = active.base_offset if rolled and not waived_left else None
        dir_dirty = self._dir_generation > self._dir_synced_generation
        if not (active_dirty or rolled or dir_dirty or include_active_indexes):
            return None
        files: list[FileHandle] = []
        for segment in rolled:
            files.append(segment.log_file)
            files.extend(segment.index_files())
        if active_dirty or include_active_indexes:
            files.append(active.log_file)
        if include_active_indexes:
            files.extend(active.index_files())
        needs_dir = dir_dirty or bool(rolled) or self._new_dir_unsynced
        return FlushTicket(
            offset=end,
            files=files,
            directory=self._dir_file if needs_dir else None,
            dir_generation=self._dir_generation,
            finalized=rolled,
            recovery_point=recovery_point,
            recovery_point_file=self._recovery_point_file,
        )

    def complete_flush(self, ticket: FlushTicket) -> None:
        """Record a ticket on the owning thread: advances flushed_offset.

        Completing a ticket that never ran waives durability (a broker running without
        fsync): flushed_offset advances, but the recovery point does not, so recovery after
        a crash scans every segment written since. A ticket whose run() failed is refused.
        """
        ticket.close()
        if ticket.failed:
            raise LogStorageError("complete_flush() of a ticket whose run() failed")
        moved = ticket.offset > self._flushed_offset
        self._flushed_offset = max(self._flushed_offset, ticket.offset)
        self._dir_synced_generation = max(self._dir_synced_generation, ticket.dir_generation)
        if ticket.syncs_directory:
            self._new_dir_unsynced = False
        for segment in ticket.finalized:
            if segment in self._unsynced_rolled:
                self._unsynced_rolled.remove(segment)
                segment.close_index_files()
                if not ticket.done:
                    self._waived_rolled.append(segment)
            elif ticket.done and segment in self._waived_rolled:
                self._waived_rolled.remove(segment)
        if moved and self.on_flushed is not None:
            self.on_flushed()


def _sync_segment(segment: Segment) -> None:
    for file in (segment.log_file, *segment.index_files()):
        file.fsync()


def fsync_dir(directory: Path) -> None:
    with file_handles().transient(directory, os.O_RDONLY | os.O_DIRECTORY) as fd:
        os.fsync(fd)
