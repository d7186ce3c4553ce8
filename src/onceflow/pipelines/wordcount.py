"""Word count, the streaming job of the exactly-once literature.

Sentences (the `value` of each record of the input topic, read with read_committed) are split
into words and counted in a streaming aggregation in update mode; each micro-batch writes the
words whose count changed, as (key=word, value=running count), to the output topic through the
exactly-once `foreachBatch` writer. A reader of the output takes the last value per word.

Run it with `onceflow run wordcount ...`, `python -m onceflow.pipelines.wordcount ...`, or
`spark-submit .../onceflow/pipelines/wordcount.py ...` on a cluster.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from onceflow.pipelines import CRASH_AFTER_BATCH_ENV
from onceflow.pipelines.checkpoint import clear_unfinished_first_batch
from onceflow.pipelines.session import (
    PipelineOptions,
    add_common_arguments,
    pipeline,
    run_pipeline,
)
from onceflow.pipelines.sql_output import add_sql_arguments, sql_source, start_sql_sink
from onceflow.spark import exactly_once_writer

WORD = re.compile(r"[^a-z0-9']+")


def word_counts(lines: DataFrame) -> DataFrame:
    words = lines.select(
        F.explode(F.split(F.lower(F.col("value").cast("string")), r"[^a-z0-9']+")).alias("word")
    ).where(F.col("word") != "")
    counts = words.groupBy("word").count()
    return counts.select(F.col("word").alias("key"), F.col("count").cast("string").alias("value"))


def word_increments(lines: DataFrame) -> DataFrame:
    """(word, count) of each task's sentences: no Spark state, so the counts in a database
    (each batch's increments added once, by the onceflow-sql sink) survive a lost checkpoint."""

    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counts: Counter[str] = Counter()
        for batch in batches:
            for value in batch.column(0).to_pylist():
                if value is not None:
                    text = value.decode("utf-8", "replace").lower()
                    counts.update(w for w in WORD.split(text) if w)
        words = sorted(counts)
        yield pa.RecordBatch.from_arrays(
            [pa.array(words, pa.string()), pa.array([counts[w] for w in words], pa.int64())],
            ["word", "count"],
        )

    return lines.select("value").mapInArrow(count, "word string, count long")


def _crash_after(batch_id: int) -> Callable[[int], None]:
    def check(written: int) -> None:
        if written == batch_id:
            os.kill(os.getpid(), signal.SIGKILL)

    return check


@pipeline
def start(
    spark: SparkSession,
    options: PipelineOptions,
    sink_url: str | None = None,
    table: str = "word_counts",
) -> StreamingQuery:
    """Running word counts of the input topic's sentences into the output topic (or, with
    `sink_url`, into a database table of word -> count, exact at every moment)."""
    if sink_url:
        lines = sql_source(spark, options, sink_url, table)
        return start_sql_sink(
            word_increments(lines),
            options,
            sink_url,
            table,
            mode="upsert",
            keys=("word",),
            accumulate=("count",),
        )
    prefix = options.prefix or f"wordcount.{options.output_topic}"
    write = exactly_once_writer(
        options.bootstrap, options.output_topic, prefix, exactly_once=options.exactly_once
    )
    crash_at = os.environ.get(CRASH_AFTER_BATCH_ENV)
    after = _crash_after(int(crash_at)) if crash_at else None

    def write_batch(df: DataFrame, batch_id: int) -> None:
        write(df, batch_id)
        if after is not None:
            after(batch_id)

    clear_unfinished_first_batch(options.checkpoint)
    return (
        word_counts(options.source(spark))
        .writeStream.outputMode("update")
        .foreachBatch(write_batch)
        .option("checkpointLocation", options.checkpoint)
        .start()
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wordcount", description=__doc__.splitlines()[0])
    add_common_arguments(p, input_topic="sentences", output_topic="word-counts")
    add_sql_arguments(p, table="word_counts")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    run_pipeline(start, "onceflow-wordcount", args, sink_url=args.sink_url, table=args.table)


if __name__ == "__main__":
    main()
