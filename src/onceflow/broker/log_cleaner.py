"""The log cleaner task (Kafka's LogCleaner with one thread): every `log.cleaner.backoff.ms`,
when `log.cleaner.enable`, clean the dirtiest cleanable partition of the topics whose
`cleanup.policy` contains `compact`, and of the coordinators' logs (`__consumer_offsets`,
`__transaction_state`: `compact`, as in Kafka).

A round plans on the event loop (compaction.cleanable: the dirty range from the cleaner
checkpoint, `min.cleanable.dirty.ratio`, the compaction lags, never the active segment nor at
or past the last stable offset), builds the offset map and writes each cleaned group's
`.cleaned` files on a worker thread (batches streamed: memory is the offset map, bounded by
`log.cleaner.dedupe.buffer.size`, plus one write chunk), and swaps each group in on the loop
(log/swap.py), where appends and reads run: they never see a half-swapped log. The first dirty
offset of every cleaned partition is kept in `<data dir>/cleaner-offset-checkpoint` (Kafka's
format), written atomically after the round's swaps.

Retention waits while a partition is being cleaned; a topic deleted, or its configs altered,
during a round drops the round (its `.cleaned` files removed), to be planned again.

A partition whose planning or cleaning raises is marked uncleanable (Kafka's
LogCleanerManager.uncleanablePartitions): the failure is logged once, with the partition and
the reason, and the cleaner goes on with every other partition, the internal topics included.
It is tried again when its configs change or its topic is re-created, or after a restart. A
failed write to the data directory still halts the broker, and a descriptor shortage still
only fails the tick, as before: neither is the partition's fault.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from onceflow.broker.config import BrokerConfig
from onceflow.broker.storage_failure import is_storage_error
from onceflow.clock import Clock
from onceflow.compaction import (
    CleanerStats,
    CleanRound,
    CompactedLog,
    OffsetMap,
    SegmentInfo,
    build_offset_map,
    group_segments_by_size,
    last_records_from_state,
    log_to_clean,
    should_clean,
)
from onceflow.compaction.cleanable import LogToClean
from onceflow.fault_points import crash_point, delay_point
from onceflow.log.aborted_index import AbortedTxn, encode_entries
from onceflow.log.config import LogConfig
from onceflow.log.errors import DescriptorsExhaustedError, LogClosedError, SegmentsChangedError
from onceflow.log.file_handles import EXHAUSTION_ERRNOS, file_handles
from onceflow.log.full_disk import check_space
from onceflow.log.segment import Segment
from onceflow.log.swap import CleanedSegmentWriter

if TYPE_CHECKING:
    from onceflow.broker.partition import Partition

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "cleaner-offset-checkpoint"
_CHECKPOINT_VERSION = 0

TopicPartition = tuple[str, int]


@dataclass
class RoundReport:
    """What the last round did (logs, tests, the benchmark)."""

    topic: str
    partition: int
    first_dirty_offset: int
    end_offset: int
    groups: int
    bytes_read: int
    bytes_written: int
    seconds: float

    @property
    def mb_per_second(self) -> float:
        return self.bytes_read / 1e6 / self.seconds if self.seconds > 0 else 0.0


class _RoundDropped(Exception):
    """The partition went away or changed during the round."""


@dataclass(frozen=True)
class Uncleanable:
    """Why the cleaner skips a partition, and the partition and settings it failed with: a
    re-created topic (a new Partition) or altered configs (a new LogConfig) are tried again."""

    reason: str
    partition: Partition
    config: LogConfig


def _not_the_partitions_fault(error: Exception) -> bool:
    """A failed write to the data directory (the broker halts) or a descriptor shortage (the
    tick fails, the next one tries again): the log cleaner's loop handles those."""
    if is_storage_error(error) or isinstance(error, DescriptorsExhaustedError):
        return True
    return isinstance(error, OSError) and error.errno in EXHAUSTION_ERRNOS


class CleanableTopic(Protocol):
    @property
    def partitions(self) -> Sequence[Partition]: ...


class Topics(Protocol):
    """The topics the cleaner compacts (the broker's topic registry)."""

    def __iter__(self) -> Iterator[CleanableTopic]: ...

    def partition(self, name: str, index: int) -> Partition | None: ...


class LogCleaner:
    """Kafka's LogCleaner, one round per tick: given the broker's settings (log.cleaner.*), its
    topics, the coordinators' internal partitions and the clock, never the broker itself."""

    def __init__(
        self,
        config: BrokerConfig,
        topics: Topics,
        internal_partitions: Callable[[], Sequence[Partition]],
        clock: Clock,
    ) -> None:
        self._config = config
        self._topics = topics
        self._internal_partitions = internal_partitions
        self._clock = clock
        self._path = config.data_dir / CHECKPOINT_FILE
        self.checkpoints: dict[TopicPartition, int] = read_checkpoints(self._path)
        self._offset_map: OffsetMap | None = None  # allocated at the first round, then reused
        self.rounds = 0
        self.dropped = 0
        self.last_round: RoundReport | None = None
        # Kafka's uncleanablePartitions: skipped until re-created, re-configured or restarted
        self.uncleanable: dict[TopicPartition, Uncleanable] = {}

    # -- the loop ---------------------------------------------------------------------------

    def delay(self) -> float:
        return self._config.log_cleaner_backoff_ms / 1000

    async def tick(self) -> None:
        """One round on the dirtiest partition, if any is worth cleaning."""
        if not self._config.log_cleaner_enable:
            return
        self._forget_uncleanable()
        chosen = self._filthiest()
        if chosen is None:
            return
        partition, candidate = chosen
        try:
            await self._clean(partition, candidate)
        except _RoundDropped as e:
            self.dropped += 1
            log.info("cleaning of %s-%d dropped: %s", partition.topic, partition.index, e)
        except Exception as e:
            if self._live(partition):
                if _not_the_partitions_fault(e):
                    raise
                self._mark_uncleanable(partition, "cleaning it failed", e)
                return
            # deleted under us (its files closed or removed): nothing of ours is left
            self.dropped += 1
            log.info("cleaning of %s-%d dropped: %r", partition.topic, partition.index, e)

    # -- uncleanable partitions -------------------------------------------------------------

    def _mark_uncleanable(self, partition: Partition, what: str, error: Exception) -> None:
        """Kafka's markPartitionUncleanable: skip this partition from now on and say so once;
        the others go on being cleaned."""
        key = (partition.topic, partition.index)
        self.uncleanable[key] = Uncleanable(repr(error), partition, partition.log.config)
        log.warning(
            "log cleaner: %s of %s-%d, marking it uncleanable (skipped until its configs "
            "change, its topic is re-created or the broker restarts; %d uncleanable "
            "partition(s)): %r",
            what,
            partition.topic,
            partition.index,
            len(self.uncleanable),
            error,
            exc_info=error,
        )

    def _forget_uncleanable(self) -> None:
        """Kafka's maintainUncleanablePartitions (a deleted partition is forgotten), and also
        a partition whose configs were altered since it failed: the change may be the fix."""
        for key, entry in list(self.uncleanable.items()):
            if not self._live(entry.partition):
                del self.uncleanable[key]
            elif not self._live(entry.partition, entry.config):
                del self.uncleanable[key]
                log.info("log cleaner: %s-%d configs changed, cleanable again", *key)

    def _is_uncleanable(self, partition: Partition) -> bool:
        entry = self.uncleanable.get((partition.topic, partition.index))
        return entry is not None and entry.partition is partition

    def _partitions(self) -> Iterator[Partition]:
        """Every partition that may be compacted: the topics', then the coordinators' logs
        (`__consumer_offsets`, `__transaction_state`), which are no topics of the registry."""
        for topic in self._topics:
            yield from topic.partitions
        yield from self._internal_partitions()

    def _live(self, partition: Partition, config: LogConfig | None = None) -> bool:
        registered = self._topics.partition(partition.topic, partition.index)
        if registered is not partition and partition not in self._internal_partitions():
            return False
        return config is None or partition.log.config is config

    # -- choosing -----------------------------------------------------------------------------

    def _filthiest(self) -> tuple[Partition, LogToClean] | None:
        """Kafka's grabFilthiestCompactedLog: the cleanable partition with the highest dirty
        ratio among those past `min.cleanable.dirty.ratio` or `max.compaction.lag.ms`."""
        now = self._clock()
        best: tuple[Partition, LogToClean] | None = None
        for partition in self._partitions():
            config = partition.log.config
            if not config.compact or self._is_uncleanable(partition):
                continue
            try:
                candidate = self._plan(partition, config, now)
            except LogClosedError:
                continue
            except Exception as e:
                if _not_the_partitions_fault(e):
                    raise
                # as Kafka's grabFilthiestCompactedLog: one partition's failure is its own
                self._mark_uncleanable(partition, "planning its cleaning failed", e)
                continue
            if not should_clean(candidate, config.min_cleanable_dirty_ratio):
                continue
            if best is None or candidate.cleanable_ratio > best[1].cleanable_ratio:
                best = (partition, candidate)
        return best

    def _plan(self, partition: Partition, config: LogConfig, now: int) -> LogToClean:
        plog = partition.log
        key = (partition.topic, partition.index)
        log = CompactedLog(
            [_info(s) for s in plog.segments],
            log_start_offset=plog.log_start_offset,
            log_end_offset=plog.log_end_offset,
            last_stable_offset=partition.last_stable_offset,
            min_compaction_lag_ms=config.min_compaction_lag_ms,
            max_compaction_lag_ms=config.max_compaction_lag_ms,
        )
        candidate, offsets = log_to_clean(log, self.checkpoints.get(key), now)
        if offsets.force_update_checkpoint:
            self.checkpoints[key] = offsets.first_dirty_offset
        return candidate

    # -- one round ----------------------------------------------------------------------------

    async def _clean(self, partition: Partition, candidate: LogToClean) -> None:
        plog = partition.log
        config = plog.config
        first_dirty = candidate.first_dirty_offset
        first_uncleanable = candidate.first_uncleanable_offset
        segments = plog.segments_below(first_uncleanable)
        if not segments or first_dirty >= first_uncleanable:
            return
        aborted = [t for t in partition.aborted.entries() if t.first_offset < first_uncleanable]
        last_records = last_records_from_state(partition.producers)
        now = self._clock()
        offset_map = self._map()
        stats = CleanerStats()
        started = time.monotonic()
        dirty_from = max(
            i for i, s in enumerate(segments) if i == 0 or s.base_offset <= first_dirty
        )
        dirty = [(s.base_offset, _batches(s)) for s in segments[dirty_from:]]
        partition.cleaning = True
        try:
            end = await asyncio.to_thread(
                build_offset_map, dirty, first_dirty, first_uncleanable, aborted, offset_map, stats
            )
            if not self._live(partition, config):
                raise _RoundDropped("the topic was deleted or altered")
            to_clean = [s for s in segments if s.base_offset < end]
            clean_round = CleanRound(
                offset_map,
                aborted=aborted,
                last_records=last_records,
                now_ms=now,
                delete_retention_ms=config.delete_retention_ms,
                upper_bound_offset=first_uncleanable,
            )
            clean_round.stats = stats
            by_base = {s.base_offset: i for i, s in enumerate(segments)}
            groups = group_segments_by_size(
                [_info(s) for s in to_clean],
                config.segment_bytes,
                config.segment_index_bytes,
                first_uncleanable,
            )
            for group in groups:
                first, last = by_base[group[0].base_offset], by_base[group[-1].base_offset]
                replaced = segments[first : last + 1]
                # Each cleaned segment keeps its last batch (emptied if need be), so it ends
                # where the next segment starts: offsets stay contiguous across segments.
                clean_round.upper_bound_offset = (
                    segments[last + 1].base_offset
                    if last + 1 < len(segments)
                    else first_uncleanable
                )
                writer = await asyncio.to_thread(
                    _write_group, plog.directory, replaced, clean_round, config, now
                )
                await delay_point("cleaner.before-swap")
                if not self._live(partition, config):
                    writer.abandon()
                    raise _RoundDropped("the topic was deleted or altered")
                crash_point("cleaner.after-cleaned")
                try:
                    partition.replace_cleaned(replaced[0].base_offset, replaced, crash_point)
                except SegmentsChangedError as e:
                    writer.abandon()
                    raise _RoundDropped(str(e)) from e
            crash_point("cleaner.before-checkpoint")
            self.checkpoints[(partition.topic, partition.index)] = end
            await asyncio.to_thread(self._write_checkpoints)
        finally:
            partition.cleaning = False
        seconds = time.monotonic() - started
        self.rounds += 1
        self.last_round = RoundReport(
            partition.topic,
            partition.index,
            first_dirty,
            end,
            len(groups),
            stats.bytes_read,
            stats.bytes_written,
            seconds,
        )
        log.info(
            "cleaned %s-%d [%d, %d): %d segment(s) into %d, %d -> %d bytes in %.2fs (%.1f MB/s)",
            partition.topic,
            partition.index,
            first_dirty,
            end,
            len(to_clean),
            len(groups),
            stats.bytes_read,
            stats.bytes_written,
            seconds,
            self.last_round.mb_per_second,
        )

    def _map(self) -> OffsetMap:
        if self._offset_map is None:
            config = self._config
            self._offset_map = OffsetMap(
                config.log_cleaner_dedupe_buffer_size, config.log_cleaner_io_buffer_load_factor
            )
        return self._offset_map

    def _write_checkpoints(self) -> None:
        live = {(p.topic, p.index) for p in self._partitions()}
        self.checkpoints = {k: v for k, v in self.checkpoints.items() if k in live}
        write_checkpoints(self._path, self.checkpoints)


def _info(segment: Segment) -> SegmentInfo:
    first = segment.first_batch_timestamp
    return SegmentInfo(
        segment.base_offset,
        segment.size,
        segment.max_timestamp,
        0,
        first if first is not None else -1,
        segment.offset_index.entries * 8,
        segment.time_index.entries * 12,
    )


def _batches(segment: Segment) -> Iterator[bytes]:
    for _, data in segment.iter_batches(segment.base_offset, with_bytes=True):
        assert data is not None
        yield data


def _write_group(
    directory: Path,
    replaced: list[Segment],
    clean_round: CleanRound,
    config: LogConfig,
    now: int,
) -> CleanedSegmentWriter:
    """On a worker thread: one group's cleaned segment, streamed into its `.cleaned` files."""
    check_space()
    writer = CleanedSegmentWriter(directory, replaced[0].base_offset, config, now)
    try:
        for cleaned in clean_round.clean(b for s in replaced for b in _batches(s)):
            writer.write(cleaned)
        retained: list[AbortedTxn] = list(clean_round.transactions.take_retained_aborted())  # type: ignore[arg-type]
        writer.finish(encode_entries(retained))
    except BaseException:
        writer.abandon()
        raise
    return writer


def read_checkpoints(path: Path) -> dict[TopicPartition, int]:
    """Kafka's OffsetCheckpointFile: version, count, then `topic partition offset` lines; a
    missing or unreadable file is an empty checkpoint (every log is then wholly dirty)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    try:
        if int(lines[0]) != _CHECKPOINT_VERSION:
            raise ValueError(f"version {lines[0]}")
        count = int(lines[1])
        found: dict[TopicPartition, int] = {}
        for line in lines[2 : 2 + count]:
            topic, partition, offset = line.split(" ")
            found[(topic, int(partition))] = int(offset)
        if len(found) != count:
            raise ValueError(f"{len(found)} entries, {count} announced")
        return found
    except (ValueError, IndexError) as e:
        log.warning("ignoring unreadable %s (%s): every compacted log is dirty", path, e)
        return {}


def write_checkpoints(path: Path, checkpoints: dict[TopicPartition, int]) -> None:
    """Atomically: a synced temporary file renamed over the old one, then the directory."""
    lines = [str(_CHECKPOINT_VERSION), str(len(checkpoints))]
    lines += [f"{t} {p} {o}" for (t, p), o in sorted(checkpoints.items())]
    tmp = path.with_name(path.name + ".tmp")
    check_space()
    with file_handles().transient(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) as fd:
        view = memoryview(("\n".join(lines) + "\n").encode())
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    os.replace(tmp, path)
    with file_handles().transient(path.parent, os.O_RDONLY | os.O_DIRECTORY) as fd:
        os.fsync(fd)
