"""`onceflow bench`: produce and consume throughput of brokers, compared in one run.

For each target and value size it creates a topic, produces with confluent-kafka from one
or more producer processes (acks=all, idempotent, linger.ms=5) counting delivery reports,
then reads everything back with one Consumer. One workload runs at a time, so targets do not
compete for the machine; everything is measured --rounds times with the targets interleaved
in each round (a shared machine's drift touches each alike), and the tables show the median
round. The first target (or --baseline) is the reference for the ratios. Brokers the
benchmark starts itself (--embedded, --tansu, --apache-kafka) all run from the first round to
the last, idle but for their own workloads, and get their RSS and CPU time measured. The
work is in `onceflow.bench`.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from onceflow.bench.consumer import CONSUMER_SETTINGS
from onceflow.bench.kafka_target import kafka_targets
from onceflow.bench.plot import FORMATS as PLOT_FORMATS
from onceflow.bench.producers import PRODUCER_SETTINGS
from onceflow.bench.progress import bench_progress
from onceflow.bench.render import cost_table, idle_table, results_table
from onceflow.bench.report import throughput_json
from onceflow.bench.targets import require_distinct_names
from onceflow.bench.throughput import DEFAULT_ROUNDS, bench_settings, throughput_targets
from onceflow.bench.throughput_run import BenchRun
from onceflow.bench.workload import client_settings
from onceflow.cli import bench_options
from onceflow.cli.options import ConsumerProperties, ProducerProperties
from onceflow.tools.errors import UsageError
from onceflow.tools.option_values import require_at_least


def bench_command(
    bootstrap_server: bench_options.BenchTargets = None,
    embedded: bench_options.Embedded = False,
    tansu: Annotated[bool, typer.Option("--tansu", help="Start a Tansu broker (memory).")] = False,
    tansu_path: Annotated[
        str | None, typer.Option("--tansu-binary", help="Path of the tansu executable.")
    ] = None,
    apache_kafka: bench_options.ApacheKafka = None,
    apache_kafka_durability: bench_options.ApacheKafkaDurability = "both",
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", help="Target the ratios compare to (default: first)."),
    ] = None,
    value_size: Annotated[
        list[int] | None,
        typer.Option("--value-size", help="Value size in bytes; repeatable (default 100, 1024)."),
    ] = None,
    records: Annotated[
        int | None,
        typer.Option(
            "--records", help="Records per value size (default 1M for 100 B, 200k for 1 KiB)."
        ),
    ] = None,
    producers: bench_options.ProducerCount = 1,
    partitions: bench_options.PartitionCount = 6,
    replication_factor: bench_options.ReplicationFactor = 1,
    idle_partitions: Annotated[
        int,
        typer.Option(
            "--idle-partitions", help="Also measure RSS of a started broker with N idle partitions."
        ),
    ] = 0,
    rounds: bench_options.Rounds = DEFAULT_ROUNDS,
    warm_up_rounds: bench_options.WarmUpRounds = 0,
    producer_property: ProducerProperties = None,
    consumer_property: ConsumerProperties = None,
    json_path: bench_options.JsonReport = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            metavar="FILE",
            help="Also draw the figures: records/s of each target and value size (median "
            "round, every round a dot) and the producers' ack round trips over the produce "
            "phase; FILE.png, FILE.svg, or FILE.html (self-contained, with a table).",
        ),
    ] = None,
) -> None:
    """Produce and consume throughput (records/s, MB/s) of brokers, with ratios to a baseline."""
    settings = bench_settings(
        value_size, records, producers, partitions, replication_factor, idle_partitions, rounds
    )
    require_at_least(("--warm-up-rounds", warm_up_rounds, 0))
    settings.warm_up_rounds = warm_up_rounds
    settings.producer_settings = client_settings(
        PRODUCER_SETTINGS, producer_property, "--producer-property"
    )
    settings.consumer_settings = client_settings(
        CONSUMER_SETTINGS, consumer_property, "--consumer-property"
    )
    kafka = kafka_targets(apache_kafka, apache_kafka_durability)
    specs = throughput_targets(
        bootstrap_server or [],
        embedded or not (bootstrap_server or tansu or kafka),
        tansu,
        tansu_path,
        kafka,
    )
    names = require_distinct_names(specs)
    if baseline is not None and baseline not in names:
        raise UsageError(f"--baseline '{baseline}' is not a target: {', '.join(names)}.")
    reference = baseline or names[0]
    if plot is not None and plot.suffix.lower() not in PLOT_FORMATS:
        raise UsageError(f"--plot '{plot}': the file must end in {', '.join(PLOT_FORMATS)}.")

    progress = bench_progress()
    run = BenchRun(settings, progress)
    with progress:
        run.measure(specs)
    if plot is not None:
        from onceflow.bench.plot import write_plot

        write_plot(run.measurements, plot, f"onceflow bench, baseline {reference}", command_line())
    bench_options.report_run(
        [
            results_table(run.measurements, reference),
            cost_table(run.measurements),
            idle_table(run.idle) if run.idle else None,
        ],
        json_path,
        lambda: throughput_json(run.measurements, run.idle, reference, settings),
        run.measurements,
        "measurements",
    )


def command_line() -> str:
    """How this run was started (shown on the --plot page)."""
    return shlex.join(["onceflow", *sys.argv[1:]])
