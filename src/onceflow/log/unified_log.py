"""One partition's log as Kafka's UnifiedLog: the local log (segments, partition_log.py), the
producer state, the aborted-transaction index, the high watermark and the last stable offset,
with the exactly-once append and `read` (the isolation bound, KIP-74's first batch, the aborted
transactions a read_committed reader needs).

The log never asks the transaction coordinator: the broker verifies a produced batch first and
hands the append a VerificationGuard (verification_guard.py), as Kafka's ReplicaManager does.

Producer state is snapshotted on clean shutdown and at segment rolls; loading takes the newest
snapshot not past the log end and replays the batches after it (Kafka's way), so a duplicate
retried across a restart is still caught.
"""

from __future__ import annotations

import enum
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kio.schema.errors import ErrorCode

from onceflow.clock import Clock
from onceflow.log.aborted_index import AbortedTxnIndex
from onceflow.log.config import LogConfig
from onceflow.log.errors import DescriptorsExhaustedError, OffsetOutOfRangeError
from onceflow.log.file_handles import file_handles
from onceflow.log.full_disk import check_space
from onceflow.log.offset_for_timestamp import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIERED_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    max_timestamp_offset,
    offset_for_time,
)
from onceflow.log.partition_log import PartitionLog
from onceflow.log.producer_errors import CorruptSnapshotError, TxnError
from onceflow.log.producer_state import CompletedTxn, DuplicateBatch, ProducerStateManager
from onceflow.log.segment import Segment
from onceflow.log.swap import Crash, no_crash
from onceflow.log.sync_barrier import SyncBarrier
from onceflow.log.verification_guard import VerificationGuard
from onceflow.records.batch import BatchHeader, iter_batches
from onceflow.records.control import ControlType, build_marker, parse_control_record
from onceflow.records.decompression import DEFAULT_MAX_DECOMPRESSED_BYTES
from onceflow.records.errors import RecordsError
from onceflow.records.record import decode_batch
from onceflow.records.validation import (
    Appended,
    AppendRefused,
    ValidatedRecords,
    keyless_message,
    null_key_indexes,
    records_error_code,
    refusal_message,
    validate_produce_records,
)

log = logging.getLogger(__name__)

_SNAPSHOT = re.compile(r"^(\d{20})\.snapshot$")
SNAPSHOTS_KEPT = 2


class FetchIsolation(enum.Enum):
    """How far a read may go (Kafka's FetchIsolation, without the followers' LOG_END)."""

    HIGH_WATERMARK = "read_uncommitted"
    TXN_COMMITTED = "read_committed"


@dataclass(frozen=True, slots=True)
class FetchDataInfo:
    """What `read` returns (Kafka's FetchDataInfo, with the offsets a Fetch answers)."""

    records: bytes  # whole batches as stored, possibly none
    # (producer id, first offset) of the aborted transactions overlapping the read, for
    # TXN_COMMITTED; None for HIGH_WATERMARK
    aborted_transactions: list[tuple[int, int]] | None
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


class UnifiedLog:
    """A partition's log; single-threaded (the broker's event loop, or the simulation)."""

    def __init__(
        self,
        topic: str,
        index: int,
        local_log: PartitionLog,
        producers: ProducerStateManager,
        aborted: AbortedTxnIndex,
    ) -> None:
        self.topic = topic
        self.index = index
        # The local log (Kafka's LocalLog): segments, offsets, flushes. Named `log` as the
        # cleaner, the group commit and the coordinators' logs use it.
        self.log = local_log
        self.producers = producers
        self.aborted = aborted
        # Called after the high watermark moves (fetch long-polls wait on it).
        self.listeners: set[Callable[[], None]] = set()
        # The log cleaner is reading this partition's rolled segments (retention waits).
        self.cleaning = False
        self._segments_seen = 0
        # Offsets of the snapshot files on disk, listed once: a directory of thousands of small
        # segments must not be listed again at every roll.
        self._snapshots: list[int] | None = None
        # The local log says when its flushed offset moves; this log owns what follows.
        local_log.on_flushed = self._high_watermark_moved

    # -- loading ----------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        topic: str,
        index: int,
        directory: Path,
        config: LogConfig,
        clock: Clock,
        producer_id_expiration_ms: int,
        *,
        sync_parent: bool = True,
        barrier: SyncBarrier | None = None,
    ) -> UnifiedLog:
        """Open (creating it if new) and recover the segments, then load the rest."""
        local_log = PartitionLog.open(
            directory, config, clock, sync_parent=sync_parent, barrier=barrier
        )
        return cls.load(topic, index, local_log, clock, producer_id_expiration_ms)

    @classmethod
    def load(
        cls,
        topic: str,
        index: int,
        local_log: PartitionLog,
        clock: Clock,
        producer_id_expiration_ms: int,
    ) -> UnifiedLog:
        """The log over opened segments: the newest usable producer snapshot, the aborted
        index, then the replay of the batches after the snapshot (Kafka's LogLoader)."""
        producers = _load_snapshot(
            local_log.directory, local_log.log_end_offset, clock, producer_id_expiration_ms
        )
        aborted = AbortedTxnIndex.open(local_log.directory)
        unified = cls(topic, index, local_log, producers, aborted)
        unified._replay_from(producers.map_end_offset)
        unified._segments_seen = len(local_log.segment_base_offsets)
        return unified

    def _replay_from(self, start: int) -> None:
        start = max(start, self.log.log_start_offset)
        self.aborted.truncate_after(start)
        for header in self.log.iter_batch_headers(start):
            control = None
            if header.is_control and header.records_count > 0:
                # (an emptied control batch, kept by the cleaner, only moves the epoch)
                batch = decode_batch(self.log.read(header.base_offset, 1).data)
                control_type, coordinator_epoch = parse_control_record(batch.records[0])
                control = (control_type == ControlType.COMMIT, coordinator_epoch)
            self._record_completion(self.producers.replay(header, control))
        self.producers.update_map_end_offset(self.log.log_end_offset)
        self.producers.on_high_watermark(self.high_watermark)

    def _record_completion(self, completed: CompletedTxn | None) -> None:
        if completed is not None and completed.is_aborted:
            self.aborted.add(completed)

    # -- offsets ----------------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        """Offsets below it are durable (fsynced, or handed to the OS when fsync is off)."""
        return self.log.flushed_offset

    def _high_watermark_moved(self) -> None:
        """The one place that follows the high watermark (a completed flush moved it): the
        transactions whose markers it passed become stable, then the readers waiting on this
        partition (fetch long-polls) are woken."""
        self.producers.on_high_watermark(self.high_watermark)
        self.notify()

    @property
    def last_stable_offset(self) -> int:
        # A transaction open across a DeleteRecords keeps it at its first offset, below the log
        # start offset, as Apache Kafka 4.4 answers (tests/apache_kafka/conformance).
        return self.producers.last_stable_offset(self.high_watermark)

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of aborted transactions overlapping [start, end)."""
        return self.aborted.collect(start_offset, end_offset)

    # -- reads ------------------------------------------------------------------------------

    def read(
        self, offset: int, max_bytes: int, isolation: FetchIsolation, min_one: bool
    ) -> FetchDataInfo:
        """Whole batches from the one holding `offset`, below the high watermark or (for
        TXN_COMMITTED) the last stable offset, with the aborted transactions such a reader
        needs. At most `max_bytes`; with `min_one` (the response's first partition with data,
        KIP-74) the first batch is returned whole whatever its size, without it a first batch
        larger than `max_bytes` is not returned. Raises OffsetOutOfRangeError, and
        DescriptorsExhaustedError (retriable) when no file descriptor is left."""
        hw, lso, start = self.high_watermark, self.last_stable_offset, self.log.log_start_offset
        committed = isolation is FetchIsolation.TXN_COMMITTED
        bound = lso if committed else hw
        records = b""
        if offset < bound and (max_bytes > 0 or min_one):
            records = self.log.read(offset, max(max_bytes, 1), max_offset=bound).data
            if not min_one and len(records) > max_bytes:
                records = b""
        elif not start <= offset <= self.log.log_end_offset:
            raise OffsetOutOfRangeError(offset, start, self.log.log_end_offset)
        aborted = self.aborted.collect(offset, lso) if committed else None
        return FetchDataInfo(records, aborted, hw, lso, start)

    # -- appends ----------------------------------------------------------------------------

    def validate(
        self, records: bytes, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
    ) -> ValidatedRecords:
        """A produced batch checked as Kafka's LogValidator and the topic's rules want it
        (every record walked, max.message.bytes, keys on a compacted topic, segment.bytes),
        before anything is asked or written. Raises AppendRefused with Kafka's error code."""
        config = self.log.config
        try:
            # max.message.bytes is checked on the header, before any record is walked
            validated = validate_produce_records(
                records,
                max_batch_size=config.max_message_bytes,
                max_decompressed_bytes=max_decompressed_bytes,
            )
        except RecordsError as e:
            raise AppendRefused(records_error_code(e), str(e)) from None
        [(position, header)] = validated.batches  # exactly one batch (Produce v3+)
        if config.compact and validated.null_keys:
            # LogValidator.validateKey, before the size and producer-state checks, as in Kafka
            message = keyless_message(self.topic, self.index)
            indexes = null_key_indexes(
                records, position, header, max_decompressed_bytes=max_decompressed_bytes
            )
            errors = [(index, message) for index in indexes]
            raise AppendRefused(
                ErrorCode.invalid_record, refusal_message(validated.null_keys, errors), errors
            )
        if header.size > config.segment_bytes:  # as Kafka: a batch never spans segments
            raise AppendRefused(
                ErrorCode.record_list_too_large,
                f"batch of {header.size} bytes exceeds segment.bytes={config.segment_bytes}",
            )
        return validated

    def needs_verification(self, header: BatchHeader) -> bool:
        """KIP-890: the batch would open a transaction here, so the coordinator must say the
        partition is in the producer's transaction (VerificationGuard.verdict)."""
        return self.producers.needs_verification(header)

    def append_as_leader(
        self, records: bytes, validated: ValidatedRecords, guard: VerificationGuard | None
    ) -> Appended:
        """The exactly-once append of a batch `validate` accepted: the producer-state checks
        with the coordinator's answers in `guard` (a retry is answered with its original
        offsets), the write, the producer state. Raises AppendRefused; nothing is written then.
        A batch with a producer id needs a guard."""
        [(_, header)] = validated.batches
        if header.has_producer_id:
            if guard is None:
                raise ValueError("a batch with a producer id is appended with its guard")
            duplicate = self._check_producer(header, guard)
            if duplicate is not None:
                return Appended(duplicate.first_offset, -1, self.log.log_start_offset)
        try:
            info = self.log.append(records, validated.batches)
        except DescriptorsExhaustedError as e:
            # Nothing was written; Kafka's clients retry KAFKA_STORAGE_ERROR.
            raise AppendRefused(ErrorCode.kafka_storage_error, str(e)) from None
        self.after_append([h for _, h in info.headers])
        return Appended(info.first_offset, info.log_append_time, info.log_start_offset)

    def _check_producer(
        self, header: BatchHeader, guard: VerificationGuard
    ) -> DuplicateBatch | None:
        try:
            duplicate = self.producers.check_append(header, transaction_verified=guard.verified)
        except TxnError as e:
            code = e.error_code
            if guard.refused and code == ErrorCode.invalid_txn_state:
                # The coordinator's verdict as Kafka maps it for Produce: a fenced producer
                # expects INVALID_PRODUCER_EPOCH, a completing transaction a retry.
                code = guard.verdict
            # Kafka verifies before the producer-state checks: a batch the coordinator refused
            # is answered as verification's refusals are.
            raise AppendRefused(code, str(e), verification=guard.refused) from None
        if not header.is_transactional and guard.transactional_producer:
            # Stricter than Kafka, which refuses this only while the producer's transaction is
            # open here (INVALID_TXN_STATE above): otherwise anyone could take the sequences
            # the producer's next transaction on this partition will use.
            raise AppendRefused(
                ErrorCode.invalid_txn_state,
                f"producer id {header.producer_id} is a transactional producer's: "
                "its batches must be transactional",
            )
        return duplicate

    def after_append(self, headers: list[BatchHeader]) -> None:
        """Record batches appended to the local log directly (a coordinator's own records)."""
        for header in headers:
            self.producers.on_append(header)
        self._snapshot_on_roll()

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        timestamp: int,
        *,
        transaction_version: int = 0,
    ) -> None:
        """Append a COMMIT/ABORT control batch and close the producer's transaction here.
        Raises TxnError (nothing written) for a marker of an older producer or coordinator
        epoch; with `transaction_version` 2 (the coordinator bumped the epoch for the marker)
        also for one of the producer's current epoch, unless it retries a written marker."""
        self.producers.check_marker(
            producer_id, producer_epoch, coordinator_epoch, transaction_version=transaction_version
        )
        data = build_marker(producer_id, producer_epoch, commit, coordinator_epoch, timestamp)
        info = self.log.append(data, list(iter_batches(data, verify_crc=False)))
        [(_, marker)] = info.headers
        completed = self.producers.on_marker(
            marker, commit, coordinator_epoch, transaction_version=transaction_version
        )
        self._record_completion(completed)
        self._snapshot_on_roll()

    def append_coordinator_marker(self, data: bytes, commit: bool, coordinator_epoch: int) -> None:
        """Append a marker a coordinator writes to its own log (the offsets log), recorded as
        recovery replays it, without append_marker's producer-state checks: the transaction
        coordinator decided it, and a refusal would leave its transaction half-completed."""
        info = self.log.append(data, list(iter_batches(data, verify_crc=False)))
        for _, header in info.headers:
            self._record_completion(self.producers.replay(header, (commit, coordinator_epoch)))
        self._snapshot_on_roll()

    # -- retention and cleaning -------------------------------------------------------------

    def apply_retention(self) -> int:
        """Delete segments past retention (never above the high watermark) with their aborted
        transactions, and forget producers idle past producer.id.expiration.ms. Segments wait
        while the cleaner reads them (it would then drop its work; the next check gets them)."""
        deleted = 0
        if not self.cleaning:
            deleted = self.log.delete_expired_segments(high_watermark=self.high_watermark)
        if deleted:
            self.aborted.delete_before(self.log.log_start_offset)
        self.producers.remove_expired()
        return deleted

    def replace_cleaned(self, base: int, replaced: list[Segment], crash: Crash = no_crash) -> None:
        """Swap a cleaned segment in (PartitionLog.replace_segments) and its aborted
        transactions' index with it."""
        self.log.replace_segments(base, replaced, crash)
        self.aborted.replace_segments([s.base_offset for s in replaced], base)

    def notify(self) -> None:
        """Wake the readers waiting on this partition (the high watermark moved, or the
        partition was deleted)."""
        for listener in list(self.listeners):
            listener()

    # -- snapshots --------------------------------------------------------------------------

    def _snapshot_on_roll(self) -> None:
        segments = len(self.log.segment_base_offsets)
        if segments != self._segments_seen:
            try:
                self.write_snapshot()
            except DescriptorsExhaustedError as exc:
                # A snapshot only shortens recovery's replay: try again at the next roll.
                log.warning("producer snapshot of %s-%d postponed: %s", self.topic, self.index, exc)
                return
            self._segments_seen = segments

    def write_snapshot(self) -> None:
        """Persist producer state at the current log end (the aborted index first, so that
        every entry below the snapshot offset is on disk)."""
        self.aborted.flush()
        directory = self.log.directory
        offset = self.producers.map_end_offset
        path = directory / f"{offset:020d}.snapshot"
        tmp = path.with_suffix(".snapshot.tmp")
        check_space()
        data = self.producers.snapshot()
        with file_handles().transient(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) as fd:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        tmp.replace(path)
        if self._snapshots is None:
            self._snapshots = [o for o, _ in _snapshot_files(directory)]
        if offset not in self._snapshots:
            self._snapshots = sorted([*self._snapshots, offset])
        for old in self._snapshots[:-SNAPSHOTS_KEPT]:
            (directory / f"{old:020d}.snapshot").unlink(missing_ok=True)
        self._snapshots = self._snapshots[-SNAPSHOTS_KEPT:]

    # -- lifecycle --------------------------------------------------------------------------

    def close(self, barrier: SyncBarrier | None = None) -> None:
        self.write_snapshot()
        self.aborted.close()
        self.log.close(barrier)

    def delete(self) -> None:
        self.aborted.close()
        self.log.delete()

    def abandon(self) -> None:
        """Drop every descriptor without flushing (DeleteTopics: the files are about to go).
        Reads still in flight then get LogClosedError, never another file's bytes."""
        self.aborted.close()
        self.log._abandon()

    # -- what the admin requests read and change (Kafka's UnifiedLog.logStartOffset,
    # logEndOffset, size, config, updateConfig, fetchOffsetByTimestamp,
    # maybeIncrementLogStartOffset) ----------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def size(self) -> int:
        """Bytes of the segments on disk."""
        return self.log.size_in_bytes

    @property
    def config(self) -> LogConfig:
        return self.log.config

    def update_config(self, config: LogConfig) -> None:
        """AlterConfigs: read at the next append, roll and retention check."""
        self.log.config = config

    def fetch_offset_by_timestamp(
        self, timestamp: int, isolation: FetchIsolation
    ) -> tuple[int, int]:
        """ListOffsets: (offset, timestamp) for `timestamp` or one of the special timestamps,
        among the records a reader with `isolation` may see (below the high watermark or the
        last stable offset); (-1, -1) when there is none. The latest offset is that bound, the
        earliest the log start offset (both with timestamp -1, as Kafka answers)."""
        upper = (
            self.last_stable_offset
            if isolation is FetchIsolation.TXN_COMMITTED
            else self.high_watermark
        )
        if timestamp in (LATEST_TIMESTAMP, LATEST_TIERED_TIMESTAMP):
            return upper, -1
        if timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
            return self.log.log_start_offset, -1
        if timestamp == MAX_TIMESTAMP:
            return max_timestamp_offset(self.log, upper)
        if timestamp < 0:
            raise ValueError(f"no such special timestamp: {timestamp}")
        return offset_for_time(self.log, timestamp, upper)

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """DeleteRecords: nothing below `offset` is served from now on (the caller checked it
        is at most the high watermark); False when the log starts there or beyond already.
        Durable only after `store_log_start_offset`."""
        return self.log.advance_log_start_offset(offset)

    def store_log_start_offset(self) -> None:
        """Make the log start offset durable (it fsyncs: run it off the event loop)."""
        self.log.store_log_start_offset()


def _snapshot_files(directory: Path) -> list[tuple[int, Path]]:
    found = []
    for path in directory.iterdir():
        match = _SNAPSHOT.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def _load_snapshot(
    directory: Path, log_end_offset: int, clock: Clock, expiration_ms: int
) -> ProducerStateManager:
    """The newest valid snapshot at or below the log end; snapshots past it are deleted (the
    log lost its unflushed tail in a crash)."""
    for offset, path in reversed(_snapshot_files(directory)):
        if offset > log_end_offset:
            path.unlink(missing_ok=True)
            continue
        try:
            return ProducerStateManager.from_snapshot(path.read_bytes(), clock, expiration_ms)
        except CorruptSnapshotError as e:
            log.warning("ignoring corrupt producer snapshot %s: %s", path, e)
            path.unlink(missing_ok=True)
    return ProducerStateManager(clock, expiration_ms)
