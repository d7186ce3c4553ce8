"""One SparkSession for the whole test session: local[2, 4], so that failed tasks are retried."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import onceflow.spark
from onceflow.spark.at_least_once import close_producers
from onceflow.spark.mark_readers import close_all
from onceflow.spark.sql_sink import FAULT_DIR_ENV
from tests.spark.postgres import PostgresServer, require_postgres

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    # Python workers must import functions defined in these test modules (`tests.spark...`)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    # the onceflow-sql sink's task-fault hook: the workers inherit it from the session's JVM
    os.environ[FAULT_DIR_ENV] = str(tmp_path_factory.mktemp("sql-faults"))
    session = onceflow.spark.local_session(
        cores=2,
        max_failures=4,
        app_name="onceflow-tests",
        conf={
            "spark.sql.streaming.checkpointLocation": str(tmp_path_factory.mktemp("checkpoints")),
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture
def small_arrow_batches(spark: SparkSession) -> Iterator[None]:
    """Rows reach the sink in batches of 25, so a task can fail part-way through its rows."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "25")
    yield
    spark.conf.set(key, before)


@pytest.fixture(autouse=True)
def _drop_cached_clients() -> Iterator[None]:
    """Tests that run sink tasks in this process leave no client behind for the next broker."""
    yield
    close_all()
    close_producers(timeout_s=1)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session's onceflow-sql tests (a database each)."""
    server = PostgresServer(require_postgres())
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database: a SQLite file, or a new database on the session's PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sink.db'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.new_database(request.node.name)
