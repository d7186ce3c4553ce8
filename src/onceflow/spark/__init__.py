"""onceflow on PySpark: a read_committed Kafka source and exactly-once Kafka sinks.

    spark = onceflow.spark.local_session()          # or register(spark) on your own session
    df = spark.readStream.format("onceflow").option("kafka.bootstrap.servers", bs) ...
    df.writeStream.format("onceflow").option("topic", "out").option("checkpointLocation", cp)

Works against onceflow's broker and any Kafka cluster with transactions: the tasks use
confluent-kafka, and no connector jar is needed.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from onceflow.spark.foreach_batch import exactly_once_writer
from onceflow.spark.source import FORMAT, OnceflowDataSource

__all__ = ["FORMAT", "OnceflowDataSource", "exactly_once_writer", "local_session", "register"]


def register(spark: SparkSession) -> SparkSession:
    """Register the `onceflow` format (source and sinks) with a session; returns it."""
    spark.dataSource.register(OnceflowDataSource)
    return spark


def local_session(
    cores: int = 2,
    *,
    max_failures: int = 4,
    app_name: str = "onceflow",
    shuffle_partitions: int | None = None,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """A local SparkSession set up for onceflow pipelines, with the format registered.

    `local[cores, max_failures]` so that failed tasks are retried (plain `local[N]` never
    retries); shuffle partitions default to 2 per core rather than 200, since each output
    partition is one Kafka transaction per micro-batch.
    """
    # executors' Python workers must run this interpreter (where onceflow is installed)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(f"local[{cores},{max_failures}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 2 * cores))
        .config("spark.python.worker.reuse", "true")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return register(builder.getOrCreate())
