"""The driver SIGKILLed right after the database committed a micro-batch and before Spark's
commit log recorded it: the restarted queries replay that batch, the sink recognises it by its
mark, and both databases hold the exact result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.spark.sql_sink import CRASH_AFTER_COMMIT_ENV
from tests.process_group import kill_process_group
from tests.spark.kafka_io import create_topic, produce
from tests.spark.postgres import PostgresServer
from tests.spark.sql_driver_job import checkpoint
from tests.spark.sql_runs import (
    check_events,
    database_counts,
    database_events,
    sentences,
    true_counts,
)

from .conftest import ROOT

CRASH_BATCH = 1


def _run(bootstrap: str, checkpoints: Path, targets: list[str], log: Path, crash: bool) -> int:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop(CRASH_AFTER_COMMIT_ENV, None)
    if crash:
        env[CRASH_AFTER_COMMIT_ENV] = str(CRASH_BATCH)
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.spark.sql_driver_job", bootstrap, str(checkpoints), *targets],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the crash hook kills its own process group
    )
    try:
        return driver.wait(300)
    finally:
        kill_process_group(driver)


def _marks(url: str) -> dict[str, int]:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("onceflow_sql_marks"):
                return {}  # the driver died before this query started
            rows = conn.execute(sa.text("SELECT pipeline, batch_id FROM onceflow_sql_marks"))
            return {pipeline: int(batch) for pipeline, batch in rows}
    finally:
        engine.dispose()


# minutes under a loaded CI worker (126-230 s measured at load 12-18): past the 300 s default
@pytest.mark.timeout(900)
def test_driver_killed_between_database_commit_and_commit_log(
    make_broker: Callable[..., EmbeddedBroker], postgres: PostgresServer, tmp_path: Path
) -> None:
    broker = make_broker()
    create_topic(broker.bootstrap, "sentences", 2)
    written = sentences(0, 200)
    produce(broker.bootstrap, "sentences", written)
    # the copy into PostgreSQL (it meets the crash: the second query starts after the first
    # one's first trigger) and the word count into SQLite, in one driver
    targets = {
        "events": postgres.new_database("driver_kill"),
        "word_counts": f"sqlite:///{tmp_path / 'sink.db'}",
    }
    args = [f"{table}={url}" for table, url in targets.items()]
    checkpoints = tmp_path / "checkpoints"
    log = tmp_path / "driver.log"

    assert _run(broker.bootstrap, checkpoints, args, log, crash=True) == -signal.SIGKILL, (
        log.read_text()[-3000:]
    )
    # the fault point was hit: a batch is in the database and not in Spark's commit log
    caught = [
        table
        for i, (table, url) in enumerate(targets.items())
        if _marks(url).get(table) == CRASH_BATCH
        and not (checkpoint(checkpoints, i, table) / "commits" / str(CRASH_BATCH)).exists()
    ]
    assert caught, "no batch was committed to the database and left out of Spark's commit log"

    assert _run(broker.bootstrap, checkpoints, args, log, crash=False) == 0, log.read_text()[-3000:]
    assert database_counts(targets["word_counts"]) == true_counts(written)
    check_events(database_events(targets["events"]), written)
