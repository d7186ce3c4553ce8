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
import signal
from collections.abc import Callable, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from onceflow.pipelines import CRASH_AFTER_BATCH_ENV
from onceflow.pipelines.session import (
    PipelineOptions,
    add_common_arguments,
    pipeline,
    run_pipeline,
)
from onceflow.spark import exactly_once_writer


def word_counts(lines: DataFrame) -> DataFrame:
    words = lines.select(
        F.explode(F.split(F.lower(F.col("value").cast("string")), r"[^a-z0-9']+")).alias("word")
    ).where(F.col("word") != "")
    counts = words.groupBy("word").count()
    return counts.select(F.col("word").alias("key"), F.col("count").cast("string").alias("value"))


def _crash_after(batch_id: int) -> Callable[[int], None]:
    def check(written: int) -> None:
        if written == batch_id:
            os.kill(os.getpid(), signal.SIGKILL)

    return check


@pipeline
def start(spark: SparkSession, options: PipelineOptions) -> StreamingQuery:
    """Running word counts of the input topic's sentences into the output topic."""
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
    return p


def main(argv: Sequence[str] | None = None) -> None:
    run_pipeline(start, "onceflow-wordcount", parser().parse_args(argv))


if __name__ == "__main__":
    main()
