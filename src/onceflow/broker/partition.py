"""One partition as the broker serves it: its log, the exactly-once state beside it (producer
state, aborted-transaction index) and the readers waiting on it.

Producer state is snapshotted on clean shutdown and at segment rolls; recovery loads the
newest snapshot not past the log end and replays the batches after it (Kafka's way), so a
duplicate retried across a restart is still caught.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kio.schema.errors import ErrorCode

from onceflow.broker.append_outcome import (
    Appended,
    AppendRefused,
    records_error_code,
)
from onceflow.broker.keyless_records import keyless_message, null_key_indexes, refusal_message
from onceflow.clock import Clock
from onceflow.log.aborted_index import AbortedTxnIndex
from onceflow.log.config import LogConfig
from onceflow.log.errors import DescriptorsExhaustedError
from onceflow.log.file_handles import file_handles
from onceflow.log.full_disk import check_space
from onceflow.log.partition_log import PartitionLog
from onceflow.log.producer_errors import CorruptSnapshotError, TxnError
from onceflow.log.producer_state import CompletedTxn, DuplicateBatch, ProducerStateManager
from onceflow.log.segment import Segment
from onceflow.log.swap import Crash, no_crash
from onceflow.log.sync_barrier import SyncBarrier
from onceflow.records.batch import BatchHeader, iter_batches
from onceflow.records.control import ControlType, build_marker, parse_control_record
from onceflow.records.decompression import DEFAULT_MAX_DECOMPRESSED_BYTES
from onceflow.records.errors import RecordsError
from onceflow.records.record import decode_batch
from onceflow.records.validation import validate_produce_records
from onceflow.txn.coordinator import TransactionCoordinator

log = logging.getLogger(__name__)

_SNAPSHOT = re.compile(r"^(\d{20})\.snapshot$")
SNAPSHOTS_KEPT = 2


@dataclass(eq=False)
class Partition:
    topic: str
    index: int
    log: PartitionLog
    producers: ProducerStateManager
    aborted: AbortedTxnIndex
    # Called after the high watermark moves (fetch long-polls wait on it).
    listeners: set[Callable[[], None]] = field(default_factory=set)
    _segments_seen: int = 0
    # Offsets of the snapshot files on disk, listed once: a directory of thousands of small
    # segments must not be listed again at every roll.
    _snapshots: list[int] | None = None
    # The log cleaner is reading this partition's rolled segments (retention waits).
    cleaning: bool = False

    def __post_init__(self) -> None:
        # The log says when its flushed offset moves; this partition owns what follows.
        self.log.on_flushed = self._high_watermark_moved

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
    ) -> Partition:
        partition_log = PartitionLog.open(
            directory, config, clock, sync_parent=sync_parent, barrier=barrier
        )
        producers = _load_snapshot(
            directory, partition_log.log_end_offset, clock, producer_id_expiration_ms
        )
        aborted = AbortedTxnIndex.open(directory)
        partition = cls(topic, index, partition_log, producers, aborted)
        partition._replay_from(producers.map_end_offset)
        partition._segments_seen = len(partition_log.segment_base_offsets)
        return partition

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

    # -- appends ----------------------------------------------------------------------------

    def append_records(
        self,
        records: bytes,
        transactional_id: str | None,
        transactions: TransactionCoordinator,
        *,
        produce_version: int = 0,
        max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    ) -> Appended:
        """The exactly-once append of a produced batch: every record walked, the topic's
        rules (size, keys on a compacted topic), the producer id issued, KIP-890 verification,
        the producer-state checks (a retry answered with its original offsets), the write.
        Raises AppendRefused with Kafka's error code; nothing is written then."""
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
        headers = validated.batches
        [(position, header)] = headers  # validation allows exactly one batch (Produce v3+)
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
        if header.has_producer_id:
            duplicate = self._check_producer(
                header, transactional_id, transactions, produce_version
            )
            if duplicate is not None:
                return Appended(duplicate.first_offset, -1, self.log.log_start_offset)
        try:
            info = self.log.append(records, headers)
        except DescriptorsExhaustedError as e:
            # Nothing was written; Kafka's clients retry KAFKA_STORAGE_ERROR.
            raise AppendRefused(ErrorCode.kafka_storage_error, str(e)) from None
        self.after_append([h for _, h in info.headers])
        return Appended(info.first_offset, info.log_append_time, info.log_start_offset)

    def _check_producer(
        self,
        header: BatchHeader,
        transactional_id: str | None,
        transactions: TransactionCoordinator,
        produce_version: int,
    ) -> DuplicateBatch | None:
        if not transactions.was_issued(header.producer_id):
            # Made-up ids would each cost producer state for a day; clients reset their
            # producer id on UNKNOWN_PRODUCER_ID (INVALID_PRODUCER_ID_MAPPING is fatal to them).
            raise AppendRefused(
                ErrorCode.unknown_producer_id,
                f"producer id {header.producer_id} was never issued by this broker",
            )
        if header.is_transactional:
            _check_owner(header, transactional_id, transactions)
        verdict = ErrorCode.none
        if self.producers.needs_verification(header):
            # KIP-890: a transactional batch may only open a transaction on a partition that
            # the coordinator added to the producer's ongoing transaction.
            verdict = (
                transactions.is_in_transaction(
                    transactional_id,
                    header.producer_id,
                    header.producer_epoch,
                    self.topic,
                    self.index,
                    produce_version=produce_version,
                )
                if transactional_id
                else ErrorCode.invalid_txn_state
            )
        verified = verdict == ErrorCode.none
        try:
            duplicate = self.producers.check_append(header, transaction_verified=verified)
        except TxnError as e:
            code = e.error_code
            if not verified and code == ErrorCode.invalid_txn_state and transactional_id:
                # The coordinator's verdict as Kafka maps it for Produce: a fenced producer
                # expects INVALID_PRODUCER_EPOCH, a completing transaction a retry.
                code = verdict
            # Kafka verifies before the producer-state checks: a batch the coordinator refused
            # is answered as verification's refusals are.
            refused_by_coordinator = verdict != ErrorCode.none and bool(transactional_id)
            raise AppendRefused(code, str(e), verification=refused_by_coordinator) from None
        if not header.is_transactional and transactions.owner_of(header.producer_id) is not None:
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
    ) -> None:
        """Append a COMMIT/ABORT control batch and close the producer's transaction here.
        Raises TxnError (nothing written) for a marker of an older producer or coordinator
        epoch."""
        self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
        data = build_marker(producer_id, producer_epoch, commit, coordinator_epoch, timestamp)
        info = self.log.append(data, list(iter_batches(data, verify_crc=False)))
        [(_, marker)] = info.headers
        self._record_completion(self.producers.on_marker(marker, commit, coordinator_epoch))
        self._snapshot_on_roll()

    def append_coordinator_marker(self, data: bytes, commit: bool, coordinator_epoch: int) -> None:
        """Append a marker a coordinator writes to its own log (the offsets log), recorded as
        recovery replays it, without append_marker's producer-state checks: the transaction
        coordinator decided it, and a refusal would leave its transaction half-completed."""
        info = self.log.append(data, list(iter_batches(data, verify_crc=False)))
        for _, header in info.headers:
            self._record_completion(self.producers.replay(header, (commit, coordinator_epoch)))
        self._snapshot_on_roll()

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

    def close(self, barrier: SyncBarrier | None = None) -> None:
        self.write_snapshot()
        self.aborted.close()
        self.log.close(barrier)

    def delete(self) -> None:
        self.aborted.close()
        self.log.delete()


def _check_owner(
    header: BatchHeader, transactional_id: str | None, transactions: TransactionCoordinator
) -> None:
    """A transactional batch must name the transactional id that owns its producer id (the
    coordinator's durable mapping). Kafka asks the coordinator only when the batch would open
    a transaction on the partition (KIP-890); asked always, a batch forged under the id, epoch
    and next sequence of a producer (DescribeProducers shows them) cannot join its open
    transaction."""
    if transactional_id is None:
        raise AppendRefused(
            ErrorCode.transactional_id_authorization_failed,
            "transactional records need a transactional id",
        )
    owner = transactions.get(transactional_id)
    if owner is None or owner.producer_id != header.producer_id:
        raise AppendRefused(
            ErrorCode.invalid_producer_id_mapping,
            f"producer id {header.producer_id} is not the one of transactional id "
            f"{transactional_id!r}",
        )


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
