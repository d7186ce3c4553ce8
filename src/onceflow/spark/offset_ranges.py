"""Offsets per topic partition, in Spark's checkpoint JSON, and the ranges a micro-batch reads.

Pure functions: the driver plans with them, tests check them without a broker. Offsets follow
Spark's Kafka source: `{"topic": {"0": 42}}`, -2 meaning earliest and -1 latest in options.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

EARLIEST = -2
LATEST = -1

TopicPartitionKey = tuple[str, int]
PartitionOffsets = dict[TopicPartitionKey, int]


class OffsetSpecError(ValueError):
    """startingOffsets/endingOffsets (or a checkpointed offset) is not in Spark's format."""


@dataclass(frozen=True)
class OffsetRange:
    """Offsets [start, end) of one topic partition, read by one Spark task."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(self.end - self.start, 0)


def to_spark_json(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """Spark's offset JSON, topics and partitions sorted so equal offsets give equal JSON.

    Spark compares a source's offsets as JSON text: the order must not depend on history.
    """
    out: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return out


def from_spark_json(value: Mapping[str, Mapping[str, int]] | str) -> PartitionOffsets:
    """Parse Spark's offset JSON (a dict, or its text) into {(topic, partition): offset}."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise OffsetSpecError(f"offsets are not JSON: {value!r}") from exc
    if not isinstance(value, Mapping):
        raise OffsetSpecError(f'offsets must look like {{"topic": {{"0": 42}}}}, got {value!r}')
    out: PartitionOffsets = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, Mapping):
            raise OffsetSpecError(f"offsets of topic {topic!r} must be an object: {partitions!r}")
        for partition, offset in partitions.items():
            try:
                out[(str(topic), int(partition))] = int(offset)
            except (TypeError, ValueError) as exc:
                raise OffsetSpecError(f"bad offset {topic}/{partition}: {offset!r}") from exc
    return out


def resolve(
    spec: Mapping[TopicPartitionKey, int],
    earliest: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
) -> PartitionOffsets:
    """Replace -2/-1 by the partition's earliest/latest offset; keep real offsets as given."""
    out: PartitionOffsets = {}
    for tp, offset in spec.items():
        if offset == EARLIEST:
            out[tp] = earliest[tp]
        elif offset == LATEST:
            out[tp] = latest[tp]
        elif offset < 0:
            raise OffsetSpecError(f"offset {offset} of {tp[0]}/{tp[1]} is neither -2, -1 nor >= 0")
        else:
            out[tp] = offset
    return out


def rate_limit(
    start: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
    max_offsets: int,
) -> PartitionOffsets:
    """End offsets that admit about `max_offsets` offsets, shared by each partition's backlog.

    As Spark's Kafka source (maxOffsetsPerTrigger): each partition gets its prorated share,
    rounded down but at least one offset when it has a backlog. Partitions missing from `start`
    (new ones) are expected to have been given their start already.
    """
    backlog = {tp: end - start[tp] for tp, end in latest.items() if end - start.get(tp, end) > 0}
    total = sum(backlog.values())
    if total <= max_offsets:
        return dict(latest)
    out: PartitionOffsets = {}
    for tp, end in latest.items():
        size = backlog.get(tp)
        if size is None:
            out[tp] = end
            continue
        share = max_offsets * (size / total)
        step = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(end, start[tp] + step)
    return out


def plan_ranges(
    start: Mapping[TopicPartitionKey, int],
    end: Mapping[TopicPartitionKey, int],
    min_partitions: int | None = None,
) -> list[OffsetRange]:
    """Ranges of a micro-batch (or batch read), in a deterministic order, empty ones left out.

    With `min_partitions` above the number of ranges, big ranges are split in proportion to
    their size (as Spark's KafkaOffsetRangeCalculator) so more tasks share the work. The same
    (start, end) always gives the same ranges, so a re-run batch reads the same records.
    """
    ranges = []
    for tp in sorted(end):
        if tp not in start:
            raise OffsetSpecError(f"no start offset for {tp[0]}/{tp[1]}")
        if end[tp] < start[tp]:
            raise OffsetSpecError(
                f"{tp[0]}/{tp[1]}: end offset {end[tp]} is before start offset {start[tp]}"
            )
        ranges.append(OffsetRange(tp[0], tp[1], start[tp], end[tp]))
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        parts = max(math.floor(r.size / total * min_partitions + 0.5), 1)
        remaining, begin = r.size, r.start
        for part in range(parts):
            # integer shares; the last part takes the rounding remainder
            share = remaining // (parts - part)
            remaining -= share
            stop = min(begin + share, r.end)
            if stop > begin:
                out.append(OffsetRange(r.topic, r.partition, begin, stop))
            begin = stop
    return out
