"""`onceflow bench-spark`: end-to-end records/s of the bundled pipelines, exactly-once sink
against the plain (at-least-once) sink, in one run on one local Spark session. The work is
in `onceflow.bench.spark`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from onceflow.bench.spark import run_spark_bench, spark_table


def bench_spark_command(
    records: Annotated[int, typer.Option(help="Records copied per run.")] = 500_000,
    sentences: Annotated[int, typer.Option(help="Sentences counted per run.")] = 100_000,
    per_trigger: Annotated[int, typer.Option(help="maxOffsetsPerTrigger.")] = 100_000,
    cores: Annotated[int, typer.Option(help="local[N] cores.")] = 2,
) -> None:
    """Copy and word count pipelines: exactly-once vs plain sink, records/s and the ratio."""
    if min(records, sentences, per_trigger, cores) < 1:
        raise typer.BadParameter("every option must be positive")
    results = run_spark_bench(records, sentences, per_trigger, cores)
    Console().print(spark_table(results, cores))
