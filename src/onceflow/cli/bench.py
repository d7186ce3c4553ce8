"""`onceflow bench`: produce and consume throughput of brokers, compared in one run.

For each target and value size it creates a topic, produces with confluent-kafka from one
or more producer processes (acks=all, idempotent, linger.ms=5) counting delivery reports,
then reads everything back with one Consumer. One workload runs at a time, so targets do not
compete for the machine; everything is measured --rounds times with the targets interleaved
in each round (a shared machine's drift touches each alike), and the tables show the median
round. The first target (or --baseline) is the reference for the ratios. Brokers the
benchmark starts itself (--embedded, --tansu) all run from the first round to the last, idle
but for their own workloads, and get their RSS measured. The work is in `onceflow.bench`.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from onceflow.bench.consumer import CONSUMER_SETTINGS
from onceflow.bench.producers import PRODUCER_SETTINGS
from onceflow.bench.progress import bench_progress
from onceflow.bench.render import idle_table, results_table
from onceflow.bench.report import throughput_json
from onceflow.bench.targets import require_distinct_names
from onceflow.bench.throughput import DEFAULT_ROUNDS, bench_settings, throughput_targets
from onceflow.bench.throughput_run import BenchRun
from onceflow.cli import options
from onceflow.cli.options import (
    CliError,
    UsageError,
    parse_pairs,
    stdout_console,
)


def bench_command(
    bootstrap_server: options.BenchTargets = None,
    embedded: Annotated[
        bool,
        typer.Option("--embedded", help="Start onceflow brokers (fsync on, and --no-fsync)."),
    ] = False,
    tansu: Annotated[bool, typer.Option("--tansu", help="Start a Tansu broker (memory).")] = False,
    tansu_path: Annotated[
        str | None, typer.Option("--tansu-binary", help="Path of the tansu executable.")
    ] = None,
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
    producers: options.ProducerCount = 1,
    partitions: options.PartitionCount = 6,
    replication_factor: options.ReplicationFactor = 1,
    idle_partitions: Annotated[
        int,
        typer.Option(
            "--idle-partitions", help="Also measure RSS of a started broker with N idle partitions."
        ),
    ] = 0,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds", help="Measure every target this many times, interleaved; show the median."
        ),
    ] = DEFAULT_ROUNDS,
    producer_property: options.ProducerProperties = None,
    consumer_property: options.ConsumerProperties = None,
    json_path: options.JsonReport = None,
) -> None:
    """Produce and consume throughput (records/s, MB/s) of brokers, with ratios to a baseline."""
    settings = bench_settings(
        value_size, records, producers, partitions, replication_factor, idle_partitions, rounds
    )
    settings.producer_settings = {
        **PRODUCER_SETTINGS,
        **parse_pairs(producer_property or [], "--producer-property"),
    }
    settings.consumer_settings = {
        **CONSUMER_SETTINGS,
        **parse_pairs(consumer_property or [], "--consumer-property"),
    }
    specs = throughput_targets(
        bootstrap_server or [], embedded or not (bootstrap_server or tansu), tansu, tansu_path
    )
    names = require_distinct_names(specs)
    if baseline is not None and baseline not in names:
        raise UsageError(f"--baseline '{baseline}' is not a target: {', '.join(names)}.")
    baseline = baseline or names[0]

    progress = bench_progress()
    run = BenchRun(settings, progress)
    with progress:
        run.measure(specs)

    console = stdout_console()
    console.print(results_table(run.measurements, baseline))
    if run.idle:
        console.print(idle_table(run.idle))
    if json_path is not None:
        document = throughput_json(run.measurements, run.idle, baseline, settings)
        json_path.write_text(json.dumps(document, indent=2) + "\n")
    failed = [m for m in run.measurements if m.error]
    if failed:
        raise CliError(f"{len(failed)} of {len(run.measurements)} measurements failed.")
