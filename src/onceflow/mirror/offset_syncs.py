"""Offset syncs: which target offset each mirrored source record got, and the exact translation
of a consumer group's source offset to a target offset (MirrorMaker 2's offset syncs, exact).

The offsets differ between the clusters: the source's aborted records and markers are not
copied, and the target has markers of its own. So every mirror transaction also writes a sync
record (or several, of MAX_RUNS_PER_SYNC runs each) into the target's internal topic
`onceflow-offset-syncs.{alias}.internal`, in the same transaction as the records it describes,
so a sync is visible (read_committed) exactly when its records are. It names the target
partition, the source offsets the transaction covers ([start, end): end is the mirror's new
position) and the runs of records it copied: (first source offset, first target offset,
count), each run contiguous in both logs. The target offsets come from the delivery reports of
a transaction's first and last records: as one idempotent producer writes them in order, they
fill the range between, unless another producer wrote to the partition meanwhile; then the
sync has no runs, and offsets inside it are not translated.

MirrorMaker 2 writes `mm2-offset-syncs.{alias}.internal` with one (upstream, downstream) pair
per record now and then, and translates between syncs approximately; these records hold whole
runs (another schema), hence another name. The name ends in `.internal`, so no mirror copies it.
"""

from __future__ import annotations

import bisect
import json
from array import array
from dataclasses import dataclass, field

Run = tuple[int, int, int]  # (first source offset, first target offset, count)

# Runs per sync record: ~25 bytes each in JSON, so a record stays far below the 1 MB of Kafka's
# default max.message.bytes even when every source record was its own transaction.
MAX_RUNS_PER_SYNC = 8192


class OffsetSyncError(ValueError):
    """A sync record that is not one of ours."""


def offset_syncs_topic(alias: str) -> str:
    return f"onceflow-offset-syncs.{alias}.internal"


def runs_of(source: list[int], target: list[int]) -> list[Run]:
    """The runs of (source, target) offset pairs, both increasing: a run breaks wherever either
    side skips an offset."""
    runs: list[Run] = []
    for s, t in zip(source, target, strict=True):
        if runs:
            s0, t0, n = runs[-1]
            if s == s0 + n and t == t0 + n:
                runs[-1] = (s0, t0, n + 1)
                continue
        runs.append((s, t, 1))
    return runs


def offset_syncs(
    topic: str, partition: int, start: int, runs: list[Run], per_record: int = MAX_RUNS_PER_SYNC
) -> list[OffsetSync]:
    """The syncs of one transaction that copied `runs` from source offset `start` on: one
    record per `per_record` runs, each covering from where the previous one ended."""
    syncs = []
    for first in range(0, len(runs), per_record):
        chunk = tuple(runs[first : first + per_record])
        end = chunk[-1][0] + chunk[-1][2]
        syncs.append(OffsetSync(topic, partition, start, end, chunk))
        start = end
    return syncs


@dataclass(frozen=True)
class OffsetSync:
    """One mirror transaction on target partition (topic, partition): source offsets
    [start, end) are in the target, their records copied as `runs` (none: copied, but their
    target offsets are not known, as when another producer wrote in between)."""

    topic: str
    partition: int
    start: int
    end: int
    runs: tuple[Run, ...]

    def key(self) -> bytes:
        return json.dumps([self.topic, self.partition]).encode()

    def value(self) -> bytes:
        return json.dumps(
            {
                "topic": self.topic,
                "partition": self.partition,
                "source": [self.start, self.end],
                "runs": self.runs,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, value: bytes) -> OffsetSync:
        try:
            doc = json.loads(value)
            start, end = doc["source"]
            runs = tuple((int(s), int(t), int(n)) for s, t, n in doc["runs"])
            sync = cls(str(doc["topic"]), int(doc["partition"]), int(start), int(end), runs)
        except (ValueError, KeyError, TypeError) as exc:
            raise OffsetSyncError(f"not an offset sync: {value[:80]!r}") from exc
        if sync.start > sync.end or (
            sync.runs
            and (sync.start > sync.runs[0][0] or sync.runs[-1][0] + sync.runs[-1][2] > sync.end)
        ):
            raise OffsetSyncError(f"offset sync with runs outside its range: {sync}")
        return sync


@dataclass
class _PartitionIndex:
    """The syncs of one target partition: covered source intervals and the runs, in order
    (the runs as three int64 arrays: one run per source transaction can be many)."""

    intervals: list[tuple[int, int]] = field(default_factory=list)  # [start, end), merged
    sources: array = field(default_factory=lambda: array("q"))  # runs' first source offsets
    targets: array = field(default_factory=lambda: array("q"))  # runs' first target offsets
    counts: array = field(default_factory=lambda: array("q"))

    def add(self, sync: OffsetSync) -> None:
        if self.intervals and sync.start < self.intervals[-1][1]:
            # a later transaction re-covering offsets (the mirror's position was reset and
            # records copied again): the newest copy is what a consumer would read
            self._truncate(sync.start)
        if not sync.runs:
            return  # copied, but where in the target is not known: a hole, not translated
        if self.intervals and self.intervals[-1][1] == sync.start:
            self.intervals[-1] = (self.intervals[-1][0], sync.end)
        else:
            self.intervals.append((sync.start, sync.end))
        for s, t, n in sync.runs:
            self.sources.append(s)
            self.targets.append(t)
            self.counts.append(n)

    def _truncate(self, at: int) -> None:
        kept = bisect.bisect_left(self.sources, at)
        del self.sources[kept:], self.targets[kept:], self.counts[kept:]
        if self.counts and self.sources[-1] + self.counts[-1] > at:
            self.counts[-1] = at - self.sources[-1]
        self.intervals = [(a, min(b, at)) for a, b in self.intervals if a < at]

    def translate(self, offset: int) -> int | None:
        """The target offset of the first copied record whose source offset is >= `offset`, or
        the offset after the last copied record when none is (yet); None when the syncs do not
        cover `offset` (before the first, beyond the mirror's position, in a hole)."""
        i = bisect.bisect_right(self.intervals, (offset, float("inf"))) - 1
        if i < 0 or offset > self.intervals[i][1]:
            return None
        end = self.intervals[i][1]
        j = bisect.bisect_right(self.sources, offset) - 1
        if j >= 0 and offset < self.sources[j] + self.counts[j]:
            return self.targets[j] + offset - self.sources[j]
        if j + 1 < len(self.sources) and self.sources[j + 1] < end:
            return self.targets[j + 1]
        # nothing copied at or after `offset` yet: right after the last record copied before
        # it (there is one: every sync, so every interval, holds a record)
        if j < 0:
            return None
        return self.targets[j] + self.counts[j]


class OffsetIndex:
    """Every sync read so far, per target partition; translate() is exact (see
    _PartitionIndex.translate) and never answers beyond what is mirrored."""

    def __init__(self) -> None:
        self._partitions: dict[tuple[str, int], _PartitionIndex] = {}

    def add(self, sync: OffsetSync) -> None:
        key = (sync.topic, sync.partition)
        self._partitions.setdefault(key, _PartitionIndex()).add(sync)

    def translate(self, topic: str, partition: int, offset: int) -> int | None:
        """`offset` of a source partition as an offset of target partition (topic, partition)."""
        index = self._partitions.get((topic, partition))
        return None if index is None else index.translate(offset)

    def __len__(self) -> int:
        """Runs held (memory: 24 bytes each)."""
        return sum(len(p.sources) for p in self._partitions.values())
