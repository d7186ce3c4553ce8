"""The bundled pipelines into a SQL database (`--sink-url URL --table NAME`): the
`onceflow-sql` sink, and the source started from the database's positions when the query has
no checkpoint yet (a deleted checkpoint, or a new cluster)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from onceflow.pipelines.checkpoint import clear_unfinished_first_batch, has_offsets
from onceflow.pipelines.session import PipelineOptions

# onceflow.sql (SQLAlchemy, psycopg) is imported only when a pipeline writes to a database:
# the Kafka-only pipelines run on nodes without those packages.


def add_sql_arguments(p: argparse.ArgumentParser, table: str) -> None:
    p.add_argument(
        "--sink-url",
        default=None,
        metavar="URL",
        help="Write into this database (postgresql://user@host:port/db, sqlite:///file.db) "
        "instead of the output topic.",
    )
    p.add_argument("--table", default=table, help=f"The table it writes [{table}].")


def topic_partitions(options: PipelineOptions, topic: str) -> list[tuple[str, int]]:
    admin = AdminClient({"bootstrap.servers": options.bootstrap, **options.client})
    metadata = admin.list_topics(topic, timeout=30).topics[topic]
    if metadata.error is not None:
        raise RuntimeError(f"topic {topic!r}: {metadata.error}")
    return [(topic, p) for p in sorted(metadata.partitions)]


def starting_offsets(options: PipelineOptions, url: str, pipeline: str) -> str:
    """'earliest', or the database's positions when the checkpoint has none (Spark's
    checkpoint, when there is one, decides where a query resumes)."""
    from onceflow.sql.positions import read_positions, to_spark_starting_offsets

    if has_offsets(options.checkpoint):
        return "earliest"
    positions = read_positions(url, pipeline, [options.input_topic])
    if not positions:
        return "earliest"
    return to_spark_starting_offsets(positions, topic_partitions(options, options.input_topic))


def sql_source(spark: SparkSession, options: PipelineOptions, url: str, table: str) -> DataFrame:
    return options.source(spark, starting=starting_offsets(options, url, table))


def start_sql_sink(
    df: DataFrame,
    options: PipelineOptions,
    url: str,
    table: str,
    *,
    mode: str,
    keys: Sequence[str],
    accumulate: Sequence[str] = (),
    output_mode: str = "append",
) -> StreamingQuery:
    from onceflow.spark.sql_sink import SQL_FORMAT, register

    register(df.sparkSession)
    writer = (
        df.writeStream.format(SQL_FORMAT)
        .outputMode(output_mode)
        .option("url", url)
        .option("table", table)
        .option("mode", mode)
        .option("keys", ",".join(keys))
        .option("checkpointLocation", options.checkpoint)
    )
    if accumulate:
        writer = writer.option("accumulate", ",".join(accumulate))
    clear_unfinished_first_batch(options.checkpoint)
    return writer.start()
