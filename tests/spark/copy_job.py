"""The pipeline the sink tests run: copy a topic to another through the onceflow source and sink.

Shared by the in-process tests and the driver child process that gets SIGKILLed.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from .faults import ArrowMap
from .kafka_io import duplicates


def copy_stream(
    spark: SparkSession,
    bootstrap: str,
    source: str,
    *,
    transform: ArrowMap | None = None,
    max_offsets: int | None = None,
) -> DataFrame:
    reader = (
        spark.readStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
    )
    if max_offsets:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    df = reader.load().select("key", "value")
    if transform is not None:
        df = df.mapInArrow(transform, df.schema)
    return df


def start_copy(
    df: DataFrame,
    bootstrap: str,
    out: str,
    checkpoint: Path,
    *,
    exactly_once: bool,
    available_now: bool = True,
    sink_options: dict[str, str] | None = None,
) -> StreamingQuery:
    writer = (
        df.writeStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", out)
        .option("exactlyOnce", str(exactly_once).lower())
        .option("checkpointLocation", str(checkpoint))
    )
    for key, value in (sink_options or {}).items():
        writer = writer.option(key, value)
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="0 seconds")
    return writer.start()


def check_output(output: Iterable[str], expected: Iterable[str], *, exactly_once: bool) -> None:
    """Exactly-once: the same multiset. At-least-once: nothing lost, and some duplicates."""
    output, expected = list(output), list(expected)
    if exactly_once:
        got, want = Counter(output), Counter(expected)
        assert got == want, (
            f"missing {sum((want - got).values())}, extra {sum((got - want).values())} "
            f"(duplicates {duplicates(output)})"
        )
    else:
        assert set(output) == set(expected)
        assert duplicates(output) > 0, "the fault left no duplicates: the test proves nothing"


def first_batch_done(query: StreamingQuery, timeout: float = 180) -> bool:
    """Wait until the query has run a micro-batch (or ended); False if it failed.

    Tests that run two queries start the second only then. Two queries over the `onceflow`
    format starting at once in a fresh session can race in Spark's
    PythonStreamingSourceRunner.init(), which puts keys into the one HashMap every task of
    the registered source carries; a lost race leaves it counting an entry it does not hold,
    and every task attempt then fails with java.io.OptionalDataException (Spark's bug, not
    ours: test_concurrent_start.py, tests/spark/repro/). Once a query has run, the keys are
    there and later starts only replace their values.
    """
    deadline = time.monotonic() + timeout
    while query.isActive and query.lastProgress is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no micro-batch of {query.name or query.id} in {timeout} s")
        time.sleep(0.1)
    return query.exception() is None
