"""Kafka to PostgreSQL: the exactly-once onceflow-sql sink against a plain at-least-once
database write (each task inserts and commits on its own, as Spark's JDBC sink), in one run.

    PYTHONPATH=src python benchmarks/sql_sink.py [--records N] [--partitions P] [--size B]
        [--rounds R] [--url postgresql://...]

An embedded broker (fsync off) and, without --url, a PostgreSQL server of the distribution's
packages started on a free port in a temporary directory (benchmarks/_support.py); N records
of B bytes in P partitions. Each round copies the whole topic once per mode (plain first; round
0 is a warm-up, not counted), each into its own new table, with `processAllAvailable` on one local
Spark session and `maxOffsetsPerTrigger` N/4 (four micro-batches); records/s is N over the
time from the query's start to its last micro-batch. The median of the rounds and the ratio
are printed. A benchmark: it prints figures, never fails.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import DataFrame

from onceflow.bench.spark import produce_records
from onceflow.broker.embedded import EmbeddedBroker
from onceflow.spark import local_session
from onceflow.spark.sql_sink import register
from onceflow.sql.engine import engine_for

COLUMNS = ("topic", "partition", "offset", "key", "value", "timestamp")


def plain_writer(url: str, table: str):
    """foreachBatch: every task inserts its rows and commits, on its own (at-least-once)."""
    import sqlalchemy as sa

    def write(df: DataFrame, _batch_id: int) -> None:
        def insert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            target = sa.Table(table, sa.MetaData(), autoload_with=engine_for(url))
            with engine_for(url).begin() as conn:
                for batch in batches:
                    rows = batch.to_pylist()
                    if rows:
                        conn.execute(target.insert(), rows)
            yield pa.RecordBatch.from_arrays([pa.array([0], pa.int32())], ["n"])

        df.mapInArrow(insert, "n int").collect()

    return write


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--url", default=None)
    args = p.parse_args()
    server = None
    if args.url is None:
        from _support import PostgresServer, postgres_binaries

        server = PostgresServer(postgres_binaries()).start()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        broker = EmbeddedBroker(root / "broker", fsync=False).start()
        try:
            url = args.url or server.new_database("bench")
            run(args, broker.bootstrap, url, root)
        finally:
            broker.stop()
            if server is not None:
                server.close()


def run(args: argparse.Namespace, bootstrap: str, url: str, root: Path) -> None:
    import sqlalchemy as sa

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures need it alive
    admin.create_topics([NewTopic("in", args.partitions, 1)])["in"].result(30)
    produce_records(bootstrap, "in", args.records, b"x" * args.size)
    spark = register(local_session(cores=2, app_name="bench-sql"))
    spark.sparkContext.setLogLevel("ERROR")
    figures: dict[str, list[float]] = {"at-least-once": [], "exactly-once": []}
    for r in range(args.rounds + 1):
        for mode in figures:
            table = f"events_{mode.replace('-', '_')}_{r}"
            df = (
                spark.readStream.format("onceflow")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", "in")
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", str(max(1, args.records // 4)))
                .load()
                .select(*COLUMNS)
            )
            checkpoint = str(root / f"cp-{table}")
            if mode == "exactly-once":
                writer = (
                    df.writeStream.format("onceflow-sql")
                    .option("url", url)
                    .option("table", table)
                    .option("keys", "topic,partition,offset")
                )
            else:
                with engine_for(url).begin() as conn:
                    conn.execute(
                        sa.text(
                            f'CREATE TABLE {table} (topic text, "partition" int, "offset" bigint,'
                            ' key bytea, value bytea, "timestamp" timestamptz)'
                        )
                    )
                writer = df.writeStream.foreachBatch(plain_writer(url, table))
            started = time.monotonic()
            query = writer.option("checkpointLocation", checkpoint).start()
            query.processAllAvailable()
            elapsed = time.monotonic() - started
            query.stop()
            with engine_for(url).connect() as conn:
                rows = conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
            rate = args.records / elapsed
            print(f"round {r} {mode}: {rows} rows in {elapsed:.1f} s, {rate:,.0f} records/s")
            if r > 0:
                figures[mode].append(rate)
    plain = statistics.median(figures["at-least-once"])
    once = statistics.median(figures["exactly-once"])
    print(f"at-least-once (per-task commits): {plain:,.0f} records/s")
    print(f"exactly-once (onceflow-sql):      {once:,.0f} records/s  ratio {once / plain:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
