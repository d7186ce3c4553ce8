"""Which part of a compacted log a cleaning round may clean, and whether it is worth it
(Kafka's LogCleanerManager.cleanableOffsets / calculateCleanableBytes / maxCompactionDelay and
LogToClean), plus grouping segments into replacement segments (Cleaner.groupSegmentsBySize).

Pure functions over `SegmentInfo`s: every segment of the log in offset order, the last one the
active segment. A round may never clean
- the active segment,
- at or past the last stable offset (undecided transactions; the caller passes
  min(first unstable offset, high watermark) as Kafka's lastStableOffset),
- a segment whose largest timestamp is within `min.compaction.lag.ms` of now, nor anything
  after it,
and the limit found is rounded down to a segment's base offset, so a round cleans whole
segments. A log is cleaned when its dirty ratio (dirty bytes / total bytes) is above
`min.cleanable.dirty.ratio`, or when a dirty segment's first batch is older than
`max.compaction.lag.ms` (and there are dirty bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from onceflow.records.batch import NO_TIMESTAMP

DEFAULT_MIN_COMPACTION_LAG_MS = 0  # min.compaction.lag.ms
DEFAULT_MAX_COMPACTION_LAG_MS = (1 << 63) - 1  # max.compaction.lag.ms (Long.MAX_VALUE)
DEFAULT_DELETE_RETENTION_MS = 24 * 3600 * 1000  # delete.retention.ms
_INT32_MAX = (1 << 31) - 1


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What planning needs of one segment."""

    base_offset: int
    size: int  # bytes of its .log
    largest_timestamp: int  # max timestamp of its batches, -1 with none
    last_modified_ms: int  # the .log's modification time
    first_batch_timestamp: int = NO_TIMESTAMP  # max timestamp of its first batch, -1 if none
    index_size: int = 0  # bytes of its offset index (grouping bounds it as Kafka does)
    time_index_size: int = 0


@dataclass(frozen=True, slots=True)
class CompactedLog:
    """What planning reads of one compacted log (Kafka's planner reads the UnifiedLog itself):
    every segment in offset order, the last one active, its offsets and its lag settings."""

    segments: Sequence[SegmentInfo]
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int
    min_compaction_lag_ms: int = DEFAULT_MIN_COMPACTION_LAG_MS  # min.compaction.lag.ms
    max_compaction_lag_ms: int = DEFAULT_MAX_COMPACTION_LAG_MS  # max.compaction.lag.ms


@dataclass(frozen=True, slots=True)
class OffsetsToClean:
    first_dirty_offset: int  # inclusive
    first_uncleanable_offset: int  # exclusive
    force_update_checkpoint: bool = False  # the checkpoint was invalid and was reset


@dataclass(frozen=True, slots=True)
class LogToClean:
    """A log's cleanable section and the figures the choice among logs rests on."""

    first_dirty_offset: int
    first_uncleanable_offset: int  # a segment base offset: the round cleans below it
    clean_bytes: int
    cleanable_bytes: int
    needs_compaction_now: bool  # max.compaction.lag.ms passed for a dirty segment
    compaction_delay_ms: int

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0


def _floor_index(segments: Sequence[SegmentInfo], offset: int) -> int:
    """Index of the segment holding `offset` (the last with base <= offset), 0 if before all."""
    found = 0
    for index, segment in enumerate(segments):
        if segment.base_offset <= offset:
            found = index
        else:
            break
    return found


def log_segments(
    segments: Sequence[SegmentInfo], from_offset: int, to_offset: int
) -> list[SegmentInfo]:
    """Kafka's logSegments(from, to): the segments overlapping [from, to), i.e. from the one
    holding `from_offset` to the last whose base offset is below `to_offset`."""
    if from_offset >= to_offset or not segments:
        return []
    start = _floor_index(segments, from_offset)
    return [s for s in segments[start:] if s.base_offset < to_offset]


def non_active_segments_from(segments: Sequence[SegmentInfo], offset: int) -> list[SegmentInfo]:
    if not segments:
        return []
    return log_segments(segments, offset, segments[-1].base_offset)


def cleanable_offsets(
    log: CompactedLog, last_clean_offset: int | None, now_ms: int
) -> OffsetsToClean:
    """The dirty range [first dirty, first uncleanable) a round may clean.

    `last_clean_offset` is the cleaner checkpoint (None before the first round); one below the
    log start or past the log end is reset to the log start (force_update_checkpoint).
    """
    segments, log_start_offset = log.segments, log.log_start_offset
    if not segments:
        raise ValueError("a log has at least its active segment")
    checkpoint = log_start_offset if last_clean_offset is None else last_clean_offset
    force = False
    if checkpoint < log_start_offset or checkpoint > log.log_end_offset:
        checkpoint, force = log_start_offset, True
    first_dirty = checkpoint
    limits = [log.last_stable_offset, segments[-1].base_offset]
    lag = max(log.min_compaction_lag_ms, 0)
    if lag > 0:
        for segment in non_active_segments_from(segments, first_dirty):
            if segment.largest_timestamp > now_ms - lag:
                limits.append(segment.base_offset)
                break
    return OffsetsToClean(first_dirty, max(first_dirty, min(limits)), force)


def calculate_cleanable_bytes(
    segments: Sequence[SegmentInfo], first_dirty_offset: int, uncleanable_offset: int
) -> tuple[int, int]:
    """(first uncleanable offset rounded down to its segment's base, cleanable bytes)."""
    candidates = non_active_segments_from(segments, uncleanable_offset)
    first_uncleanable = (candidates[0] if candidates else segments[-1]).base_offset
    cleanable = log_segments(
        segments, min(first_dirty_offset, first_uncleanable), first_uncleanable
    )
    return first_uncleanable, sum(s.size for s in cleanable)


def max_compaction_delay(
    segments: Sequence[SegmentInfo],
    first_dirty_offset: int,
    now_ms: int,
    max_compaction_lag_ms: int = DEFAULT_MAX_COMPACTION_LAG_MS,
) -> int:
    """How long past `max.compaction.lag.ms` the oldest dirty non-active segment is (0: not)."""
    timestamps = [
        s.first_batch_timestamp
        for s in non_active_segments_from(segments, first_dirty_offset)
        if s.first_batch_timestamp > 0
    ]
    if not timestamps:
        return 0
    clean_until = now_ms - max(max_compaction_lag_ms, 0)
    earliest = min(timestamps)
    return clean_until - earliest if earliest < clean_until else 0


def log_to_clean(
    log: CompactedLog, last_clean_offset: int | None, now_ms: int
) -> tuple[LogToClean, OffsetsToClean]:
    """The log's LogToClean (figures for choosing it), and the offsets it was computed from."""
    segments = log.segments
    offsets = cleanable_offsets(log, last_clean_offset, now_ms)
    delay = max_compaction_delay(
        segments, offsets.first_dirty_offset, now_ms, log.max_compaction_lag_ms
    )
    first_uncleanable, cleanable = calculate_cleanable_bytes(
        segments, offsets.first_dirty_offset, offsets.first_uncleanable_offset
    )
    # Kafka's logSegments(-1, firstDirtyOffset): every segment starting below the dirty offset
    clean = sum(s.size for s in segments if s.base_offset < offsets.first_dirty_offset)
    candidate = LogToClean(
        offsets.first_dirty_offset, first_uncleanable, clean, cleanable, delay > 0, delay
    )
    return candidate, offsets


def should_clean(candidate: LogToClean, min_cleanable_ratio: float) -> bool:
    """Kafka's filter in grabFilthiestCompactedLog: not empty, and dirty enough or overdue."""
    if candidate.total_bytes <= 0:
        return False
    if candidate.needs_compaction_now and candidate.cleanable_bytes > 0:
        return True
    return candidate.cleanable_ratio > min_cleanable_ratio


def group_segments_by_size(
    segments: Sequence[SegmentInfo],
    max_size: int,
    max_index_size: int,
    first_uncleanable_offset: int,
) -> list[list[SegmentInfo]]:
    """Consecutive segments grouped so each group's log bytes stay within `max_size`
    (`segment.bytes`) and its index bytes within `max_index_size` (`segment.index.bytes`), and
    its offsets span at most Int32.MAX (relative offsets in the index): each group becomes one
    cleaned segment, so segments do not shrink ever smaller round after round."""
    groups: list[list[SegmentInfo]] = []
    rest = list(segments)
    i = 0
    while i < len(rest):
        group = [rest[i]]
        log_size = rest[i].size
        index_size = rest[i].index_size
        time_index_size = rest[i].time_index_size
        i += 1
        while i < len(rest):
            head = rest[i]
            # worst-case last offset of `head`: the next segment's base, or the round's bound
            last_offset = (
                rest[i + 1].base_offset - 1 if i + 1 < len(rest) else first_uncleanable_offset - 1
            )
            if not (
                log_size + head.size <= max_size
                and index_size + head.index_size <= max_index_size
                and time_index_size + head.time_index_size <= max_index_size
                and (head.size == 0 or last_offset - group[0].base_offset <= _INT32_MAX)
            ):
                break
            group.append(head)
            log_size += head.size
            index_size += head.index_size
            time_index_size += head.time_index_size
            i += 1
        groups.append(group)
    return groups
