"""`onceflow bench-eos`: what exactly-once costs, measured in one run.

For each target (in rounds, the targets interleaved in each): producer throughput of plain
(acks=all), idempotent and transactional producers (a commit every --commit-interval-ms), what
each costs a started broker (CPU) and its round trips, consumer throughput of read_committed and
read_uncommitted over one topic written by the transactional producers (with some of their
transactions aborted), and how long a commit takes. The ratios are printed next to Apache
Kafka's published targets, as met / not met: figures to read, never assertions. The work
is in `onceflow.bench`.
"""

from __future__ import annotations

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
from onceflow.bench.kafka_target import kafka_targets
from onceflow.bench.progress import bench_progress
from onceflow.bench.render import (
    consumers_table,
    eos_cost_table,
    latency_table,
    producers_table,
    targets_table,
)
from onceflow.bench.report import eos_json
from onceflow.bench.targets import require_distinct_names
from onceflow.bench.workload import client_settings
from onceflow.cli import bench_options
from onceflow.cli.options import ConsumerProperties, ProducerProperties


def bench_eos_command(
    bootstrap_server: bench_options.BenchTargets = None,
    embedded: bench_options.Embedded = False,
    apache_kafka: bench_options.ApacheKafka = None,
    apache_kafka_durability: bench_options.ApacheKafkaDurability = "both",
    value_size: Annotated[int, typer.Option("--value-size", help="Value size in bytes.")] = (
        DEFAULT_VALUE_SIZE
    ),
    records: Annotated[
        int, typer.Option("--records", help="Records per producer kind (plain, idempotent, txn).")
    ] = DEFAULT_RECORDS,
    producers: bench_options.ProducerCount = 1,
    partitions: bench_options.PartitionCount = 6,
    replication_factor: bench_options.ReplicationFactor = 1,
    commit_interval_ms: Annotated[
        int,
        typer.Option("--commit-interval-ms", help="Transactional producers commit this often."),
    ] = DEFAULT_COMMIT_INTERVAL_MS,
    abort_ratio: Annotated[
        float,
        typer.Option("--abort-ratio", help="Share of transactions aborted instead of committed."),
    ] = DEFAULT_ABORT_RATIO,
    rounds: bench_options.Rounds = DEFAULT_ROUNDS,
    warm_up_rounds: bench_options.WarmUpRounds = 0,
    producer_property: ProducerProperties = None,
    consumer_property: ConsumerProperties = None,
    json_path: bench_options.JsonReport = None,
) -> None:
    """Throughput of plain, idempotent and transactional producers, read_committed and
    read_uncommitted consumers, and commit latency, next to Kafka's published targets."""
    settings = EosSettings(
        records,
        value_size,
        producers,
        partitions,
        replication_factor,
        commit_interval_ms,
        abort_ratio,
        rounds,
        client_settings(EOS_PRODUCER_SETTINGS, producer_property, "--producer-property"),
        client_settings(EOS_CONSUMER_SETTINGS, consumer_property, "--consumer-property"),
        warm_up_rounds,
    )
    settings.check()
    specs = eos_targets(
        bootstrap_server or [], embedded, kafka_targets(apache_kafka, apache_kafka_durability)
    )
    require_distinct_names(specs)

    progress = bench_progress()
    run = EosRun(settings, progress)
    with progress:
        run.measure(specs)
    bench_options.report_run(
        [
            producers_table(run.measurements),
            consumers_table(run.measurements),
            latency_table(run.measurements),
            eos_cost_table(run.measurements),
            targets_table(run.measurements),
        ],
        json_path,
        lambda: eos_json(run.measurements, settings),
        run.measurements,
        "targets",
        blank_line_after=True,
    )
