"""One owner of "the high watermark moved": a completed flush of a partition's log updates its
producer state and wakes its readers, there and nowhere else (no caller calls notify, no read
changes state)."""

from __future__ import annotations

from pathlib import Path

from onceflow.clock import ManualClock
from onceflow.log.unified_log import UnifiedLog
from onceflow.records.batch import iter_batches
from onceflow.records.builder import build_batch
from onceflow.simulation.broker import open_partition
from onceflow.simulation.storage import SimulatedLog

PRODUCER_ID = 7


def _transaction_then_commit(tmp_path: Path) -> tuple[UnifiedLog, SimulatedLog, list[str]]:
    clock = ManualClock(1_700_000_000_000)
    log = SimulatedLog(tmp_path / "t-0")
    partition = open_partition(("t", 0), log, clock)
    woken: list[str] = []
    partition.listeners.add(lambda: woken.append("reader"))
    data = build_batch(
        [(b"k", b"v", (), clock())],
        producer_id=PRODUCER_ID,
        producer_epoch=0,
        base_sequence=0,
        transactional=True,
    )
    info = log.append(data, list(iter_batches(data, verify_crc=False)))
    partition.after_append([header for _, header in info.headers])
    partition.append_marker(PRODUCER_ID, 0, True, 0, clock())
    return partition, log, woken


def test_a_completed_flush_makes_the_transaction_stable_and_wakes_readers(
    tmp_path: Path,
) -> None:
    partition, log, woken = _transaction_then_commit(tmp_path)
    producers = partition.producers
    assert woken == []
    assert producers.first_unstable_offset() == 0  # the marker is not durable yet
    assert partition.last_stable_offset == 0
    log.complete_flush(log.prepare_flush())
    assert woken == ["reader"]
    assert producers.first_unstable_offset() is None  # applied by the flush, not by a read
    assert partition.last_stable_offset == log.log_end_offset == 2


def test_reads_change_nothing_and_a_flush_that_moves_nothing_wakes_nobody(
    tmp_path: Path,
) -> None:
    partition, log, woken = _transaction_then_commit(tmp_path)
    producers = partition.producers
    assert producers.last_stable_offset(log.log_end_offset) == 2
    assert producers.first_unstable_offset() == 0  # still: a read is a read
    log.complete_flush(log.prepare_flush())
    log.complete_flush(log.prepare_flush())  # nothing new: the high watermark stays
    assert woken == ["reader"]
