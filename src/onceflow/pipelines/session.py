"""The Spark session a bundled pipeline runs on: local by default, a cluster with --master."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from onceflow.spark import local_session, register


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap-server", required=True, help="Kafka bootstrap servers.")
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint directory.")
    p.add_argument("--prefix", default=None, help="Transactional id prefix (stable per query).")
    p.add_argument("--at-least-once", action="store_true", help="Plain sink, for comparison.")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument(
        "--until-caught-up",
        action="store_true",
        help="Stop once every available record is processed.",
    )
    p.add_argument("--master", default=None, help="Spark master [local[2,4]].")


def session(app_name: str, master: str | None) -> SparkSession:
    """`local[2,4]` unless a master is given or the job runs under spark-submit."""
    if master or os.environ.get("SPARK_HOME") or os.environ.get("SPARK_ENV_LOADED"):
        builder = SparkSession.builder.appName(app_name)
        return register((builder.master(master) if master else builder).getOrCreate())
    return local_session(app_name=app_name)


def source(spark: SparkSession, bootstrap: str, topic: str, per_trigger: int | None) -> DataFrame:
    reader = (
        spark.readStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(per_trigger))
    return reader.load()


def start_sink(
    df: DataFrame,
    *,
    bootstrap: str,
    checkpoint: str,
    topic: str | None = None,
    prefix: str | None = None,
    exactly_once: bool = True,
) -> StreamingQuery:
    """Start `df` into the onceflow sink (append mode); `topic` None means a topic column."""
    writer = (
        df.writeStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("checkpointLocation", checkpoint)
        .option("exactlyOnce", str(exactly_once).lower())
    )
    if topic:
        writer = writer.option("topic", topic)
    if prefix:
        writer = writer.option("transactional.id.prefix", prefix)
    return writer.start()


def run_until(query: StreamingQuery, until_caught_up: bool) -> None:
    if until_caught_up:
        query.processAllAvailable()
        query.stop()
    else:
        query.awaitTermination()


def run_pipeline(
    start: Callable[..., StreamingQuery], app_name: str, args: argparse.Namespace, **own: Any
) -> None:
    """A pipeline's main(): `start` it with the add_common_arguments options, the --input and
    --output every pipeline has, and its `own` keywords; then run it (to the end of its input
    with --until-caught-up, else for good)."""
    query = start(
        session(app_name, args.master),
        bootstrap=args.bootstrap_server,
        input_topic=args.input,
        output_topic=args.output,
        checkpoint=args.checkpoint,
        prefix=args.prefix,
        exactly_once=not args.at_least_once,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        **own,
    )
    run_until(query, args.until_caught_up)
