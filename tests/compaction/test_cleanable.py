"""Planning a round: Kafka's LogCleanerManager (cleanable range, dirty ratio, compaction lags)
and Cleaner.groupSegmentsBySize."""

from __future__ import annotations

from onceflow.compaction import (
    CompactedLog,
    SegmentInfo,
    group_segments_by_size,
    log_to_clean,
    should_clean,
)
from onceflow.compaction.cleanable import cleanable_offsets

NOW = 1_000_000


def seg(base: int, size: int = 100, largest: int = 0, first: int = 0) -> SegmentInfo:
    return SegmentInfo(base, size, largest, 0, first)


LOG = [seg(0), seg(10), seg(20), seg(30)]  # 30 is the active segment


def plan(segments=LOG, *, checkpoint=None, lso=40, end=40, **kw):  # type: ignore[no-untyped-def]
    log = CompactedLog(
        segments, log_start_offset=0, log_end_offset=end, last_stable_offset=lso, **kw
    )
    return log_to_clean(log, checkpoint, NOW)


def test_never_the_active_segment() -> None:
    candidate, _ = plan()
    assert (candidate.first_dirty_offset, candidate.first_uncleanable_offset) == (0, 30)
    assert candidate.cleanable_bytes == 300


def test_never_at_or_past_the_last_stable_offset_rounded_down_to_a_segment() -> None:
    # an open transaction from offset 15: the segment holding it is not cleaned
    candidate, offsets = plan(lso=15)
    assert offsets.first_uncleanable_offset == 15
    assert candidate.first_uncleanable_offset == 10
    assert candidate.cleanable_bytes == 100


def test_dirty_ratio_against_min_cleanable_dirty_ratio() -> None:
    candidate, _ = plan(checkpoint=20)  # segments 0 and 10 clean, 20 dirty
    assert (candidate.clean_bytes, candidate.cleanable_bytes) == (200, 100)
    assert candidate.cleanable_ratio == 100 / 300
    assert should_clean(candidate, 0.3)
    assert not should_clean(candidate, 0.5)


def test_min_compaction_lag_holds_back_young_segments() -> None:
    segments = [seg(0, largest=NOW - 5_000), seg(10, largest=NOW - 100), seg(20), seg(30)]
    candidate, _ = plan(segments, min_compaction_lag_ms=1_000)
    assert candidate.first_uncleanable_offset == 10


def test_max_compaction_lag_forces_a_clean_below_the_ratio() -> None:
    segments = [seg(0), seg(10), seg(20, first=NOW - 10_000), seg(30)]
    candidate, _ = plan(segments, checkpoint=20, max_compaction_lag_ms=1_000)
    assert candidate.needs_compaction_now and candidate.compaction_delay_ms == 9_000
    assert should_clean(candidate, 0.99)
    relaxed, _ = plan(segments, checkpoint=20, max_compaction_lag_ms=60_000)
    assert not relaxed.needs_compaction_now and not should_clean(relaxed, 0.99)


def test_nothing_dirty_is_not_cleaned_even_when_overdue() -> None:
    segments = [seg(0, first=1), seg(10)]
    candidate, _ = plan(segments, checkpoint=10, end=12, lso=12, max_compaction_lag_ms=1)
    assert candidate.cleanable_bytes == 0 and not should_clean(candidate, 0.0)


def test_an_invalid_checkpoint_is_reset_to_the_log_start() -> None:
    log = CompactedLog(LOG, log_start_offset=5, log_end_offset=40, last_stable_offset=40)
    offsets = cleanable_offsets(log, 99, NOW)
    assert (offsets.first_dirty_offset, offsets.force_update_checkpoint) == (5, True)


def test_segments_are_grouped_up_to_the_segment_size() -> None:
    segments = [seg(0, 40), seg(10, 40), seg(20, 40), seg(30, 90), seg(40, 0), seg(50, 10)]
    groups = group_segments_by_size(segments, 100, 1 << 20, 60)
    assert [[s.base_offset for s in g] for g in groups] == [[0, 10], [20], [30, 40, 50]]


def test_groups_never_span_more_than_int32_offsets() -> None:
    segments = [seg(0, 1), seg(1 << 31, 1), seg((1 << 31) + 5, 1)]
    groups = group_segments_by_size(segments, 1 << 30, 1 << 20, (1 << 31) + 10)
    assert [[s.base_offset for s in g] for g in groups] == [[0], [1 << 31, (1 << 31) + 5]]
