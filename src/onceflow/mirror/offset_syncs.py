"""Offset syncs: which target offset each mirrored source record got, and the exact translation
of a consumer group's source offset to a target offset (MirrorMaker 2's offset syncs, exact).

Every mirror transaction also writes one sync record into the target's internal topic
`onceflow-offset-syncs.{alias}.internal`, in the same transaction as the records it describes,
so a sync is visible (read_committed) exactly when its records are. It names the target
partition, the source offsets the transaction covers ([start, end): end is the mirror's new
position) and the runs of records it copied: (first source offset, first target offset,
count), each run contiguous in both logs. The offsets differ between the clusters because the
source's aborted records and markers are not copied and the target has markers of its own.

MirrorMaker 2 writes `mm2-offset-syncs.{alias}.internal` with one (upstream, downstream) pair
per record now and then, and translates between syncs approximately; these records hold whole
runs (another schema), hence another name. The name ends in `.internal`, so no mirror copies it.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field

Run = tuple[int, int, int]  # (first source offset, first target offset, count)


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


@dataclass(frozen=True)
class OffsetSync:
    """One mirror transaction on target partition (topic, partition): source offsets
    [start, end) are in the target, their records copied as `runs`."""

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
        if (
            not sync.runs
            or sync.start > sync.runs[0][0]
            or sync.runs[-1][0] + sync.runs[-1][2] > sync.end
        ):
            raise OffsetSyncError(f"offset sync with runs outside its range: {sync}")
        return sync


@dataclass
class _PartitionIndex:
    """The syncs of one target partition: covered source intervals and the runs, in order."""

    intervals: list[tuple[int, int]] = field(default_factory=list)  # [start, end), merged
    sources: list[int] = field(default_factory=list)  # runs' first source offsets
    runs: list[Run] = field(default_factory=list)

    def add(self, sync: OffsetSync) -> None:
        if self.intervals and sync.start < self.intervals[-1][1]:
            # a later transaction re-covering offsets (the mirror's position was reset and
            # records copied again): the newest copy is what a consumer would read
            self._truncate(sync.start)
        if self.intervals and self.intervals[-1][1] == sync.start:
            self.intervals[-1] = (self.intervals[-1][0], sync.end)
        else:
            self.intervals.append((sync.start, sync.end))
        self.sources.extend(r[0] for r in sync.runs)
        self.runs.extend(sync.runs)

    def _truncate(self, at: int) -> None:
        kept = bisect.bisect_left(self.sources, at)
        del self.sources[kept:], self.runs[kept:]
        if self.runs and self.runs[-1][0] + self.runs[-1][2] > at:
            s, t, _ = self.runs[-1]
            self.runs[-1] = (s, t, at - s)
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
        if j >= 0:
            s, t, n = self.runs[j]
            if offset < s + n:
                return t + offset - s
        if j + 1 < len(self.runs) and self.sources[j + 1] < end:
            return self.runs[j + 1][1]
        # nothing copied at or after `offset` yet: right after the last record copied before
        # it (there is one: every sync, so every interval, holds a record)
        if j < 0:
            return None
        s, t, n = self.runs[j]
        return t + n


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
        return sum(len(p.runs) for p in self._partitions.values())
