"""`onceflow bench-eos`: what exactly-once costs, measured in one run.

For each target: producer throughput of plain (acks=all), idempotent and transactional
producers (a commit every --commit-interval-ms), consumer throughput of read_committed and
read_uncommitted over one topic written by the transactional producers (with some of their
transactions aborted), and how long a commit takes. The ratios are printed next to Apache
Kafka's published targets, as met / not met: figures to read, never assertions. The work
is in `onceflow.bench`.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from onceflow.bench.eos_producer import DEFAULT_COMMIT_INTERVAL_MS
from onceflow.bench.eos_run import (
    DEFAULT_ABORT_RATIO,
    DEFAULT_RECORDS,
    DEFAULT_ROUNDS,
    DEFAULT_VALUE_SIZE,
    EOS_CONSUMER_SETTINGS,
    EOS_PRODUCER_SETTINGS,
    EosRun,
    EosSettings,
    eos_targets,
)
from onceflow.bench.progress import bench_progress
from onceflow.bench.render import consumers_table, latency_table, producers_table, targets_table
from onceflow.bench.report import eos_json
from onceflow.bench.targets import require_distinct_names
from onceflow.cli import options
from onceflow.cli.options import (
    CliError,
    UsageError,
    parse_pairs,
    require_at_least,
    stdout_console,
)


def bench_eos_command(
    bootstrap_server: options.BenchTargets = None,
    embedded: Annotated[
        bool,
        typer.Option("--embedded", help="Start an onceflow broker (fsync on) and measure it."),
    ] = False,
    value_size: Annotated[int, typer.Option("--value-size", help="Value size in bytes.")] = (
        DEFAULT_VALUE_SIZE
    ),
    records: Annotated[
        int, typer.Option("--records", help="Records per producer kind (plain, idempotent, txn).")
    ] = DEFAULT_RECORDS,
    producers: options.ProducerCount = 1,
    partitions: options.PartitionCount = 6,
    replication_factor: options.ReplicationFactor = 1,
    commit_interval_ms: Annotated[
        int,
        typer.Option("--commit-interval-ms", help="Transactional producers commit this often."),
    ] = DEFAULT_COMMIT_INTERVAL_MS,
    abort_ratio: Annotated[
        float,
        typer.Option("--abort-ratio", help="Share of transactions aborted instead of committed."),
    ] = DEFAULT_ABORT_RATIO,
    rounds: Annotated[
        int,
        typer.Option("--rounds", help="Measure each kind this many times; show the median."),
    ] = DEFAULT_ROUNDS,
    producer_property: options.ProducerProperties = None,
    consumer_property: options.ConsumerProperties = None,
    json_path: options.JsonReport = None,
) -> None:
    """Throughput of plain, idempotent and transactional producers, read_committed and
    read_uncommitted consumers, and commit latency, next to Kafka's published targets."""
    require_at_least(
        ("--records", records, 1),
        ("--value-size", value_size, 1),
        ("--producers", producers, 1),
        ("--partitions", partitions, 1),
        ("--replication-factor", replication_factor, 1),
        ("--commit-interval-ms", commit_interval_ms, 1),
        ("--rounds", rounds, 1),
    )
    if not 0 <= abort_ratio < 1:
        raise UsageError(f"--abort-ratio must be at least 0 and below 1, not {abort_ratio:g}.")
    settings = EosSettings(
        records,
        value_size,
        producers,
        partitions,
        replication_factor,
        commit_interval_ms,
        abort_ratio,
        rounds,
        {**EOS_PRODUCER_SETTINGS, **parse_pairs(producer_property or [], "--producer-property")},
        {**EOS_CONSUMER_SETTINGS, **parse_pairs(consumer_property or [], "--consumer-property")},
    )
    specs = eos_targets(bootstrap_server or [], embedded)
    require_distinct_names(specs)

    progress = bench_progress()
    run = EosRun(settings, progress)
    with progress:
        for spec in specs:
            run.measure(spec)

    console = stdout_console()
    for table in (
        producers_table(run.measurements),
        consumers_table(run.measurements),
        latency_table(run.measurements),
        targets_table(run.measurements),
    ):
        console.print(table)
        console.print()
    if json_path is not None:
        json_path.write_text(json.dumps(eos_json(run.measurements, settings), indent=2) + "\n")
    failed = [m for m in run.measurements if m.error]
    if failed:
        raise CliError(f"{len(failed)} of {len(run.measurements)} targets failed.")
