"""The database workload of a verify run: loaders store the copy input into a SQL table.

A loader is the copier's counterpart past Kafka: a `DatabaseConsumer` (onceflow.sql.consumer)
in the copiers' group reads the input topic read_committed and, per poll, inserts one row per
record (topic, partition, offset, value, the store's id) and moves the group's positions in
the database, in ONE database transaction; a third of them are rolled back on purpose. Each
store is a `txn` operation of the history (its `reads`, no Kafka writes): `txn-end` with
`end` commit is emitted just before the database commits, so a loader SIGKILLed before it
certainly did not commit (fail) and after it may have (unknown), as for Kafka transactions.
For SQLite (a file in the run's directory) that kill mid-transaction is the database fault.

At the end the harness waits for the database's positions to cover every committed input
record, then reads the table and the positions into the history (`database-read`), which
database_check.py checks against the committed input.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import sqlalchemy as sa
from confluent_kafka import KafkaException, Message

from onceflow.sql.consumer import DatabaseConsumer
from onceflow.sql.engine import DatabaseError, describe, engine_for, first_line
from onceflow.sql.positions import read_positions
from onceflow.sql.postgres_server import PostgresError, PostgresServer
from onceflow.sql.tables import positions_table
from onceflow.verify.faults import FaultError
from onceflow.verify.final_reads import _nothing_left
from onceflow.verify.history import (
    ABORT,
    COMMIT,
    FAIL,
    INFO,
    INVOKE,
    OK,
    READ_COMMITTED,
    TXN,
    TXN_END,
    UNKNOWN,
    WORKER,
    History,
)
from onceflow.verify.workload import (
    ClientError,
    OpStream,
    WorkerSpec,
    WorkloadSpec,
    base_config,
    text,
)

DATABASE_READ = "database-read"  # the op (and process) of the harness's read of the table
STORE = "store"  # marks a txn operation as a database transaction


def rows_table(name: str, md: sa.MetaData | None = None) -> sa.Table:
    """The loaders' table: no key, so that a record stored twice shows as two rows."""
    return sa.Table(
        name,
        md or sa.MetaData(),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("txn", sa.Text(), nullable=False),
    )


def prepare_database(url: str, table: str) -> None:
    """Create the table and the positions table before the loaders start (on SQLite, loaders
    creating them at once would race)."""
    md = sa.MetaData()
    rows_table(table, md)
    positions_table(md)
    try:
        with engine_for(url).begin() as conn:
            md.create_all(conn, checkfirst=True)
    except sa.exc.SQLAlchemyError as e:
        raise DatabaseError(f"cannot use the database {describe(url)}: {first_line(e)}") from None


class ManagedDatabase:
    """The run's own PostgreSQL server (verify --postgres), for the kill fault."""

    def __init__(self, server: PostgresServer) -> None:
        self.server = server

    def kill(self) -> None:
        self.server.kill()

    def restart(self) -> None:
        try:
            self.server.restart()
        except PostgresError as e:
            raise FaultError(f"PostgreSQL does not restart: {e}") from e


class _RolledBack(Exception):
    """Raised in a store to roll its database transaction back on purpose."""


def run_loader(
    spec: WorkerSpec, workload: WorkloadSpec, stream: OpStream, stop: threading.Event
) -> None:
    rng = random.Random(f"{spec.seed}/{spec.process}")
    classic = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
    loader = DatabaseConsumer(
        {
            **base_config(spec, workload),
            "group.id": workload.copy_group,
            "group.protocol": workload.group_protocol,
            "auto.offset.reset": "earliest",
            **(classic if workload.group_protocol == "classic" else {}),
            "max.poll.interval.ms": 60_000,
        },
        workload.sink_url,
        pipeline=workload.copy_group,
        topics=[workload.copy_input],
    )
    table = rows_table(workload.sink_table)
    number = 0
    pending: dict[str, Any] = {}  # the store in progress: txn, intent, ended

    def store(conn: sa.Connection, messages: list[Message]) -> None:
        nonlocal number
        number += 1
        txn = f"{spec.process}.{number}"
        intent = ABORT if rng.random() < workload.copy_abort_ratio else COMMIT
        reads = [[m.topic(), m.partition(), m.offset(), text(m.value())] for m in messages]
        positions: dict[tuple[str, int], int] = {}
        for m in messages:
            positions[(m.topic(), m.partition())] = m.offset() + 1
        pending.update(txn=txn, intent=intent, ended=False)
        stream.emit(
            INVOKE,
            TXN,
            {
                "txn": txn,
                "intent": intent,
                "writes": [],
                "reads": reads,
                "positions": [[t, p, o] for (t, p), o in positions.items()],
                STORE: True,
            },
        )
        rows = [
            {"topic": t, "partition": p, "offset": o, "value": v, "txn": txn}
            for t, p, o, v in reads
        ]
        conn.execute(table.insert(), rows)
        # What follows is the commit (leaving the caller's `with`): killed after this line,
        # the store may have committed; before it, it certainly did not.
        stream.emit(INFO, TXN_END, {"txn": txn, "end": intent, "delivered": []})
        pending["ended"] = True
        if intent == ABORT:
            raise _RolledBack

    def completed(outcome: str, error: str | None) -> None:
        if pending:
            stream.emit(outcome, TXN, {"txn": pending["txn"], "delivered": [], "error": error})
            pending.clear()

    try:
        while not stop.is_set():
            try:
                loader.poll_batch(store, rng.randint(1, 100), 0.5)
                completed(OK, None)
            except _RolledBack:
                completed(FAIL, "rolled back on purpose")
            except (sa.exc.SQLAlchemyError, DatabaseError) as e:
                # A commit that failed may have happened (a connection lost in COMMIT).
                sure = not pending.get("ended") or pending.get("intent") != COMMIT
                completed(FAIL if sure else UNKNOWN, str(e).splitlines()[0])
                stream.emit(INFO, WORKER, {"event": "database-error", "error": str(e)[:300]})
                time.sleep(0.2)
            except KafkaException as e:  # fatal: a new process, a new consumer
                completed(FAIL, str(e.args[0]))
                raise ClientError(f"consumer failed: {e.args[0]}") from e
    finally:
        loader.close()


def wait_stored(bootstrap: str, workload: WorkloadSpec, timeout_s: float, tag: str) -> bool:
    """Wait until the database's positions are past every committed input record (the
    loaders stored all of it); False at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stored = read_positions(workload.sink_url, workload.copy_group, [workload.copy_input])
        except DatabaseError:
            time.sleep(0.5)
            continue
        starts = {tp: stored.get(tp, -2) for tp in workload.input_partitions()}
        if _nothing_left(bootstrap, workload, starts, tag):
            return True
        time.sleep(1.0)
    return False


def read_database(workload: WorkloadSpec, history: History) -> None:
    """The table's rows and the loaders' positions, as the `database-read` operation."""
    table = rows_table(workload.sink_table)
    history.append(DATABASE_READ, INVOKE, DATABASE_READ, {"isolation": READ_COMMITTED})
    try:
        with engine_for(workload.sink_url).connect() as conn:
            c = table.c
            rows = conn.execute(sa.select(c.topic, c.partition, c.offset, c.value, c.txn)).all()
        positions = read_positions(workload.sink_url, workload.copy_group)
    except (sa.exc.SQLAlchemyError, DatabaseError) as e:
        history.append(DATABASE_READ, FAIL, DATABASE_READ, {"error": str(e)[:500]})
        return
    history.append(
        DATABASE_READ,
        OK,
        DATABASE_READ,
        {
            "topic": workload.copy_input,
            "rows": [[t, int(p), int(o), v, txn] for t, p, o, v, txn in rows],
            "positions": [[t, p, o] for (t, p), o in sorted(positions.items())],
        },
    )
