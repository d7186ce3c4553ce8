"""What the benchmark commands (bench, bench-eos) share: their common options (the same
names, help and metavars) and how a run ends: its tables, its JSON file, its exit status."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Protocol

import typer
from rich.table import Table

from onceflow.tools.errors import CliError
from onceflow.tools.output import stdout_console

BenchTargets = Annotated[
    list[str] | None,
    typer.Option(
        "--bootstrap-server",
        "-b",
        metavar="[NAME=]HOST:PORT",
        help="A running broker or cluster to measure; repeatable.",
    ),
]
Embedded = Annotated[
    bool,
    typer.Option(
        "--embedded",
        help="Start onceflow's broker and measure it (fsync on; bench: and with --no-fsync).",
    ),
]
ApacheKafka = Annotated[
    str | None,
    typer.Option(
        "--apache-kafka",
        metavar="DIR|fetched",
        help="Start Apache Kafka (one node) and measure it: a distribution or its libs/ "
        "folder, or 'fetched' for the jars onceflow fetches with Maven.",
    ),
]
ApacheKafkaDurability = Annotated[
    str,
    typer.Option(
        "--apache-kafka-durability",
        metavar="both|fsync|defaults",
        help="Kafka with fsync per write (log.flush.interval.messages=1), with its "
        "defaults, or both (two targets).",
    ),
]
ProducerCount = Annotated[int, typer.Option("--producers", help="Producer processes per workload.")]
PartitionCount = Annotated[int, typer.Option("--partitions", help="Partitions of each topic.")]
ReplicationFactor = Annotated[
    int, typer.Option("--replication-factor", help="Replicas of each benchmark topic.")
]
Rounds = Annotated[
    int,
    typer.Option(
        "--rounds", help="Measure this many times (targets interleaved); show the median round."
    ),
]
WarmUpRounds = Annotated[
    int,
    typer.Option(
        "--warm-up-rounds",
        help="Untimed rounds first, every target alike (a JVM's JIT warms up); dropped.",
    ),
]
JsonReport = Annotated[
    Path | None, typer.Option("--json", help="Also write the figures to this JSON file.")
]


class Measured(Protocol):
    error: str | None


def report_run(
    tables: Iterable[Table | None],
    json_path: Path | None,
    document: Callable[[], dict[str, Any]],
    measurements: Sequence[Measured],
    what: str,
    *,
    blank_line_after: bool = False,
) -> None:
    """Print the tables (None: a table with nothing to show), write the JSON document if
    asked, and fail (exit 1) if any measurement did: `what` names them in the message."""
    console = stdout_console()
    for table in tables:
        if table is not None:
            console.print(table)
            if blank_line_after:
                console.print()
    if json_path is not None:
        json_path.write_text(json.dumps(document(), indent=2) + "\n")
    failed = [m for m in measurements if m.error]
    if failed:
        raise CliError(f"{len(failed)} of {len(measurements)} {what} failed.")
