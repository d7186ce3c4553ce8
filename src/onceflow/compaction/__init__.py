"""Log compaction's core, sans IO: Kafka's log cleaner without files, threads or clocks.

Contract of a cleaning round (Kafka's LogCleaner, 3.x semantics):

1. Plan (`cleanable.py`): from a `CompactedLog` (`SegmentInfo`s of every segment, the last one
   active, the log's offsets, the last stable offset, the lag settings), the cleaner checkpoint
   and `now_ms`, `log_to_clean` gives the dirty range [first dirty offset, first uncleanable
   offset) (never the active segment, never at or
   past the last stable offset, never a segment within `min.compaction.lag.ms`, rounded down to
   a segment boundary) and the dirty ratio; `should_clean` applies
   `min.cleanable.dirty.ratio` and `max.compaction.lag.ms`.
2. Clean (`cleaner.py`): `clean_segments(segments, first_dirty_offset=...,
   first_uncleanable_offset=..., aborted=..., last_records=..., now_ms=...,
   delete_retention_ms=...)` takes the batches of every segment from the log start up to the
   first uncleanable offset (each batch one bytes-like, as stored in the `.log` files), builds
   the offset map from the dirty range (`offset_map.py`, bounded by
   `log.cleaner.dedupe.buffer.size`), and returns `CleanResult`: `end_offset` (the next
   checkpoint: the first uncleanable offset, or less when the map filled up) and the cleaned
   groups (`CleanedGroup`: the base offsets of the segments it replaces, its batches, and the
   aborted transactions its `.txnindex` must list). Every segment starting below `end_offset`
   is in exactly one group. Batches are CRC-checked on the way in (CorruptRecordError) and a
   batch at or past the first uncleanable offset is refused (CleanRangeError).
   `CleanRound.clean` is the same filter as a generator, for streaming a group into a file.

Guarantees of the output: offsets of surviving records never change (batches keep their base
offset and last offset delta); the latest record of every key below `end_offset` survives,
unless it is a tombstone whose delete horizon (set to `now_ms + delete.retention.ms` the first
round that sees it) has passed, or it belongs to an aborted transaction; markers stay until
their transaction's data is gone and their own horizon passed; each active producer's last
batch stays (emptied if need be) with its producer id, epoch and sequences; every output batch
is a valid RecordBatch v2 (CRC included), compressed with its original codec.

Not here: reading and writing files, the `.cleaned`/`.swap` protocol, the cleaner checkpoint
file, scheduling and throttling (the broker's cleaner task).
"""

from onceflow.compaction.cleanable import (
    CompactedLog,
    LogToClean,
    OffsetsToClean,
    SegmentInfo,
    group_segments_by_size,
    log_to_clean,
    should_clean,
)
from onceflow.compaction.cleaned_transactions import AbortedTransaction, CleanedTransactions
from onceflow.compaction.cleaner import (
    CleanedGroup,
    CleanerStats,
    CleanResult,
    CleanRound,
    SegmentBatches,
    build_offset_map,
    clean_segments,
)
from onceflow.compaction.errors import CleanerError, CleanRangeError, OffsetMapConfigError
from onceflow.compaction.offset_map import OffsetMap
from onceflow.compaction.producers import (
    LastRecord,
    last_records_from_state,
    last_records_of_producers,
)

__all__ = [
    "AbortedTransaction",
    "CleanRangeError",
    "CleanResult",
    "CleanRound",
    "CleanedGroup",
    "CleanedTransactions",
    "CleanerError",
    "CleanerStats",
    "CompactedLog",
    "LastRecord",
    "LogToClean",
    "OffsetMap",
    "OffsetMapConfigError",
    "OffsetsToClean",
    "SegmentBatches",
    "SegmentInfo",
    "build_offset_map",
    "clean_segments",
    "group_segments_by_size",
    "last_records_from_state",
    "last_records_of_producers",
    "log_to_clean",
    "should_clean",
]
