"""A partition log reduced to batch headers, driving a ProducerStateManager as the broker
does, and the checks the producer-state tests share."""

from __future__ import annotations

from dataclasses import replace

from onceflow.clock import ManualClock
from onceflow.log.producer_state import CompletedTxn, DuplicateBatch, ProducerStateManager
from onceflow.records.batch import (
    CONTROL_FLAG,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_SEQUENCE,
    TRANSACTIONAL_FLAG,
    BatchHeader,
)

T0 = 1_700_000_000_000


def data(
    pid: int,
    epoch: int,
    seq: int,
    count: int = 1,
    *,
    txn: bool = False,
    ts: int = T0,
    crc: int = 0,
    attributes: int = 0,
) -> BatchHeader:
    """A data batch header as a client sends it (base offset 0)."""
    return BatchHeader(
        base_offset=0,
        batch_length=HEADER_SIZE - LOG_OVERHEAD + 10 * count,
        partition_leader_epoch=-1,
        magic=2,
        crc=crc,
        attributes=attributes | (TRANSACTIONAL_FLAG if txn else 0),
        last_offset_delta=count - 1,
        base_timestamp=ts,
        max_timestamp=ts,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        records_count=count,
    )


class Partition:
    """A partition log reduced to offsets, driving the manager as the broker does."""

    def __init__(self, clock: ManualClock | None = None, expiration_ms: int = 86_400_000) -> None:
        self.clock = clock or ManualClock(T0)
        self.psm = ProducerStateManager(self.clock, expiration_ms)
        self.log: list[tuple[BatchHeader, tuple[bool, int] | None]] = []
        self.end = 0

    def produce(self, header: BatchHeader, **kwargs: object) -> DuplicateBatch | tuple[int, int]:
        duplicate = self.psm.check_append(header, **kwargs)  # type: ignore[arg-type]
        if duplicate is not None:
            return duplicate
        assigned = with_offset(header, self.end)
        self.log.append((assigned, None))
        self.end = assigned.next_offset
        self.psm.on_append(assigned)
        return assigned.base_offset, assigned.last_offset

    def marker(
        self, pid: int, epoch: int, commit: bool, coordinator_epoch: int = 0, **kwargs: object
    ) -> CompletedTxn | None:
        self.psm.check_marker(pid, epoch, coordinator_epoch, **kwargs)  # type: ignore[arg-type]
        header = marker_header(self.end, pid, epoch, self.clock())
        self.log.append((header, (commit, coordinator_epoch)))
        self.end += 1
        return self.psm.on_marker(header, commit, coordinator_epoch, **kwargs)  # type: ignore[arg-type]


def marker_header(offset: int, pid: int, epoch: int, ts: int) -> BatchHeader:
    """A COMMIT/ABORT marker batch's header at `offset`, as the log holds it."""
    return BatchHeader(
        offset, HEADER_SIZE - LOG_OVERHEAD + 20, -1, 2, 0,
        TRANSACTIONAL_FLAG | CONTROL_FLAG, 0, ts, ts, pid, epoch, NO_SEQUENCE, 1,
    )  # fmt: skip


def assert_restore_and_replay_match(
    snapshot: bytes,
    log: list[tuple[BatchHeader, tuple[bool, int] | None]],
    from_index: int,
    live: ProducerStateManager,
    clock: ManualClock,
) -> tuple[ProducerStateManager, ProducerStateManager]:
    """Restore `snapshot` (taken when the log held `from_index` batches), replay the rest of
    the log, and check it equals a replay of the whole log and the live state; return both."""
    restored = ProducerStateManager.from_snapshot(snapshot, clock)
    for header, control in log[from_index:]:
        restored.replay(header, control)
    full = ProducerStateManager(clock)
    for header, control in log:
        full.replay(header, control)
    assert state_of(restored) == state_of(full) == state_of(live)
    return restored, full


def with_offset(header: BatchHeader, offset: int) -> BatchHeader:
    return replace(header, base_offset=offset)


def state_of(psm: ProducerStateManager) -> tuple[object, ...]:
    return (
        psm.producers(),
        psm.open_transactions(),
        {p.producer_id: psm.batch_metadata(p.producer_id) for p in psm.producers()},
        psm.map_end_offset,
        psm.first_undecided_offset(),
    )
