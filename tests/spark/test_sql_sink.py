"""The bundled pipelines into SQLite and PostgreSQL through the onceflow-sql sink: exact
through a task failing after staging its rows, a broker kill -9, a PostgreSQL kill -9 mid-run
and a deleted checkpoint, with a reader never seeing part of a micro-batch."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.pipelines import copy_topic, wordcount
from onceflow.spark.sql_sink import FAULT_DIR_ENV
from onceflow.sql.positions import read_positions
from tests.spark.kafka_io import create_topic, produce
from tests.spark.postgres import PostgresServer
from tests.spark.sql_driver_job import first_trigger
from tests.spark.sql_runs import (
    WholeBatchReader,
    check_events,
    database_counts,
    database_events,
    sentences,
    true_counts,
)
from tests.waiting import wait_for

PIPELINES = {"word_counts": wordcount, "events": copy_topic}


def _start_all(spark: SparkSession, bootstrap: str, url: str, checkpoints: Path) -> list:
    queries: list[StreamingQuery] = []
    for table, module in PIPELINES.items():
        if queries:
            first_trigger(queries[0])  # as sql_driver_job: a fresh session's first starts alone
        queries.append(
            module.start(
                spark,
                bootstrap=bootstrap,
                input_topic="sentences",
                output_topic="",
                checkpoint=str(checkpoints / table),
                max_offsets_per_trigger=50,
                sink_url=url,
                table=table,
            )
        )
    return queries


def _run_to_end(start: Callable[[], list[StreamingQuery]], retries: int = 3) -> None:
    """Run the queries to the end of their input; a query that failed (the database went
    away) is started again from its checkpoint, as a supervisor would."""
    queries = start()
    for attempt in range(retries + 1):
        try:
            for query in queries:
                query.processAllAvailable()
            break
        except StreamingQueryException:
            for query in queries:
                query.stop()
            if attempt == retries:
                raise
            queries = start()
    for query in queries:
        query.stop()


def _read_so_far(url: str) -> int:
    try:
        return sum(read_positions(url, "events").values())
    except Exception:
        return 0


# minutes under a loaded CI worker (126-230 s measured at load 12-18): past the 300 s default
@pytest.mark.timeout(900)
def test_pipelines_into_database_through_faults(
    spark: SparkSession,
    make_broker: Callable[..., EmbeddedBroker],
    sql_url: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    broker = make_broker()
    create_topic(broker.bootstrap, "sentences", 2)
    written = sentences(0, 300)
    checkpoints = tmp_path / "checkpoints"
    faults = Path(os.environ[FAULT_DIR_ENV])
    reader = WholeBatchReader(sql_url).start()

    def start() -> list[StreamingQuery]:
        return _start_all(spark, broker.bootstrap, sql_url, checkpoints)

    try:
        # (a) one task of each pipeline fails right after its rows are staged
        for table in PIPELINES:
            (faults / f"fail-task-{table}").touch()
        produce(broker.bootstrap, "sentences", written[:100])
        _run_to_end(start)
        for table in PIPELINES:
            assert (faults / f"fail-task-{table}.fired").exists(), f"no task of {table} failed"

        # (d) the broker killed -9 and restarted between runs
        broker.kill()
        broker.start()
        produce(broker.bootstrap, "sentences", written[100:200])

        # (c) PostgreSQL killed -9 mid-run, then restarted
        if sql_url.startswith("postgresql"):
            server: PostgresServer = request.getfixturevalue("postgres")
            queries = start()
            try:
                wait_for(lambda: _read_so_far(sql_url) > 100, 120, "a batch of the second run")
                server.kill()
                server.start()
            finally:
                for query in queries:
                    query.stop()
        _run_to_end(start)

        # (e) the checkpoints deleted: the pipelines resume from the database's positions
        shutil.rmtree(checkpoints)
        produce(broker.bootstrap, "sentences", written[200:])
        _run_to_end(start)
    finally:
        reader.stop()

    assert database_counts(sql_url) == true_counts(written)
    check_events(database_events(sql_url), written)
    assert reader.violations == [], reader.violations[:5]
    assert reader.nonempty_polls > 0, "the reader never saw a row"
