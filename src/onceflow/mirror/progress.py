"""The mirror's progress line: records/s (from Spark's progress) and lag per topic (the
source's last stable offsets minus the positions the target holds)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaException

from onceflow.mirror.positions import MirrorPositions, PositionLookupError
from onceflow.spark.offset_ranges import PartitionOffsets
from onceflow.spark.topic_offsets import OffsetLookupError, TopicOffsets


def lag_per_topic(latest: PartitionOffsets, positions: PartitionOffsets) -> dict[str, int]:
    """Offsets still to mirror per source topic (markers count: an upper bound on records)."""
    lag: dict[str, int] = {}
    for (topic, partition), end in sorted(latest.items()):
        lag[topic] = lag.get(topic, 0) + max(end - positions.get((topic, partition), 0), 0)
    return lag


def rows_since(progress: Iterable[Mapping[str, Any]], last_batch: int) -> tuple[int, int]:
    """Input rows of the batches after `last_batch` in Spark's recent progress, and the last
    batch id seen."""
    rows, newest = 0, last_batch
    for p in progress:
        if p["batchId"] > last_batch:
            rows += p["numInputRows"]
            newest = max(newest, p["batchId"])
    return rows, newest


class MirrorProgress:
    def __init__(self, source: TopicOffsets, positions: MirrorPositions | None) -> None:
        """`positions` None: the at-least-once mirror, whose position is only in Spark's
        checkpoint, so no lag is shown."""
        self.source = source
        self.positions = positions
        self._last_batch = -1
        self._since = time.monotonic()

    def line(self, recent: Iterable[Mapping[str, Any]]) -> str:
        now = time.monotonic()
        rows, self._last_batch = rows_since(recent, self._last_batch)
        rate = rows / max(now - self._since, 1e-9)
        self._since = now
        if self.positions is None:
            return f"mirror: {rate:,.0f} records/s"
        try:
            tps = self.source.partitions()
            lag = lag_per_topic(self.source.latest(tps), self.positions.committed(tps))
        except (OffsetLookupError, PositionLookupError, KafkaException) as exc:
            # a cluster away for a while: the query rides it out, the progress line too
            return f"mirror: {rate:,.0f} records/s, lag: unknown ({exc})"
        lags = " ".join(f"{t}={n}" for t, n in lag.items()) or "(no topic yet)"
        return f"mirror: {rate:,.0f} records/s, lag: {lags}"
