"""Copy a topic to another, exactly once, optionally through a user's Python function.

`--transform package.module:function` names a function `(key, value) -> (key, value) | None`
over bytes; None drops the record. It must be deterministic (a re-run task must produce the
same records in the same order).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from onceflow.pipelines.session import (
    PipelineOptions,
    add_common_arguments,
    pipeline,
    run_pipeline,
)
from onceflow.pipelines.sql_output import add_sql_arguments, sql_source, start_sql_sink

Transform = Callable[[bytes | None, bytes | None], tuple[bytes | None, bytes | None] | None]


def load_transform(spec: str) -> Transform:
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"--transform wants package.module:function, not {spec!r}")
    return getattr(importlib.import_module(module), name)


def transformed(df: DataFrame, spec: str | None) -> DataFrame:
    records = df.select("key", "value")
    if spec is None:
        return records
    load_transform(spec)  # fail on the driver, before any task runs

    def apply(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = load_transform(spec)
        for batch in batches:
            keys, values = [], []
            for key, value in zip(
                batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True
            ):
                out = fn(key, value)
                if out is not None:
                    keys.append(out[0])
                    values.append(out[1])
            yield pa.RecordBatch.from_arrays(
                [pa.array(keys, pa.binary()), pa.array(values, pa.binary())], ["key", "value"]
            )

    return records.mapInArrow(apply, "key binary, value binary")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="copy", description=__doc__.splitlines()[0])
    add_common_arguments(p, input_topic=None, output_topic=None)
    p.add_argument("--transform", default=None, help="package.module:function")
    add_sql_arguments(p, table="events")
    for action in p._actions:  # with --sink-url there is no output topic (checked in main)
        if action.dest == "output_topic":
            action.required = False
    return p


EVENT_COLUMNS = ("topic", "partition", "offset", "key", "value", "timestamp")


@pipeline
def start(
    spark: SparkSession,
    options: PipelineOptions,
    transform: str | None = None,
    sink_url: str | None = None,
    table: str = "events",
) -> StreamingQuery:
    """The input topic's records (through `transform`) into the output topic (or, with
    `sink_url`, appended to a database table keyed by topic, partition and offset)."""
    if sink_url:
        if transform is not None:
            raise ValueError("--transform applies to a topic output only")
        events = sql_source(spark, options, sink_url, table).select(*EVENT_COLUMNS)
        return start_sql_sink(
            events, options, sink_url, table, mode="append", keys=("topic", "partition", "offset")
        )
    return options.start_sink(transformed(options.source(spark), transform))


def main(argv: Sequence[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    if args.output_topic is None and args.sink_url is None:
        p.error("one of --output and --sink-url is required")
    if args.output_topic is None:
        args.output_topic = ""  # unused: the rows go to the database
    run_pipeline(
        start,
        "onceflow-copy",
        args,
        transform=args.transform,
        sink_url=args.sink_url,
        table=args.table,
    )


if __name__ == "__main__":
    main()
