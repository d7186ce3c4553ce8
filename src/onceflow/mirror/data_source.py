"""The `onceflow-mirror` data source: the onceflow source, positioned from the target cluster,
and the mirror's writer (one transaction per source partition, with its position).

Used by `onceflow.pipelines.mirror`; both ends take the same options: the source's (Spark
Kafka names, `kafka.*`), the target client's as `target.kafka.*`, and `mirror.alias`,
`mirror.replicationPolicy`, `exactlyOnce`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from onceflow.mirror.mirror_transaction import (
    MirrorTarget,
    PartitionOutcome,
    mirror_at_least_once,
    mirror_exactly_once,
)
from onceflow.mirror.offset_syncs import offset_syncs_topic
from onceflow.mirror.positions import MirrorPositions
from onceflow.mirror.replication_policy import ReplicationPolicy
from onceflow.mirror.target_limit import RecordTooLargeError
from onceflow.mirror.topic_sync import TopicSync
from onceflow.spark.offset_ranges import (
    OffsetRange,
    PartitionOffsets,
    TopicPartitionKey,
    from_spark_json,
    plan_ranges,
    to_spark_json,
)
from onceflow.spark.options import OptionError, SourceOptions, option
from onceflow.spark.record_columns import source_schema
from onceflow.spark.source import OnceflowStreamReader

log = logging.getLogger(__name__)

FORMAT = "onceflow-mirror"
TARGET_PREFIX = "target.kafka."


def mirror_target(options: Mapping[str, str]) -> MirrorTarget:
    client = {
        key[len(TARGET_PREFIX) :].lower(): value
        for key, value in options.items()
        if key.lower().startswith(TARGET_PREFIX)
    }
    if not client.get("bootstrap.servers"):
        raise OptionError(f"option '{TARGET_PREFIX}bootstrap.servers' is required")
    timeout_ms = int(client.get("transaction.timeout.ms", "60000"))
    return MirrorTarget(
        client=client,
        policy=ReplicationPolicy(
            option(options, "mirror.replicationPolicy") or "default",
            option(options, "mirror.alias") or "source",
        ),
        exactly_once=(option(options, "exactlyOnce") or "true").lower() == "true",
        timeout_s=timeout_ms / 1000.0,
    )


class MirrorStreamReader(OnceflowStreamReader):
    """The onceflow source, except where a partition starts: where the target says.

    On start (no checkpoint) every partition the target holds a position for starts there.
    Each micro-batch skips what the target already has; its first plan in this run also
    rewinds to the target's position (a checkpoint ahead of the target: a run whose last
    records were aborted ones, or a target restored from older data). Target topics are made
    to match the source before a partition is planned.
    """

    def __init__(self, options: SourceOptions, target: MirrorTarget) -> None:
        super().__init__(options)
        self.target = target
        self.sync = TopicSync(self.lookup, target.client, target.policy)
        self.positions = MirrorPositions(target.client, target.policy, target.timeout_s)
        self._rewound = False

    def ensure_topics(self, tps: Iterable[TopicPartitionKey]) -> None:
        """The target topics of `tps`, and the offset syncs' topic the transactions write."""
        if self.target.exactly_once:
            self.sync.ensure_internal(offset_syncs_topic(self.target.policy.alias), {})
        self.sync.ensure(tps)

    def initialOffset(self) -> dict:
        tps = self.lookup.partitions()
        self.ensure_topics(tps)
        held = self.positions.committed(tps) if self.target.exactly_once else {}
        log.info("mirror: starting from the target's positions %s", held)
        return to_spark_json({**self.lookup.earliest(tps), **held})

    def latestOffset(self, start: dict, limit: object) -> dict:
        end = super().latestOffset(start, limit)  # type: ignore[arg-type]
        self.ensure_topics(from_spark_json(end))
        return end

    def plan(self, begin: PartitionOffsets, stop: PartitionOffsets) -> list[OffsetRange]:
        if self.target.exactly_once:
            for tp, position in self.positions.committed(stop).items():
                if position > begin[tp] or not self._rewound:
                    begin[tp] = min(position, stop[tp])
            self._rewound = True
        # one range per partition, never split: its records must reach the target in order
        return plan_ranges(begin, stop)

    def stop(self) -> None:
        super().stop()
        self.positions.close()


@dataclass(frozen=True)
class MirrorOutcome(WriterCommitMessage):
    partitions: tuple[PartitionOutcome, ...]


class MirrorStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, target: MirrorTarget) -> None:
        self.target = target

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MirrorOutcome:
        write = mirror_exactly_once if self.target.exactly_once else mirror_at_least_once
        return MirrorOutcome(tuple(write(self.target, iterator)))

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        log.info("mirror: batch %d committed: %s", batchId, summarize(messages))
        # A record too large for the target: its task committed what came before it and said
        # why it stopped; the query stops here, once, rather than through futile task retries.
        for m in messages:
            for p in m.partitions if isinstance(m, MirrorOutcome) else ():
                if p.error is not None:
                    raise RecordTooLargeError(p.error)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("mirror: batch %d aborted: %s", batchId, summarize(messages))


def summarize(messages: Sequence[WriterCommitMessage | None]) -> str:
    parts = [p for m in messages if isinstance(m, MirrorOutcome) for p in m.partitions]
    written = sum(p.rows for p in parts)
    skipped = sum(p.skipped for p in parts)
    return f"{len(parts)} partitions, {written} records written, {skipped} already there"


class MirrorDataSource(DataSource):
    """Registered as `onceflow-mirror` by the mirror pipeline."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return source_schema(True)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = SourceOptions.parse({**self.options, "includeHeaders": "true"}, streaming=True)
        return MirrorStreamReader(options, mirror_target(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return MirrorStreamWriter(mirror_target(self.options))
