"""`foreachBatch` writers: exactly-once output for update and complete modes.

Spark's Python streaming sinks take only append mode; aggregations in update or complete mode
go through `foreachBatch(fn)`. The function returned here runs the same per-task transaction
(with its done-mark) over each partition of the micro-batch, keyed by the batch id that
`foreachBatch` passes, so a re-run batch writes nothing for tasks that committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict

import pyarrow as pa
from pyspark.sql import DataFrame

from onceflow.spark.options import OptionError
from onceflow.spark.sink import summarize, write_partition
from onceflow.spark.sink_columns import SinkColumns
from onceflow.spark.sink_target import SinkTarget, TaskOutcome

log = logging.getLogger(__name__)

_OUTCOME_DDL = (
    "batch_id long, partition int, attempt int, rows long, rows_already_committed long, "
    "transactional_id string"
)
_OUTCOME_ARROW = pa.schema(
    [
        ("batch_id", pa.int64()),
        ("partition", pa.int32()),
        ("attempt", pa.int32()),
        ("rows", pa.int64()),
        ("rows_already_committed", pa.int64()),
        ("transactional_id", pa.string()),
    ]
)


def exactly_once_writer(
    bootstrap: str,
    topic: str | None,
    prefix: str,
    *,
    exactly_once: bool = True,
    kafka_config: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> Callable[[DataFrame, int], list[TaskOutcome]]:
    """A `foreachBatch` function writing each micro-batch to `topic` (or a topic column).

    `prefix` names the transactional ids and done-marks: keep it stable for a query across
    restarts (as its checkpoint) and unique among queries. `exactly_once=False` gives the
    plain at-least-once producer, for comparison.
    """
    if not prefix:
        raise OptionError("exactly_once_writer needs a prefix, stable across restarts")
    client = {**(kafka_config or {}), "bootstrap.servers": bootstrap}

    def write_batch(df: DataFrame, batch_id: int) -> list[TaskOutcome]:
        target = SinkTarget(
            client=client,
            topic=topic,
            columns=SinkColumns.from_schema(df.schema, topic),
            exactly_once=exactly_once,
            timeout_s=timeout_s,
        )

        def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            outcome = write_partition(target, prefix, batch_id, batches)
            yield pa.RecordBatch.from_pylist([asdict(outcome)], schema=_OUTCOME_ARROW)

        if exactly_once:
            # a retried task resumes after the rows its earlier attempts committed: that needs
            # the same order in every attempt, which a shuffle's output does not promise
            df = df.sortWithinPartitions(*_sink_columns(df))
        rows = df.mapInArrow(task, _OUTCOME_DDL).collect()
        outcomes = [TaskOutcome(**row.asDict()) for row in rows]
        log.info("onceflow foreachBatch: batch %d: %s", batch_id, summarize(outcomes))
        return outcomes

    return write_batch


def _sink_columns(df: DataFrame) -> list[str]:
    wanted = ("topic", "partition", "key", "value", "headers")
    present = {c.lower(): c for c in df.columns}
    return [present[name] for name in wanted if name in present]
