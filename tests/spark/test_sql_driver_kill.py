"""The driver SIGKILLed right after the database committed a micro-batch and before Spark's
commit log recorded it, once in the copy into PostgreSQL and once in the word count into
SQLite: the restarted queries replay that batch, the sink recognises it by its mark, and both
databases hold the exact result."""

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


def _run(
    bootstrap: str, checkpoints: Path, targets: list[str], log: Path, crash: str | None
) -> int:
    """The driver job; `crash`: the table and batch it is SIGKILLed after (`events:1`)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop(CRASH_AFTER_COMMIT_ENV, None)
    if crash:
        env[CRASH_AFTER_COMMIT_ENV] = crash
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
    # the copy into PostgreSQL and the word count into SQLite, in one driver (the second query
    # starts after the first one's first trigger)
    targets = {
        "events": postgres.new_database("driver_kill"),
        "word_counts": f"sqlite:///{tmp_path / 'sink.db'}",
    }
    args = [f"{table}={url}" for table, url in targets.items()]
    checkpoints = tmp_path / "checkpoints"
    log = tmp_path / "driver.log"

    def killed_after_commit(index: int, table: str, batch: int) -> None:
        """The driver dies at `table`'s `batch`: in the database, not in Spark's commit log."""
        code = _run(broker.bootstrap, checkpoints, args, log, f"{table}:{batch}")
        assert code == -signal.SIGKILL, f"{table}: exit {code}: {log.read_text()[-3000:]}"
        assert _marks(targets[table]).get(table) == batch, _marks(targets[table])
        commits = checkpoint(checkpoints, index, table) / "commits"
        assert not (commits / str(batch)).exists(), f"{table}: batch {batch} in the commit log"

    killed_after_commit(0, "events", CRASH_BATCH)
    # the word count's next batch (the first run may have stopped it anywhere before its end:
    # 200 sentences at 50 a trigger are 4 batches, and it started one trigger late)
    killed_after_commit(1, "word_counts", _marks(targets["word_counts"]).get("word_counts", -1) + 1)

    assert _run(broker.bootstrap, checkpoints, args, log, None) == 0, log.read_text()[-3000:]
    assert database_counts(targets["word_counts"]) == true_counts(written)
    check_events(database_events(targets["events"]), written)
