"""`onceflow bench-spark`: end-to-end records/s of the bundled pipelines (copy, wordcount,
file-transactions, mirror), exactly-once sink
against the plain (at-least-once) sink, in one run on one local Spark session, on the embedded
broker and (--apache-kafka DIR|fetched) on an Apache Kafka cluster of --nodes nodes. The work is
in `onceflow.bench.spark`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from onceflow.bench.kafka_target import kafka_distribution
from onceflow.bench.spark import run_spark_bench, spark_table
from onceflow.cli import bench_options


def bench_spark_command(
    records: Annotated[int, typer.Option(help="Records copied per run.")] = 500_000,
    sentences: Annotated[int, typer.Option(help="Sentences counted per run.")] = 100_000,
    per_trigger: Annotated[int, typer.Option(help="maxOffsetsPerTrigger.")] = 100_000,
    files: Annotated[
        int, typer.Option(help="Files of 100 transactions read per file-transactions run.")
    ] = 2_000,
    cores: Annotated[int, typer.Option(help="local[N] cores.")] = 2,
    apache_kafka: bench_options.ApacheKafka = None,
    nodes: Annotated[
        int, typer.Option("--nodes", help="Nodes of the Apache Kafka cluster (--apache-kafka).")
    ] = 3,
    rounds: Annotated[
        int, typer.Option("--rounds", help="Run everything this many times; median round.")
    ] = 1,
) -> None:
    """The bundled pipelines (copy, word count, file-transactions, mirror): exactly-once vs
    plain sink, records/s and the ratio, on the embedded broker and (--apache-kafka) on an
    Apache Kafka cluster, in one run."""
    if min(records, sentences, per_trigger, files, cores, nodes, rounds) < 1:
        raise typer.BadParameter("every option must be positive")
    kafka = kafka_distribution(apache_kafka) if apache_kafka is not None else None
    results = run_spark_bench(records, sentences, per_trigger, cores, kafka, nodes, rounds, files)
    Console().print(spark_table(results, cores))
