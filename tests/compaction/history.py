"""A partition's history written as the broker stores it, for the cleaner's tests: batches
with assigned offsets, segments rolled by batch count, the aborted-transaction list, and what
each record is (committed, aborted, still open) so tests can compute the expected result."""

from __future__ import annotations

from dataclasses import dataclass, field

from onceflow.compaction import SegmentBatches
from onceflow.log.aborted_index import AbortedTxn
from onceflow.records.batch import iter_batches, parse_header
from onceflow.records.builder import build_batch
from onceflow.records.control import build_marker
from onceflow.records.record import Record, iter_decoded_batches


@dataclass
class History:
    """Batches appended in order; `roll()` starts a new segment."""

    segments: list[list[bytes]] = field(default_factory=lambda: [[]])
    bases: list[int] = field(default_factory=lambda: [0])
    next_offset: int = 0
    aborted: list[AbortedTxn] = field(default_factory=list)
    aborted_offsets: set[int] = field(default_factory=set)  # data records of aborted txns
    open_txns: dict[int, list[int]] = field(default_factory=dict)  # pid -> offsets so far
    sequences: dict[int, int] = field(default_factory=dict)
    timestamp: int = 1_000

    def roll(self) -> None:
        if self.segments[-1]:
            self.segments.append([])
            self.bases.append(self.next_offset)

    def append(self, batch: bytes) -> bytes:
        self.segments[-1].append(batch)
        self.next_offset = parse_header(batch).next_offset
        return batch

    def data(
        self,
        records: list[tuple[bytes | None, bytes | None]],
        *,
        producer_id: int = -1,
        producer_epoch: int = 0,
        transactional: bool = False,
        compression: int = 0,
    ) -> bytes:
        self.timestamp += 1
        base_sequence = -1
        epoch = -1
        if producer_id >= 0:
            epoch = producer_epoch
            base_sequence = self.sequences.get(producer_id, 0)
            self.sequences[producer_id] = base_sequence + len(records)
        batch = build_batch(
            [(k, v, (), self.timestamp) for k, v in records],
            base_offset=self.next_offset,
            compression=compression,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=base_sequence,
            transactional=transactional,
        )
        if transactional:
            offsets = range(self.next_offset, self.next_offset + len(records))
            self.open_txns.setdefault(producer_id, []).extend(offsets)
        return self.append(batch)

    def end_txn(self, producer_id: int, *, commit: bool, producer_epoch: int = 0) -> bytes:
        self.timestamp += 1
        offsets = self.open_txns.pop(producer_id, [])
        marker_offset = self.next_offset
        if not commit and offsets:
            self.aborted.append(AbortedTxn(producer_id, offsets[0], marker_offset, marker_offset))
            self.aborted_offsets.update(offsets)
        return self.append(
            build_marker(producer_id, producer_epoch, commit, 0, self.timestamp, marker_offset)
        )

    def segment_batches(self) -> list[SegmentBatches]:
        return [SegmentBatches(b, list(s)) for b, s in zip(self.bases, self.segments, strict=True)]

    def records(self) -> list[Record]:
        """Every data record of the history, in offset order."""
        return records_of(b for s in self.segments for b in s)


def records_of(batches) -> list[Record]:  # type: ignore[no-untyped-def]
    out: list[Record] = []
    for batch in batches:
        for decoded in iter_decoded_batches(batch):
            if not decoded.header.is_control:
                out.extend(decoded.records)
    return out


def check_valid(batches: list[bytes]) -> None:
    """Each batch walks with CRC checks and decodes; offsets strictly increase."""
    buf = b"".join(batches)
    last = -1
    for _, header in iter_batches(buf, verify_crc=True):
        assert header.base_offset > last, "batch offsets go backwards"
        last = header.last_offset
    for _ in iter_decoded_batches(buf):
        pass


def apply(segments: list[SegmentBatches], result) -> list[SegmentBatches]:  # type: ignore[no-untyped-def]
    """The log after swapping the cleaned groups in for the segments they replace."""
    replaced = {base for group in result.groups for base in group.replaces}
    out = [SegmentBatches(g.base_offset, g.batches) for g in result.groups]
    out += [s for s in segments if s.base_offset not in replaced]
    return sorted(out, key=lambda s: s.base_offset)


def all_batches(segments: list[SegmentBatches]) -> list[bytes]:
    return [bytes(b) for s in segments for b in s.batches]


def more(segments: list[SegmentBatches], key: bytes = b"new") -> list[SegmentBatches]:
    """`segments` plus a new active segment of one record: the old active segment becomes
    cleanable and there is something dirty, so a round runs (Kafka skips clean logs)."""
    last = parse_header(all_batches(segments)[-1])
    batch = build_batch([(key, b"1", (), 99)], base_offset=last.next_offset)
    return [*segments, SegmentBatches(last.next_offset, [batch])]
