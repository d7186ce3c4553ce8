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
from onceflow.spark import exactly_once_writer, local_session, register


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


def start(
    spark: SparkSession,
    *,
    bootstrap: str,
    input_topic: str,
    output_topic: str,
    checkpoint: str,
    prefix: str,
    exactly_once: bool = True,
    max_offsets_per_trigger: int | None = None,
) -> StreamingQuery:
    reader = (
        spark.readStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", input_topic)
        .option("startingOffsets", "earliest")
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    write = exactly_once_writer(bootstrap, output_topic, prefix, exactly_once=exactly_once)
    crash_at = os.environ.get(CRASH_AFTER_BATCH_ENV)
    after = _crash_after(int(crash_at)) if crash_at else None

    def write_batch(df: DataFrame, batch_id: int) -> None:
        write(df, batch_id)
        if after is not None:
            after(batch_id)

    return (
        word_counts(reader.load())
        .writeStream.outputMode("update")
        .foreachBatch(write_batch)
        .option("checkpointLocation", checkpoint)
        .start()
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wordcount", description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap-server", required=True)
    p.add_argument("--input", default="sentences")
    p.add_argument("--output", default="word-counts")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--prefix", default=None, help="transactional id prefix [the output topic]")
    p.add_argument("--at-least-once", action="store_true", help="plain sink, for comparison")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument(
        "--until-caught-up",
        action="store_true",
        help="stop once every available record is processed",
    )
    p.add_argument("--master", default=None, help="Spark master [local[2,4] when run locally]")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.master or os.environ.get("SPARK_HOME"):
        builder = SparkSession.builder.appName("onceflow-wordcount")
        spark = register((builder.master(args.master) if args.master else builder).getOrCreate())
    else:
        spark = local_session(app_name="onceflow-wordcount")
    query = start(
        spark,
        bootstrap=args.bootstrap_server,
        input_topic=args.input,
        output_topic=args.output,
        checkpoint=args.checkpoint,
        prefix=args.prefix or f"wordcount.{args.output}",
        exactly_once=not args.at_least_once,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
    )
    if args.until_caught_up:
        query.processAllAvailable()
        query.stop()
    else:
        query.awaitTermination()


if __name__ == "__main__":
    main()
