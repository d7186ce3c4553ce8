"""The `onceflow` data source: Spark's Kafka source options and columns, read_committed.

The driver plans offset ranges (ListOffsets, read_committed: up to the last stable offset);
each task reads exactly its range (`range_reader`). Offsets live in Spark's checkpoint as
Spark's Kafka JSON, so a re-run micro-batch plans, and reads, the same records.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from onceflow.spark.offset_ranges import (
    OffsetRange,
    PartitionOffsets,
    from_spark_json,
    plan_ranges,
    rate_limit,
    resolve,
    to_spark_json,
)
from onceflow.spark.options import OptionError, SinkOptions, SourceOptions, option
from onceflow.spark.range_reader import read_range
from onceflow.spark.record_columns import arrow_schema, source_schema
from onceflow.spark.sink import OnceflowBatchWriter, OnceflowStreamWriter
from onceflow.spark.topic_offsets import TopicOffsets

log = logging.getLogger(__name__)

FORMAT = "onceflow"


@dataclass(frozen=True)
class RangeRead:
    """What a task needs to read one range; pickled to the executor as the InputPartition."""

    offsets: OffsetRange
    client: dict[str, str]
    include_headers: bool
    poll_timeout_ms: int
    fail_on_data_loss: bool


class RangePartition(InputPartition):
    def __init__(self, value: RangeRead) -> None:
        super().__init__(value)
        self.value: RangeRead = value


def _read(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    task = partition.value
    if task is None:  # Spark plans one empty partition when a batch read has no ranges
        return iter(())
    assert isinstance(task, RangeRead)
    return read_range(
        task.client,
        task.offsets,
        arrow_schema(source_schema(task.include_headers)),
        poll_timeout_ms=task.poll_timeout_ms,
        fail_on_data_loss=task.fail_on_data_loss,
    )


def _to_partitions(options: SourceOptions, ranges: list[OffsetRange]) -> list[InputPartition]:
    return [
        RangePartition(
            RangeRead(
                offsets=r,
                client=options.client,
                include_headers=options.include_headers,
                poll_timeout_ms=options.poll_timeout_ms,
                fail_on_data_loss=options.fail_on_data_loss,
            )
        )
        for r in ranges
    ]


def _starting_offsets(
    options: SourceOptions, lookup: TopicOffsets, spec: object
) -> PartitionOffsets:
    """Resolve 'earliest', 'latest' or explicit offsets against the partitions there now."""
    tps = lookup.partitions()
    if spec == "earliest":
        return lookup.earliest(tps)
    if spec == "latest":
        return lookup.latest(tps)
    assert isinstance(spec, dict)
    if sorted(spec) != tps and options.subscription.pattern is None:
        # as Spark: explicit offsets must name every partition the subscription covers
        raise OptionError(
            f"explicit offsets name {sorted(spec)}, but the subscription covers {tps}"
        )
    return resolve(spec, lookup.earliest(spec), lookup.latest(spec))


class OnceflowStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader; its driver-side methods run in one long-lived Python process."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.lookup = TopicOffsets(options)
        self._target: PartitionOffsets | None = None
        self._latest: PartitionOffsets = {}  # what the last latestOffset found

    def initialOffset(self) -> dict:
        return to_spark_json(_starting_offsets(self.options, self.lookup, self.options.starting))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # Trigger.AvailableNow: never plan past what is stable now
        self._target = self.lookup.latest(self.lookup.partitions())

    def _with_new_partitions(self, start: PartitionOffsets) -> PartitionOffsets:
        """`start` plus partitions that appeared since, from their earliest offset (as Spark)."""
        new = [tp for tp in self.lookup.partitions() if tp not in start]
        if new:
            log.info("new partitions %s: reading them from their earliest offsets", new)
        return {**start, **self.lookup.earliest(new)}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = self._with_new_partitions(from_spark_json(start))
        latest = self._latest = self.lookup.latest(begin, known=begin)
        end: PartitionOffsets = {}
        for tp, offset in begin.items():
            stop = latest.get(tp, offset)
            if self._target is not None:
                stop = min(stop, self._target.get(tp, offset))
            if stop < offset:
                # the last stable offset went backwards: the log lost data we had read
                log.warning(
                    "%s/%d: latest offset %d is before %d; waiting for it", *tp, stop, offset
                )
                stop = offset
            end[tp] = stop
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(begin, end, limit.max_rows)
        return to_spark_json(end)

    def reportLatestOffset(self) -> dict | None:
        """The latest offsets the last latestOffset found (progress only, as Spark's Kafka
        source): no look-up of its own, which could fail the query while a broker restarts."""
        return to_spark_json(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = from_spark_json(start)
        stop = from_spark_json(end)
        new = [tp for tp in stop if tp not in begin]
        begin.update(self.lookup.earliest(new))
        return _to_partitions(self.options, self.plan(begin, stop))

    def plan(self, begin: PartitionOffsets, stop: PartitionOffsets) -> list[OffsetRange]:
        """The ranges a micro-batch reads, from its start and end offsets (a hook: the mirror
        starts each partition where the target cluster says)."""
        return plan_ranges(begin, stop, self.options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, not in a consumer group."""

    def stop(self) -> None:
        self.lookup = TopicOffsets(self.options)


class OnceflowBatchReader(DataSourceReader):
    """`spark.read.format("onceflow")`: startingOffsets to endingOffsets, planned once."""

    def __init__(self, options: SourceOptions) -> None:
        if options.starting == "latest":
            raise OptionError("startingOffsets=latest is not allowed for a batch read (as Spark)")
        self.options = options

    def partitions(self) -> list[InputPartition]:
        lookup = TopicOffsets(self.options)
        start = _starting_offsets(self.options, lookup, self.options.starting)
        if self.options.ending == "latest":
            end = lookup.latest(start)
        else:
            assert isinstance(self.options.ending, dict)
            end = resolve(self.options.ending, {}, lookup.latest(self.options.ending))
        missing = [tp for tp in start if tp not in end]
        if missing:
            raise OptionError(f"endingOffsets does not name {missing}")
        end = {tp: end[tp] for tp in start}
        return _to_partitions(self.options, plan_ranges(start, end, self.options.min_partitions))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)


class OnceflowDataSource(DataSource):
    """Registered as `onceflow`: the read_committed source and the exactly-once sinks."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        include = (option(self.options, "includeHeaders") or "false").lower() == "true"
        return source_schema(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        return OnceflowBatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return OnceflowStreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return OnceflowBatchWriter(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return OnceflowStreamWriter(SinkOptions.parse(self.options), schema)
