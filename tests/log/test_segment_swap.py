"""Swapping cleaned segments into a log (swap.py): a crash at every step, and between every
two renames of a step, leaves a log that reopens to the records from before the clean or
from after it, never a mix and never a gap; appends and reads go on around a swap."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from tests.log.log_batches import batches, make_batch, split_batches

from onceflow.log import swap
from onceflow.log.config import LogConfig
from onceflow.log.errors import SegmentsChangedError
from onceflow.log.partition_log import PartitionLog
from onceflow.log.swap import CleanedSegmentWriter
from onceflow.records.batch import iter_batches

CONFIG = LogConfig(segment_bytes=700, index_interval_bytes=120)
POINTS = [
    "cleaner.after-swap-rename",
    "cleaner.after-deleted-rename",
    "cleaner.after-swap-complete",
]


class Crashed(Exception):
    pass


def _fill(log: PartitionLog, count: int) -> None:
    for n in range(count):
        log.append(*batches(make_batch(2, value=b"x" * 15 + str(n).encode())))


def _sync(log: PartitionLog) -> None:
    ticket = log.prepare_flush()
    if ticket is not None:
        ticket.run()
        log.complete_flush(ticket)


def _write_cleaned(log: PartitionLog, group_size: int) -> tuple[int, list, bytes]:
    """The first `group_size` segments cleaned into one: every other batch dropped, the
    group's last batch kept (as the cleaner keeps it). Returns (base, replaced, its bytes)."""
    replaced = log.segments_below(log.log_end_offset)[:group_size]
    writer = CleanedSegmentWriter(log.directory, replaced[0].base_offset, CONFIG, 0)
    kept = []
    all_batches = [b for s in replaced for _, b in s.iter_batches(0, with_bytes=True)]
    for n, raw in enumerate(all_batches):
        if n % 2 == 0 or n == len(all_batches) - 1:
            writer.write(raw)
            kept.append(raw)
    writer.finish(b"")
    return replaced[0].base_offset, replaced, b"".join(kept)


def _records(log: PartitionLog) -> list[tuple[int, int]]:
    data = log.read(log.log_start_offset, 1 << 30).data
    return [(h.base_offset, h.last_offset) for h in split_batches(data)]


@pytest.fixture
def prepared(
    open_log: Callable[..., PartitionLog],
) -> tuple[PartitionLog, list[tuple[int, int]]]:
    log = open_log(CONFIG)
    _fill(log, 40)
    _sync(log)
    assert len(log.segment_base_offsets) >= 5
    return log, _records(log)


def _after(before: list[tuple[int, int]], cleaned: bytes, replaced_end: int):
    kept = [(h.base_offset, h.last_offset) for _, h in iter_batches(cleaned)]
    return kept + [b for b in before if b[0] >= replaced_end]


@pytest.mark.parametrize("point", POINTS)
def test_crash_after_each_step(prepared, open_log, point: str) -> None:
    log, before = prepared
    base, replaced, cleaned = _write_cleaned(log, 3)
    after = _after(before, cleaned, log.segment_base_offsets[3])

    def crash(name: str) -> None:
        if name == point:
            raise Crashed(name)

    with pytest.raises(Crashed):
        log.replace_segments(base, replaced, crash)
    log._abandon()
    reopened = open_log(CONFIG)
    assert _records(reopened) == after  # every point is past the commit point
    assert not [p for p in reopened.directory.iterdir() if p.suffix in (".swap", ".deleted")]


def test_crash_before_the_swap_keeps_the_old_segments(prepared, open_log) -> None:
    log, before = prepared
    _write_cleaned(log, 3)
    log._abandon()
    reopened = open_log(CONFIG)
    assert _records(reopened) == before
    assert not list(reopened.directory.glob("*.cleaned"))


def test_crash_between_any_two_renames(prepared, open_log, monkeypatch) -> None:
    """Every intermediate state of the directory reopens to before or after, and which one
    only moves once (at the `.log.swap` rename)."""
    log, before = prepared
    directory = log.directory
    snapshot = {p.name: p.read_bytes() for p in directory.iterdir()}
    log._abandon()
    renames = 0
    outcomes = []
    real_rename = os.rename
    while True:
        for p in directory.iterdir():
            p.unlink()
        for name, data in snapshot.items():
            (directory / name).write_bytes(data)
        log = open_log(CONFIG)
        base, replaced, cleaned = _write_cleaned(log, 3)
        after = _after(before, cleaned, log.segment_base_offsets[3])
        done = 0

        def rename(src, dst, *, stop=renames):
            nonlocal done
            if done == stop:
                raise Crashed(f"before rename {stop}")
            real_rename(src, dst)
            done += 1

        monkeypatch.setattr(swap.os, "rename", rename)
        try:
            log.replace_segments(base, replaced)
            finished = True
        except Crashed:
            finished = False
        monkeypatch.setattr(swap.os, "rename", real_rename)
        log._abandon()
        reopened = open_log(CONFIG)
        got = _records(reopened)
        assert got in (before, after), f"crash before rename {renames}"
        outcomes.append(got == after)
        reopened._abandon()
        if finished:
            break
        renames += 1
    assert renames >= 6
    # before until the commit point, after from it on
    assert outcomes == sorted(outcomes)
    assert outcomes[0] is False and outcomes[-1] is True


def test_appends_and_reads_go_on_around_a_swap(prepared, open_log) -> None:
    log, before = prepared
    base, replaced, cleaned = _write_cleaned(log, 2)
    end_before = log.log_end_offset
    _fill(log, 5)  # appends during the clean: the active segment is never swapped
    new = [r for r in _records(log) if r[0] >= end_before]
    log.replace_segments(base, replaced)
    after = _after(before, cleaned, log.segment_base_offsets[1]) + new
    assert _records(log) == after
    # a read from an offset the clean removed starts at the next batch kept
    gone = before[1][0]
    assert gone not in [r[0] for r in after]
    first = split_batches(log.read(gone, 1).data)[0]
    assert first.base_offset > gone
    # the same segments cannot be swapped twice
    with pytest.raises(SegmentsChangedError):
        log.replace_segments(base, replaced)
    log.close()
    assert _records(open_log(CONFIG)) == after


def test_a_clean_that_lost_its_segments_is_refused(prepared) -> None:
    log, _ = prepared
    base, replaced, _ = _write_cleaned(log, 2)
    log.config = LogConfig(segment_bytes=700, index_interval_bytes=120, retention_bytes=1)
    assert log.delete_expired_segments() > 0
    with pytest.raises(SegmentsChangedError):
        log.replace_segments(base, replaced)
