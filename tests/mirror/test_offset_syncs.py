"""The offset syncs' translation index against a brute-force model of two logs: a source whose
committed records have gaps (aborted records, markers) and a target with gaps of its own."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.mirror.checkpoints import Checkpoint, CheckpointError
from onceflow.mirror.offset_syncs import (
    OffsetIndex,
    OffsetSync,
    OffsetSyncError,
    offset_syncs,
    offset_syncs_topic,
    runs_of,
)

TOPIC = "source.orders"


Case = tuple[list[OffsetSync], list[tuple[int, int]]]


@st.composite
def mirrored(draw: st.DrawFn) -> Case:
    """Syncs as the mirror's transactions write them, and every (source, target) pair."""
    gaps = draw(st.lists(st.integers(0, 3), min_size=1, max_size=60))  # gap before each record
    cuts = draw(st.lists(st.booleans(), min_size=len(gaps), max_size=len(gaps)))
    # a transaction whose target offsets are not known (another producer wrote in between)
    unknown = draw(st.lists(st.booleans(), min_size=len(gaps), max_size=len(gaps)))
    target_gaps = draw(st.lists(st.integers(0, 2), min_size=len(gaps), max_size=len(gaps)))
    has_position = draw(st.booleans())
    per_record = draw(st.integers(1, 4))  # runs per sync record (a long transaction: several)
    source, target = [], []
    s, t = draw(st.integers(0, 5)), 0
    for gap, target_gap in zip(gaps, target_gaps, strict=True):
        s += gap
        t += target_gap
        source.append(s)
        target.append(t)
        s, t = s + 1, t + 1
    syncs: list[OffsetSync] = []
    position = 0 if has_position else -1
    first = 0
    for i in range(len(source)):
        if cuts[i] or i == len(source) - 1:  # a transaction ends after record i
            start = position if position >= 0 else source[first]
            end = source[i] + 1
            if unknown[i]:
                syncs.append(OffsetSync(TOPIC, 0, start, end, ()))
            else:
                runs = runs_of(source[first : i + 1], target[first : i + 1])
                syncs += offset_syncs(TOPIC, 0, start, runs, per_record)
            position, first = end, i + 1
    return syncs, list(zip(source, target, strict=True))


def check(index: OffsetIndex, syncs: list[OffsetSync], pairs: list[tuple[int, int]]) -> None:
    """For every source offset S: translated iff a sync with runs covers it (its end included:
    the mirror's position then); and a consumer starting at the answer reads exactly the
    records from S on, and every record copied later."""
    for offset in range(-1, syncs[-1].end + 3):
        answer = index.translate(TOPIC, 0, offset)
        known = any(sync.runs and sync.start <= offset <= sync.end for sync in syncs)
        assert (answer is not None) == known, offset
        if answer is not None:
            assert {s for s, t in pairs if t >= answer} == {s for s, _ in pairs if s >= offset}
            assert answer <= pairs[-1][1] + 1, "beyond what is copied"


@given(mirrored(), st.data())
def test_translation_is_exact_and_never_ahead(case: Case, data: st.DataObject) -> None:
    syncs, pairs = case
    index = OffsetIndex()
    for sync in syncs:
        index.add(OffsetSync.decode(sync.value()))  # through the bytes, as read back
    check(index, syncs, pairs)
    # incrementally: the first syncs alone answer for what they cover, nothing beyond
    cut = data.draw(st.integers(1, len(syncs)))
    partial = OffsetIndex()
    for sync in syncs[:cut]:
        partial.add(sync)
    check(partial, syncs[:cut], [(s, t) for s, t in pairs if s < syncs[cut - 1].end])


def test_runs_break_where_either_log_skips() -> None:
    assert runs_of([5, 6, 7, 9, 10], [0, 1, 3, 4, 5]) == [(5, 0, 2), (7, 3, 1), (9, 4, 2)]


def test_other_partitions_and_holes_are_not_translated() -> None:
    index = OffsetIndex()
    index.add(OffsetSync(TOPIC, 0, 0, 10, ((0, 0, 10),)))
    index.add(OffsetSync(TOPIC, 0, 20, 30, ((20, 11, 10),)))  # [10, 20) never covered
    assert index.translate(TOPIC, 1, 3) is None
    assert index.translate(TOPIC, 0, 10) == 10  # the position of the first interval
    assert index.translate(TOPIC, 0, 15) is None
    assert index.translate(TOPIC, 0, 25) == 16


def test_a_copy_made_again_replaces_the_older_mapping() -> None:
    """A mirror whose position was reset copies records again: the newest copy counts."""
    index = OffsetIndex()
    index.add(OffsetSync(TOPIC, 0, 0, 10, ((0, 0, 10),)))
    index.add(OffsetSync(TOPIC, 0, 5, 12, ((5, 11, 7),)))
    assert index.translate(TOPIC, 0, 3) == 3
    assert index.translate(TOPIC, 0, 6) == 12
    assert index.translate(TOPIC, 0, 12) == 18


def test_foreign_sync_records_are_refused() -> None:
    with pytest.raises(OffsetSyncError):
        OffsetSync.decode(b"not json")
    with pytest.raises(OffsetSyncError, match="outside"):
        OffsetSync.decode(OffsetSync(TOPIC, 0, 5, 6, ((1, 0, 1),)).value())
    assert offset_syncs_topic("east") == "onceflow-offset-syncs.east.internal"


def test_checkpoint_bytes_are_mirrormaker2s() -> None:
    """MM2's Checkpoint: key (group, topic, partition), value (version 0, upstream, offset,
    metadata), Kafka's STRING = INT16 length + UTF-8, big-endian integers."""
    checkpoint = Checkpoint("app", "source.orders", 1, 57, 41, "m")
    assert checkpoint.key() == b"\x00\x03app\x00\x0dsource.orders\x00\x00\x00\x01"
    assert checkpoint.value() == (
        b"\x00\x00" + (57).to_bytes(8, "big") + (41).to_bytes(8, "big") + b"\x00\x01m"
    )
    assert Checkpoint.decode(checkpoint.key(), checkpoint.value()) == checkpoint
    with pytest.raises(CheckpointError):
        Checkpoint.decode(checkpoint.key(), b"\x00\x01" + checkpoint.value()[2:])
