"""One producer's state on one partition: epoch, the last five batches, the open transaction.

Kafka's ProducerStateEntry and BatchMetadata. The batch cache is ordered oldest first, holds at
most NUM_BATCHES_TO_RETAIN batches of the current epoch and is cleared when the epoch changes;
a retried batch is a duplicate only if it matches one of them exactly.

Beyond Kafka, each cached batch keeps the CRC its producer sent: a retry carries the same bytes,
so a batch with a cached sequence range but another CRC is not a retry but the producer reusing
sequence numbers (librdkafka does, see ProducerStateManager.check_append). Kafka would answer it
as a duplicate, and its records would be lost while acknowledged.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import InitVar, dataclass, field, replace

from onceflow.records.batch import NO_PRODUCER_EPOCH, NO_SEQUENCE, NO_TIMESTAMP

NUM_BATCHES_TO_RETAIN = 5
NO_COORDINATOR_EPOCH = -1
NO_OFFSET = -1
_SEQUENCE_MODULUS = 1 << 31  # sequences wrap from Int32.MAX to 0


def decrement_sequence(sequence: int, decrement: int) -> int:
    """`sequence - decrement`, wrapping below 0 to Int32.MAX as sequences do."""
    return (sequence - decrement) % _SEQUENCE_MODULUS


def in_sequence(last_sequence: int, next_sequence: int) -> bool:
    """True when `next_sequence` directly follows `last_sequence` (0 follows Int32.MAX)."""
    return next_sequence == last_sequence + 1 or (
        next_sequence == 0 and last_sequence == _SEQUENCE_MODULUS - 1
    )


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What is kept of an appended batch: enough to answer a retry with the original offsets."""

    last_sequence: int
    last_offset: int
    offset_delta: int  # last offset - first offset of the batch
    timestamp: int  # the batch's max timestamp
    # The CRC the producer sent (None: unknown, as for a LogAppendTime batch, whose CRC the
    # broker rewrote, or one restored from a snapshot written before CRCs were kept).
    crc: int | None = None

    @property
    def first_sequence(self) -> int:
        if self.last_sequence == NO_SEQUENCE:
            return NO_SEQUENCE  # written without sequences (the group coordinator's batches)
        return decrement_sequence(self.last_sequence, self.offset_delta)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta

    def is_retried_by(self, crc: int) -> bool:
        """Whether a batch with this batch's sequence range and `crc` can be its retry."""
        return self.crc is None or self.crc == crc


@dataclass(slots=True)
class ProducerStateEntry:
    """Mutable state of one producer id; owned by its partition's ProducerStateManager.

    Equal when every field and the cached batches are (snapshot round trips compare them).
    """

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    coordinator_epoch: int = NO_COORDINATOR_EPOCH
    last_timestamp: int = NO_TIMESTAMP
    current_txn_first_offset: int = NO_OFFSET
    current_txn_start_timestamp: int = NO_TIMESTAMP
    batches_init: InitVar[Iterable[BatchMetadata]] = ()
    _batches: deque[BatchMetadata] = field(init=False)

    def __post_init__(self, batches_init: Iterable[BatchMetadata]) -> None:
        self._batches = deque(batches_init, maxlen=NUM_BATCHES_TO_RETAIN)

    @property
    def batches(self) -> tuple[BatchMetadata, ...]:
        """The cached batches of the current epoch, oldest first."""
        return tuple(self._batches)

    @property
    def is_empty(self) -> bool:
        """No cached batch (new producer, or the epoch changed since its last data batch)."""
        return not self._batches

    @property
    def last_sequence(self) -> int:
        return self._batches[-1].last_sequence if self._batches else NO_SEQUENCE

    @property
    def has_open_transaction(self) -> bool:
        return self.current_txn_first_offset >= 0

    def find_duplicate(
        self, producer_epoch: int, first_seq: int, last_seq: int
    ) -> BatchMetadata | None:
        """The cached batch with exactly this epoch and sequence range, if any."""
        if producer_epoch != self.producer_epoch:
            return None
        for batch in self._batches:
            if batch.first_sequence == first_seq and batch.last_sequence == last_seq:
                return batch
        return None

    def maybe_update_epoch(self, producer_epoch: int) -> None:
        # the cached sequences belong to the old epoch: a new epoch restarts at sequence 0
        if producer_epoch != self.producer_epoch:
            self._batches.clear()
            self.producer_epoch = producer_epoch

    def add_batch(self, producer_epoch: int, metadata: BatchMetadata) -> None:
        self.maybe_update_epoch(producer_epoch)
        self._batches.append(metadata)  # the deque's maxlen drops the oldest
        self.last_timestamp = metadata.timestamp

    def end_transaction(self, producer_epoch: int, coordinator_epoch: int, timestamp: int) -> None:
        """Apply a COMMIT/ABORT marker: the transaction is closed, the epoch may move on."""
        self.maybe_update_epoch(producer_epoch)
        self.coordinator_epoch = coordinator_epoch
        self.current_txn_first_offset = NO_OFFSET
        self.current_txn_start_timestamp = NO_TIMESTAMP
        self.last_timestamp = timestamp

    def copy(self) -> ProducerStateEntry:
        return replace(self, batches_init=self._batches)

    def __repr__(self) -> str:
        return (
            f"ProducerStateEntry(producer_id={self.producer_id}, epoch={self.producer_epoch}, "
            f"coordinator_epoch={self.coordinator_epoch}, last_timestamp={self.last_timestamp}, "
            f"current_txn_first_offset={self.current_txn_first_offset}, "
            f"batches={list(self._batches)})"
        )
