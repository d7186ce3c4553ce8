"""One cleaning round over a log's batches: build the offset map, then filter and rewrite
(Kafka's Cleaner.buildOffsetMap / cleanInto and MemoryRecords.filterTo).

A record is kept when
- it is past the offset map's coverage (`offset > map.latest_offset`: cleaned next round), or
- it has a key, its offset is the latest mapped for that key, and it has a value or is a
  tombstone whose batch's delete horizon has not passed (a tombstone's batch gets the horizon
  `now + delete.retention.ms` the first time it is cleaned, KIP-534; later rounds at or after
  the horizon drop the tombstone);
- records of aborted transactions are dropped whatever their key; keyless records inside the
  cleaned range are dropped (compacted topics refuse them at Produce; Kafka's cleaner counts
  them as invalid and drops them).
Control batches (markers) are kept until CleanedTransactions says their transaction's data is
gone; the marker's batch then gets a delete horizon, and is dropped once it has passed.

Batches keep their base offset, last offset delta, producer id, epoch, base sequence,
partition leader epoch, timestamp type and transactional/control flags, so surviving records
keep their offsets and the last sequence of a batch is unchanged. A batch whose records all
stay (and needs no new horizon) is copied byte for byte; otherwise it is rebuilt with the same
codec. An emptied batch is still written, as a 61-byte header with no records, when it is its
producer's last batch (producer state after a restart) or the last batch before the round's
upper bound (the log's end offset), as Kafka's BatchRetention.RETAIN_EMPTY.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from onceflow.compaction.cleanable import (
    DEFAULT_DELETE_RETENTION_MS,
    SegmentInfo,
    group_segments_by_size,
)
from onceflow.compaction.cleaned_transactions import AbortedTransaction, CleanedTransactions
from onceflow.compaction.errors import CleanRangeError
from onceflow.compaction.offset_map import OffsetMap
from onceflow.compaction.producers import LastRecord, is_last_batch_of_producer
from onceflow.records.batch import (
    CONTROL_FLAG,
    CURRENT_MAGIC,
    DELETE_HORIZON_FLAG,
    HEADER_LAYOUT,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    check_batch,
    parse_header,
    set_attributes,
    set_crc,
    set_last_offset_delta,
)
from onceflow.records.builder import build_batch
from onceflow.records.control import parse_control_type
from onceflow.records.record import Record, decode_batch
from onceflow.records.saturating import saturated_add
from onceflow.records.varint import INT64_MAX, INT64_MIN

Buffer = bytes | bytearray | memoryview

_INT32_MAX = (1 << 31) - 1
DEFAULT_SEGMENT_BYTES = 1 << 30  # segment.bytes


class BatchRetention(Enum):
    """Kafka's RecordFilter.BatchRetention."""

    DELETE = "delete"  # drop the batch without looking at its records
    RETAIN_EMPTY = "retain_empty"  # keep the batch, empty if no record stays
    DELETE_EMPTY = "delete_empty"  # drop the batch if no record stays


@dataclass(slots=True)
class CleanerStats:
    """What a round read and wrote (Kafka's CleanerStats, without the clock)."""

    map_batches_read: int = 0
    map_records_read: int = 0
    map_bytes_read: int = 0
    batches_read: int = 0
    records_read: int = 0
    bytes_read: int = 0
    batches_written: int = 0
    records_written: int = 0
    bytes_written: int = 0
    invalid_records: int = 0  # keyless records dropped


def delete_horizon_ms(header: BatchHeader) -> int | None:
    """The batch's KIP-534 delete horizon (its base timestamp when the flag is set), or None."""
    if header.attributes & DELETE_HORIZON_FLAG:
        return header.base_timestamp
    return None


def build_offset_map(
    segments: Iterable[tuple[int, Iterable[Buffer]]],
    start_offset: int,
    end_offset: int,
    aborted: Iterable[AbortedTransaction],
    offset_map: OffsetMap,
    stats: CleanerStats | None = None,
) -> int:
    """Fill `offset_map` from the dirty section [start_offset, end_offset); return the offset
    the round can clean up to (exclusive): `end_offset`, or less when the map filled up.

    `segments` are (base offset, batches) of the segments holding the dirty section, in order,
    each batch one bytes-like; batches before `start_offset` are read but not mapped (Kafka
    starts at the index entry before it). Records of aborted transactions and control batches
    are not mapped. `end_offset` must be a segment boundary at or below the last stable offset
    (`cleanable_offsets` gives it); a batch reaching it raises CleanRangeError.
    """
    stats = stats if stats is not None else CleanerStats()
    offset_map.clear()
    txns = CleanedTransactions(aborted)
    pending = iter(segments)
    current = next(pending, None)
    while current is not None:
        following = next(pending, None)
        next_start = following[0] if following is not None else end_offset
        if _map_segment(current[1], offset_map, start_offset, end_offset, txns, stats):
            return offset_map.latest_offset + 1
        # a gap at the segment's end (cleaned away, or aborted) is covered too
        offset_map.update_latest_offset(next_start - 1)
        current = following
    return offset_map.latest_offset + 1


def _map_segment(
    batches: Iterable[Buffer],
    offset_map: OffsetMap,
    start_offset: int,
    end_offset: int,
    txns: CleanedTransactions,
    stats: CleanerStats,
) -> bool:
    """Map one segment's batches; True when the map filled up (the round stops there)."""
    for raw in batches:
        header = check_batch(raw)
        if header.last_offset >= end_offset:
            raise CleanRangeError(
                f"batch [{header.base_offset}, {header.last_offset}] reaches the end of the "
                f"cleanable range {end_offset}"
            )
        stats.map_batches_read += 1
        stats.map_bytes_read += header.size
        if header.is_control:
            txns.on_control_batch(header, _control_type(raw, header))
            stats.map_records_read += 1
        elif txns.on_data_batch(header):
            stats.map_records_read += header.records_count  # aborted: not mapped
        elif header.last_offset >= start_offset:
            for record in decode_batch(raw, verify_crc=False).records:
                if record.key is not None and record.offset >= start_offset:
                    if offset_map.is_full:
                        return True
                    offset_map.put(record.key, record.offset)
                stats.map_records_read += 1
        if header.last_offset >= start_offset:
            offset_map.update_latest_offset(header.last_offset)
    return False


def _control_type(raw: Buffer, header: BatchHeader) -> int | None:
    if header.records_count == 0:
        return None
    records = decode_batch(raw, verify_crc=False).records
    return parse_control_type(records[0]) if records else None


class CleanRound:
    """Filters batches for one cleaning round, group after group (Kafka's cleanSegments and
    cleanInto): state about transactions carries from one group to the next.

    `offset_map` is the map `build_offset_map` filled; `aborted` the partition's aborted
    transactions overlapping the cleaned range; `last_records` the active producers' last
    records (see producers.py); `now_ms` the round's current time; `upper_bound_offset` the
    first uncleanable offset (the last batch before it is kept, even empty).
    """

    def __init__(
        self,
        offset_map: OffsetMap,
        *,
        aborted: Iterable[AbortedTransaction],
        last_records: Mapping[int, LastRecord],
        now_ms: int,
        delete_retention_ms: int,
        upper_bound_offset: int,
    ) -> None:
        self.offset_map = offset_map
        self.transactions = CleanedTransactions(aborted)
        self.last_records = dict(last_records)
        self.now_ms = now_ms
        self.delete_retention_ms = delete_retention_ms
        self.upper_bound_offset = upper_bound_offset
        self.stats = CleanerStats()

    def clean(self, batches: Iterable[Buffer]) -> Iterator[bytes]:
        """The cleaned batches of one group of segments, in order (a generator: feed it the
        batches as they are read, write what it yields to the cleaned segment). After it is
        exhausted, `transactions.take_retained_aborted()` gives the group's `.txnindex`."""
        for raw in batches:
            cleaned = self.clean_batch(raw)
            if cleaned is not None:
                yield cleaned

    def clean_batch(self, raw: Buffer) -> bytes | None:
        """The cleaned form of one batch, or None when nothing of it stays."""
        header = check_batch(raw)  # never launder a corrupt batch into a fresh CRC
        if header.last_offset >= self.upper_bound_offset:
            raise CleanRangeError(
                f"batch [{header.base_offset}, {header.last_offset}] is at or past the first "
                f"uncleanable offset {self.upper_bound_offset}"
            )
        stats = self.stats
        stats.batches_read += 1
        stats.bytes_read += header.size
        decoded: list[Record] | None = None
        if header.is_control:
            decoded = decode_batch(raw, verify_crc=False).records
            control_type = parse_control_type(decoded[0]) if decoded else None
            can_discard = self.transactions.on_control_batch(header, control_type)
            horizon = delete_horizon_ms(header)
            # a removable marker still waits for its delete horizon, as tombstones do
            discard_records = can_discard and horizon is not None and horizon <= self.now_ms
        else:
            can_discard = self.transactions.on_data_batch(header)
            discard_records = can_discard
        marker_for_empty_txn = can_discard and header.is_control

        if header.has_producer_id and is_last_batch_of_producer(header, self.last_records):
            retention = BatchRetention.RETAIN_EMPTY
        elif header.next_offset == self.upper_bound_offset:
            # the round's last batch keeps the log's end offset after cleaning
            retention = BatchRetention.RETAIN_EMPTY
        elif discard_records:
            retention = BatchRetention.DELETE
        else:
            retention = BatchRetention.DELETE_EMPTY
        if retention is BatchRetention.DELETE:
            stats.records_read += header.records_count
            return None

        if decoded is None:
            decoded = decode_batch(raw, verify_crc=False).records
        stats.records_read += len(decoded)
        retained: list[Record] = []
        contains_tombstones = False
        for record in decoded:
            if discard_records:
                keep = False
            elif header.is_control:
                keep = True
            else:
                keep = self._should_retain_record(header, record)
            if keep:
                retained.append(record)
                if record.value is None:
                    contains_tombstones = True
        if retained:
            current_horizon = delete_horizon_ms(header)
            need_horizon = (contains_tombstones or marker_for_empty_txn) and current_horizon is None
            if len(retained) == len(decoded) and not need_horizon:
                out = bytes(memoryview(raw)[: header.size])
            else:
                # now + delete.retention.ms saturates: Long.MAX_VALUE means "keep forever"
                horizon = (
                    saturated_add(self.now_ms, self.delete_retention_ms)
                    if need_horizon
                    else current_horizon
                )
                out = rebuild_batch(header, retained, horizon)
        elif retention is BatchRetention.RETAIN_EMPTY:
            out = empty_batch(header)
        else:
            return None
        stats.batches_written += 1
        stats.records_written += len(retained)
        stats.bytes_written += len(out)
        return out

    def _should_retain_record(self, header: BatchHeader, record: Record) -> bool:
        offset_map = self.offset_map
        if record.offset > offset_map.latest_offset:
            return True  # past what the map covers: next round's business
        if record.key is None:
            self.stats.invalid_records += 1
            return False
        if record.offset < offset_map.get(record.key):
            return False  # a later record of the key exists
        if record.value is not None:
            return True
        horizon = delete_horizon_ms(header)
        return horizon is None or self.now_ms < horizon


def rebuild_batch(header: BatchHeader, records: list[Record], delete_horizon: int | None) -> bytes:
    """`records` (a non-empty subset of the batch's) as a batch with `header`'s fields (Kafka's
    buildRetainedRecordsInto): same base offset and last offset delta, so offsets and the last
    sequence do not move; same codec; the delete horizon, when given, as the base timestamp
    with the KIP-534 flag."""
    log_append_time = header.is_log_append_time
    base_timestamp = _base_timestamp(header, records, delete_horizon)
    out = bytearray(
        build_batch(
            records,
            base_offset=header.base_offset,
            compression=header.compression,
            producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
            transactional=header.is_transactional,
            control=header.is_control,
            timestamp_type=1 if log_append_time else 0,
            partition_leader_epoch=header.partition_leader_epoch,
            base_timestamp=base_timestamp,
            max_timestamp=header.max_timestamp if log_append_time else None,
        )
    )
    set_last_offset_delta(out, 0, header.last_offset_delta)
    if delete_horizon is not None:
        set_attributes(out, 0, parse_header(out).attributes | DELETE_HORIZON_FLAG)
    set_crc(out, 0, len(out))
    return bytes(out)


def _base_timestamp(header: BatchHeader, records: list[Record], delete_horizon: int | None) -> int:
    """The base timestamp of the rebuilt batch, such that every record's timestamp delta fits
    a varlong. The delete horizon, when given, is the base: past the oldest record's timestamp
    + 2^63 it saturates there (only records stamped near Long.MIN_VALUE bring it below a sane
    horizon; Java's `long` would wrap instead). Otherwise Kafka's choice, the first record's
    timestamp, unless a delta from it overflows (records stamped at both ends of the int64
    range): then the original base, from which every delta already fitted."""
    low = min(r.timestamp for r in records)
    if delete_horizon is not None:
        return min(delete_horizon, low - INT64_MIN)
    first = records[0].timestamp
    high = max(r.timestamp for r in records)
    if low - first >= INT64_MIN and high - first <= INT64_MAX:
        return first
    return header.base_timestamp


def empty_batch(header: BatchHeader) -> bytes:
    """The batch with no records Kafka writes for RETAIN_EMPTY (writeEmptyHeader): uncompressed,
    no base timestamp, the original max timestamp, offsets and producer fields."""
    attributes = header.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG | CONTROL_FLAG)
    out = bytearray(HEADER_SIZE)
    HEADER_LAYOUT.pack_into(
        out,
        0,
        header.base_offset,
        HEADER_SIZE - LOG_OVERHEAD,
        header.partition_leader_epoch,
        CURRENT_MAGIC,
        0,
        attributes,
        header.last_offset_delta,
        NO_TIMESTAMP,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        0,
    )
    set_crc(out, 0, len(out))
    return bytes(out)


@dataclass(slots=True)
class CleanedGroup:
    """One cleaned replacement segment: the base offset of the first segment it replaces, its
    batches, and the aborted transactions its `.txnindex` keeps."""

    base_offset: int
    replaces: list[int]
    batches: list[bytes]
    aborted: list[AbortedTransaction]


@dataclass(slots=True)
class CleanResult:
    end_offset: int  # the next round's first dirty offset (Kafka's cleaner checkpoint)
    groups: list[CleanedGroup]
    stats: CleanerStats = field(default_factory=CleanerStats)


@dataclass(frozen=True, slots=True)
class SegmentBatches:
    """One segment handed to `clean_segments`: its base offset and its batches, in order, one
    bytes-like each. `batches` is iterated up to three times (offset map, size, cleaning), so it
    is a list or an object whose `__iter__` reads the segment again."""

    base_offset: int
    batches: Iterable[Buffer]
    size: int | None = None  # bytes of the segment; summed from the batches when None


def clean_segments(
    segments: Sequence[SegmentBatches],
    *,
    first_dirty_offset: int,
    first_uncleanable_offset: int,
    aborted: Iterable[AbortedTransaction],
    last_records: Mapping[int, LastRecord],
    now_ms: int,
    delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS,
    offset_map: OffsetMap | None = None,
    max_segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> CleanResult:
    """One cleaning round (Kafka's Cleaner.doClean), sans IO: see the package docstring."""
    aborted = list(aborted)
    offset_map = offset_map if offset_map is not None else OffsetMap()
    stats = CleanerStats()
    dirty_from = 0
    for index, segment in enumerate(segments):
        if segment.base_offset <= first_dirty_offset:
            dirty_from = index
    dirty = [
        (s.base_offset, s.batches)
        for s in segments[dirty_from:]
        if s.base_offset < first_uncleanable_offset
    ]
    if first_dirty_offset >= first_uncleanable_offset:
        return CleanResult(first_dirty_offset, [], stats)  # nothing dirty: Kafka skips the log
    end_offset = build_offset_map(
        dirty, first_dirty_offset, first_uncleanable_offset, aborted, offset_map, stats
    )
    to_clean = [s for s in segments if s.base_offset < end_offset]
    infos = [
        SegmentInfo(
            s.base_offset,
            s.size if s.size is not None else sum(len(b) for b in s.batches),
            NO_TIMESTAMP,
            0,
        )
        for s in to_clean
    ]
    by_base = {s.base_offset: s for s in to_clean}
    clean_round = CleanRound(
        offset_map,
        aborted=aborted,
        last_records=last_records,
        now_ms=now_ms,
        delete_retention_ms=delete_retention_ms,
        upper_bound_offset=first_uncleanable_offset,
    )
    clean_round.stats = stats
    groups: list[CleanedGroup] = []
    # index sizes are the broker's concern: it passes real ones when it groups by itself
    for group in group_segments_by_size(
        infos, max_segment_bytes, _INT32_MAX, first_uncleanable_offset
    ):
        batches = list(
            clean_round.clean(b for info in group for b in by_base[info.base_offset].batches)
        )
        groups.append(
            CleanedGroup(
                group[0].base_offset,
                [info.base_offset for info in group],
                batches,
                clean_round.transactions.take_retained_aborted(),
            )
        )
    return CleanResult(end_offset, groups, stats)
