"""Partition-side exactly-once state: idempotent producers, open transactions, the LSO.

One ProducerStateManager per partition, after Kafka's ProducerStateManager, ProducerAppendInfo
and UnifiedLog.analyzeAndValidateProducerState. The broker drives it around each append:

    duplicate = psm.check_append(header)      # before: validates, changes nothing
    if duplicate is None:
        info = log.append(...)                # assigns offsets
        psm.on_append(assigned_header)        # after: records the batch
    psm.check_marker(...); info = log.append(marker); completed = psm.on_marker(marker_header, ...)

Recovery is `from_snapshot` (or a fresh manager) followed by `replay` of every batch the log
holds from `map_end_offset` on: the same state transitions as on_append/on_marker, without the
checks, so the recovered state is the one the live broker had.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from enum import Enum

from onceflow.clock import Clock
from onceflow.log.producer_entry import (
    BatchMetadata,
    ProducerStateEntry,
    in_sequence,
)
from onceflow.log.producer_errors import (
    CorruptSnapshotError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from onceflow.log.producer_snapshot import decode_snapshot, encode_snapshot
from onceflow.records.batch import NO_PRODUCER_EPOCH, BatchHeader

DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000  # producer.id.expiration.ms
# Producers remembered per partition. Kafka bounds them only by producer.id.expiration.ms; a
# bound keeps a flood of (issued) producer ids from growing memory for a day. Generous (about
# 1 KiB each): past it the producer idle longest is forgotten early, as expiration would.
MAX_PRODUCERS_PER_PARTITION = 20_000


class AppendOrigin(Enum):
    """Who writes a batch, which decides how much is checked (Kafka's AppendOrigin)."""

    CLIENT = "client"  # Produce requests: duplicates, epochs and sequences
    COORDINATOR = "coordinator"  # the group coordinator's offset commits: epochs only


@dataclass(frozen=True, slots=True)
class DuplicateBatch:
    """A retry of one of the producer's last five batches: answer with these, do not append."""

    first_offset: int
    last_offset: int
    log_append_time: int  # the original batch's max timestamp, which Kafka answers with


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction closed by a COMMIT or ABORT marker."""

    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    is_aborted: bool
    last_stable_offset: int  # the LSO once it is closed: what the aborted index records


@dataclass(frozen=True, slots=True)
class OpenTxn:
    producer_id: int
    producer_epoch: int
    first_offset: int
    start_timestamp: int  # max timestamp of the transaction's first batch
    last_timestamp: int  # the producer's latest batch or marker timestamp


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """One producer as DescribeProducers reports it."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int  # -1 without an open transaction


class ProducerStateManager:
    """Producer ids, their last batches and their open transactions on one partition."""

    def __init__(
        self, clock: Clock, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS
    ) -> None:
        self._clock = clock
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._producers: dict[int, ProducerStateEntry] = {}
        self.max_producers = MAX_PRODUCERS_PER_PARTITION
        # open transactions: sorted first offsets, and who opened each
        self._ongoing_offsets: list[int] = []
        self._ongoing: dict[int, int] = {}
        # closed transactions whose marker is not yet below the high watermark, sorted by first
        # offset: their data stays unstable until the marker is durable (Kafka's unreplicatedTxns)
        self._unreplicated: list[tuple[int, int]] = []
        self._map_end_offset = 0

    # -- before an append -------------------------------------------------------------------

    def check_append(
        self,
        header: BatchHeader,
        *,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        transaction_verified: bool = True,
    ) -> DuplicateBatch | None:
        """Validate a data batch before it is appended; changes nothing.

        Returns DuplicateBatch when it repeats a cached batch (do not append it). Raises
        InvalidProducerEpochError, OutOfOrderSequenceError or InvalidTxnStateError, in Kafka's
        order. `transaction_verified=False` says the transaction coordinator does not know of
        a transaction for this partition (KIP-890 verification; see `needs_verification`).
        """
        if header.is_control:
            raise ValueError("control batches go through check_marker/on_marker")
        producer_id = header.producer_id
        if producer_id < 0:
            return None
        epoch = header.producer_epoch
        entry = self._producers.get(producer_id)

        if origin is AppendOrigin.CLIENT and entry is not None:
            cached = entry.find_duplicate(epoch, header.base_sequence, header.last_sequence)
            if cached is not None:
                if not header.is_log_append_time and not cached.is_retried_by(header.crc):
                    # librdkafka's abort_transaction() purges messages queued for a retry
                    # (sent, maybe written) and numbers the next ones from theirs, in the
                    # same epoch. Answered as a duplicate, those new records would be lost
                    # though acknowledged; out of order, the client aborts and bumps its epoch.
                    raise OutOfOrderSequenceError(
                        f"producer {producer_id} epoch {epoch} reused sequences "
                        f"{header.base_sequence}..{header.last_sequence} for other records "
                        f"(those of offsets {cached.first_offset}..{cached.last_offset})"
                    )
                return DuplicateBatch(cached.first_offset, cached.last_offset, cached.timestamp)

        if header.is_transactional and not self.has_ongoing_transaction(producer_id, epoch):
            # a stale epoch is the retriable INVALID_PRODUCER_EPOCH, checked before verification
            if entry is not None and epoch < entry.producer_epoch:
                raise InvalidProducerEpochError(
                    f"producer {producer_id} epoch {epoch} is below the current "
                    f"epoch {entry.producer_epoch}"
                )
            if not transaction_verified:
                raise InvalidTxnStateError(
                    f"transactional batch of producer {producer_id} epoch {epoch} is not part "
                    "of an ongoing transaction"
                )

        current_epoch = entry.producer_epoch if entry is not None else NO_PRODUCER_EPOCH
        if epoch < current_epoch:
            raise InvalidProducerEpochError(
                f"producer {producer_id} epoch {epoch} is below the current epoch {current_epoch}"
            )
        if origin is AppendOrigin.CLIENT:
            self._check_sequence(producer_id, epoch, header.base_sequence, entry)

        if entry is not None and entry.has_open_transaction and not header.is_transactional:
            raise InvalidTxnStateError(
                f"non-transactional batch from producer {producer_id} while its transaction "
                f"from offset {entry.current_txn_first_offset} is open"
            )
        return None

    @staticmethod
    def _check_sequence(
        producer_id: int, epoch: int, first_seq: int, entry: ProducerStateEntry | None
    ) -> None:
        if entry is None or entry.producer_epoch == NO_PRODUCER_EPOCH:
            return  # an unknown producer may start anywhere (KIP-360)
        if epoch != entry.producer_epoch:
            if first_seq != 0:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} new epoch {epoch} (current {entry.producer_epoch}) "
                    f"must start at sequence 0, not {first_seq}"
                )
            return
        # an empty cache (epoch bumped by a marker) expects 0: in_sequence(-1, 0)
        last_seq = entry.last_sequence
        if not in_sequence(last_seq, first_seq):
            raise OutOfOrderSequenceError(
                f"producer {producer_id} epoch {epoch}: sequence {first_seq} does not follow "
                f"the last sequence {last_seq}"
            )

    def check_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        *,
        transaction_version: int = 0,
    ) -> None:
        """Validate a COMMIT/ABORT marker before it is appended; changes nothing.

        Raises InvalidProducerEpochError for an epoch below the stored one (with transaction
        version 2, not above it, unless it retries a marker that already closed the
        transaction) and TransactionCoordinatorFencedError for an older coordinator epoch.
        """
        entry = self._producers.get(producer_id)
        current = entry.producer_epoch if entry is not None else NO_PRODUCER_EPOCH
        if transaction_version >= 2:
            # TV2 bumps the epoch with every marker; equal is only a retry of a written marker
            retry = (
                producer_epoch == current and entry is not None and not entry.has_open_transaction
            )
            invalid = producer_epoch <= current and not retry
        else:
            invalid = producer_epoch < current
        if invalid:
            raise InvalidProducerEpochError(
                f"marker for producer {producer_id} has epoch {producer_epoch}, "
                f"the current epoch is {current}"
            )
        if entry is not None and entry.coordinator_epoch > coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"marker for producer {producer_id} from coordinator epoch {coordinator_epoch}, "
                f"epoch {entry.coordinator_epoch} was seen already"
            )

    def has_ongoing_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        entry = self._producers.get(producer_id)
        return (
            entry is not None
            and entry.has_open_transaction
            and entry.producer_epoch == producer_epoch
        )

    def needs_verification(self, header: BatchHeader) -> bool:
        """True when a transactional batch would open a transaction here: ask the coordinator
        (KIP-890) and pass the answer to check_append as `transaction_verified`."""
        return (
            header.is_transactional
            and not header.is_control
            and header.producer_id >= 0
            and not self.has_ongoing_transaction(header.producer_id, header.producer_epoch)
        )

    # -- after an append --------------------------------------------------------------------

    def on_append(self, header: BatchHeader) -> None:
        """Record an appended data batch; `header` carries the assigned base offset."""
        if header.is_control:
            raise ValueError("control batches go through on_marker or replay")
        self._map_end_offset = max(self._map_end_offset, header.next_offset)
        producer_id = header.producer_id
        if producer_id < 0:
            return
        entry = self._entry(producer_id)
        metadata = BatchMetadata(
            header.last_sequence,
            header.last_offset,
            header.last_offset_delta,
            header.max_timestamp,
            None if header.is_log_append_time else header.crc,
        )
        entry.add_batch(header.producer_epoch, metadata)
        if header.is_transactional and not entry.has_open_transaction:
            entry.current_txn_first_offset = header.base_offset
            entry.current_txn_start_timestamp = header.max_timestamp
            bisect.insort(self._ongoing_offsets, header.base_offset)
            self._ongoing[header.base_offset] = producer_id

    def on_marker(
        self,
        marker: BatchHeader,
        commit: bool,
        coordinator_epoch: int,
        *,
        transaction_version: int = 0,
    ) -> CompletedTxn | None:
        """Close the producer's open transaction with `marker`, the header of the COMMIT or
        ABORT batch just appended (its offset ends the transaction, its timestamp is the
        producer's last).

        Validates as check_marker does (call that before appending, so that a rejected marker
        is never written), then records the marker as replay does. Returns the completed
        transaction, or None when none was open.
        """
        self.check_marker(
            marker.producer_id,
            marker.producer_epoch,
            coordinator_epoch,
            transaction_version=transaction_version,
        )
        return self._apply_marker(marker, commit, coordinator_epoch)

    def _apply_marker(
        self, marker: BatchHeader, commit: bool, coordinator_epoch: int
    ) -> CompletedTxn | None:
        producer_id, marker_offset = marker.producer_id, marker.base_offset
        self._map_end_offset = max(self._map_end_offset, marker_offset + 1)
        entry = self._entry(producer_id)
        completed = None
        if entry.has_open_transaction:
            first_offset = entry.current_txn_first_offset
            completed = CompletedTxn(
                producer_id,
                first_offset,
                marker_offset,
                is_aborted=not commit,
                last_stable_offset=self._stable_offset_after(producer_id, marker_offset),
            )
            self._ongoing_offsets.remove(first_offset)
            del self._ongoing[first_offset]
            bisect.insort(self._unreplicated, (first_offset, marker_offset))
        entry.end_transaction(marker.producer_epoch, coordinator_epoch, marker.max_timestamp)
        return completed

    def _stable_offset_after(self, producer_id: int, marker_offset: int) -> int:
        # the earliest transaction left open by another producer, else just past the marker
        for first_offset in self._ongoing_offsets:
            if self._ongoing[first_offset] != producer_id:
                return first_offset
        return marker_offset + 1

    def replay(
        self, header: BatchHeader, control: tuple[bool, int] | None = None
    ) -> CompletedTxn | None:
        """Apply a batch read back from the log, without validation (recovery).

        `control` is (commit, coordinator epoch) of a marker batch and None otherwise.
        """
        if header.is_control:
            if control is None and header.records_count == 0:
                return self._replay_empty_marker(header)
            if control is None:
                raise ValueError(f"control batch at offset {header.base_offset} needs its marker")
            if header.producer_id < 0:
                self._map_end_offset = max(self._map_end_offset, header.next_offset)
                return None
            commit, coordinator_epoch = control
            return self._apply_marker(header, commit, coordinator_epoch)
        self.on_append(header)
        return None

    def _replay_empty_marker(self, header: BatchHeader) -> None:
        """A control batch the cleaner emptied (its transaction's data is all gone, Kafka's
        RETAIN_EMPTY): nothing to complete, only the producer's epoch moves."""
        self._map_end_offset = max(self._map_end_offset, header.next_offset)
        if header.producer_id >= 0:
            self._entry(header.producer_id).maybe_update_epoch(header.producer_epoch)
        return None

    def _entry(self, producer_id: int) -> ProducerStateEntry:
        entry = self._producers.get(producer_id)
        if entry is None:
            if len(self._producers) >= self.max_producers:
                self._evict_idlest()
            entry = self._producers[producer_id] = ProducerStateEntry(producer_id)
        return entry

    def _evict_idlest(self) -> None:
        """Forget the producer idle longest (never one with an open transaction), as its
        expiration would later: only a retry of its last batch could then be written twice."""
        idle = [e for e in self._producers.values() if not e.has_open_transaction]
        if idle:
            del self._producers[min(idle, key=lambda e: e.last_timestamp).producer_id]

    # -- stable offsets -----------------------------------------------------------------------

    def first_undecided_offset(self) -> int | None:
        """First offset of the earliest transaction without a marker."""
        return self._ongoing_offsets[0] if self._ongoing_offsets else None

    def first_unstable_offset(self) -> int | None:
        """First offset of the earliest transaction that is open, or closed by a marker not
        yet below the high watermark."""
        candidates = []
        if self._ongoing_offsets:
            candidates.append(self._ongoing_offsets[0])
        if self._unreplicated:
            candidates.append(self._unreplicated[0][0])
        return min(candidates) if candidates else None

    def on_high_watermark(self, high_watermark: int) -> None:
        """Markers below the high watermark are durable: their transactions are stable."""
        self._unreplicated = [t for t in self._unreplicated if t[1] >= high_watermark]

    def last_stable_offset(self, high_watermark: int) -> int:
        """min(first unstable offset, high watermark); read_committed reads stop there.

        A pure read: a closed transaction whose marker is below `high_watermark` is stable
        whether or not on_high_watermark (the partition's, when a flush completes) saw it yet.
        """
        stable = high_watermark
        if self._ongoing_offsets:
            stable = min(stable, self._ongoing_offsets[0])
        # sorted by first offset: the first one whose marker is not yet durable
        for first_offset, marker_offset in self._unreplicated:
            if marker_offset >= high_watermark:
                return min(stable, first_offset)
        return stable

    # -- inspection ---------------------------------------------------------------------------

    @property
    def map_end_offset(self) -> int:
        """The offset after the last batch applied: where a replay after a snapshot starts."""
        return self._map_end_offset

    def update_map_end_offset(self, offset: int) -> None:
        """Say that the log up to `offset` has been seen (batches without producer ids)."""
        self._map_end_offset = max(self._map_end_offset, offset)

    def open_transactions(self) -> list[OpenTxn]:
        """Open transactions, earliest first."""
        result = []
        for first_offset in self._ongoing_offsets:
            entry = self._producers[self._ongoing[first_offset]]
            result.append(
                OpenTxn(
                    entry.producer_id,
                    entry.producer_epoch,
                    first_offset,
                    entry.current_txn_start_timestamp,
                    entry.last_timestamp,
                )
            )
        return result

    def producer(self, producer_id: int) -> ProducerEntry | None:
        entry = self._producers.get(producer_id)
        return None if entry is None else _describe(entry)

    def producers(self) -> list[ProducerEntry]:
        """Every active producer, by producer id (DescribeProducers)."""
        return [_describe(self._producers[pid]) for pid in sorted(self._producers)]

    def batch_metadata(self, producer_id: int) -> tuple[BatchMetadata, ...]:
        """The producer's cached batches of its current epoch, oldest first."""
        entry = self._producers.get(producer_id)
        return () if entry is None else entry.batches

    def __len__(self) -> int:
        return len(self._producers)

    # -- expiration and snapshots -----------------------------------------------------------

    def _is_expired(self, entry: ProducerStateEntry, now: int) -> bool:
        # never a producer with an open transaction: its data must stay unstable until a marker
        return (
            not entry.has_open_transaction
            and now - entry.last_timestamp >= self.producer_id_expiration_ms
        )

    def remove_expired(self) -> list[int]:
        """Forget producers idle for producer.id.expiration.ms; returns their ids."""
        now = self._clock()
        expired = [pid for pid, e in self._producers.items() if self._is_expired(e, now)]
        for producer_id in expired:
            del self._producers[producer_id]
        return sorted(expired)

    def snapshot(self) -> bytes:
        """The producers and map_end_offset as versioned, CRC-32C protected bytes."""
        entries = (self._producers[pid] for pid in sorted(self._producers))
        return encode_snapshot(self._map_end_offset, entries)

    @classmethod
    def from_snapshot(
        cls,
        data: bytes | bytearray | memoryview,
        clock: Clock,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ) -> ProducerStateManager:
        """A manager holding a snapshot's state, expired producers left out (as Kafka loads).

        Raises CorruptSnapshotError; the caller then rebuilds by replaying the whole log.
        """
        decoded = decode_snapshot(data)
        manager = cls(clock, producer_id_expiration_ms)
        now = clock()
        for entry in decoded.entries:
            if manager._is_expired(entry, now):
                continue
            manager._producers[entry.producer_id] = entry
            if entry.has_open_transaction:
                if entry.current_txn_first_offset in manager._ongoing:
                    raise CorruptSnapshotError(
                        f"two open transactions start at offset {entry.current_txn_first_offset}"
                    )
                bisect.insort(manager._ongoing_offsets, entry.current_txn_first_offset)
                manager._ongoing[entry.current_txn_first_offset] = entry.producer_id
        manager._map_end_offset = decoded.map_end_offset
        return manager


def _describe(entry: ProducerStateEntry) -> ProducerEntry:
    return ProducerEntry(
        entry.producer_id,
        entry.producer_epoch,
        entry.last_sequence,
        entry.last_timestamp,
        entry.coordinator_epoch,
        entry.current_txn_first_offset,
    )
