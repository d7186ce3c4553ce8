"""The `onceflow` sinks: streaming (append mode) and batch writers over Arrow batches.

Each write task runs `write_partition`: the exactly-once task transaction (default) or the
plain at-least-once producer (`exactlyOnce=false`). The transactional id prefix defaults to the
streaming query id, which is stable across restarts from the same checkpoint.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from onceflow.spark.at_least_once import write_at_least_once
from onceflow.spark.options import SinkOptions
from onceflow.spark.sink_columns import SinkColumns
from onceflow.spark.sink_target import SinkTarget, TaskOutcome
from onceflow.spark.task_transaction import write_exactly_once

log = logging.getLogger(__name__)

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


class MissingTaskContextError(RuntimeError):
    """A sink task ran without the Spark task context it needs (batch id, query id)."""


def write_partition(
    target: SinkTarget,
    prefix: str,
    batch_id: int,
    batches: Iterable[pa.RecordBatch],
    *,
    partition: int | None = None,
    attempt: int | None = None,
) -> TaskOutcome:
    """Write one Spark task's rows; partition and attempt default to the running task's."""
    if partition is None or attempt is None:
        ctx = TaskContext.get()
        if ctx is None:
            raise MissingTaskContextError("write_partition outside a Spark task needs partition")
        partition = ctx.partitionId() if partition is None else partition
        attempt = ctx.attemptNumber() if attempt is None else attempt
    if target.exactly_once:
        return write_exactly_once(target, prefix, partition, attempt, batch_id, batches)
    return write_at_least_once(target, partition, attempt, batch_id, batches)


def summarize(outcomes: Sequence[WriterCommitMessage | None]) -> str:
    done = [o for o in outcomes if isinstance(o, TaskOutcome)]
    rows = sum(o.rows for o in done)
    skipped = sum(o.rows_already_committed for o in done)
    retried = sum(1 for o in done if o.attempt > 0)
    return (
        f"{len(done)} tasks, {rows} rows written, {skipped} rows already committed, "
        f"{retried} retried tasks"
    )


def _target(options: SinkOptions, schema: StructType) -> SinkTarget:
    return SinkTarget(
        client=options.client,
        topic=options.topic,
        columns=SinkColumns.from_schema(schema, options.topic),
        exactly_once=options.exactly_once,
        timeout_s=options.timeout_s,
    )


class OnceflowStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("onceflow")`, append mode."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self.options = options
        self.target = _target(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskOutcome:
        ctx = TaskContext.get()
        batch_id = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx else None
        if batch_id is None:
            raise MissingTaskContextError(f"no {BATCH_ID_PROPERTY} in the task context")
        prefix = self.options.prefix or ctx.getLocalProperty(QUERY_ID_PROPERTY)
        if not prefix:
            raise MissingTaskContextError(f"no {QUERY_ID_PROPERTY} in the task context")
        return write_partition(self.target, prefix, int(batch_id), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("onceflow sink: batch %d committed: %s", batchId, summarize(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("onceflow sink: batch %d aborted: %s", batchId, summarize(messages))


class OnceflowBatchWriter(DataSourceArrowWriter):
    """`df.write.format("onceflow")`: one transaction per task, keyed by batch id 0.

    Without `transactional.id.prefix`, each write gets a fresh prefix made here on the driver
    (and pickled to the tasks with the writer), so Spark's task retries are exactly-once. With
    an explicit prefix, running the same write again writes nothing for partitions it finished.
    """

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self.options = options
        self.target = _target(options, schema)
        self.prefix = options.prefix or f"onceflow-write-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskOutcome:
        return write_partition(self.target, self.prefix, 0, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("onceflow sink: write %s committed: %s", self.prefix, summarize(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("onceflow sink: write %s aborted: %s", self.prefix, summarize(messages))
