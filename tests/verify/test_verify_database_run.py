"""`onceflow verify --embedded --workload database` for real, with every fault kind: loaders
store the copy input into an SQLite table (rows and positions in one database transaction)
while the broker is killed, paused and filled up, connections cut, and the loaders paused and
SIGKILLed mid-transaction; zero anomalies. Then the table itself is tampered with (a row stored
twice, a row deleted, a row of an aborted transaction added) and read again: the checker
finds each (it is not vacuous on real data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from onceflow.verify.database_check import check_database
from onceflow.verify.database_workload import DATABASE_READ, read_database, rows_table
from onceflow.verify.faults import FAULT_KINDS
from onceflow.verify.history import FAIL, NEMESIS, OK, TXN, History, Op
from onceflow.verify.workload import WorkloadSpec
from tests.spark.postgres import require_postgres
from tests.verify.runs import assert_clean, run_verify


def test_verify_database_with_every_fault_finds_no_anomaly(tmp_path: Path) -> None:
    report, _ = run_verify(
        tmp_path,
        *("--workload", "database", "--duration", "40s", "--faults", "all", "--seed", "11"),
        *("--transaction-timeout-ms", "5000"),
        timeout=300,
    )
    operations = assert_clean(report, FAULT_KINDS)
    assert report["details"]["loaders_drained"], report["details"]
    assert operations["database_rows"] >= 500, operations
    assert operations["database_unstored"] == 0, operations
    assert operations["database_stores_committed"] >= 10, operations
    assert operations["database_stores_rolled_back"] >= 5, operations
    assert operations["database_loader_kills"] >= 1, operations

    ops = [op for op in History.load(Path(report["history"])).ops if op.f != DATABASE_READ]
    database = report["details"]["database"]
    url = f"sqlite:///{tmp_path / 'run' / 'database.sqlite'}"
    table = rows_table(database["table"])
    workload = WorkloadSpec(
        topics={topic_of(ops): 3},
        copy_output="",
        copy_output_partitions=0,
        copy_group=report["details"]["group"],
        sink_url=url,
        sink_table=database["table"],
    )
    assert reread(workload, ops) == []
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        # rows of acknowledged stores: a deleted row of one is a lost write, not a torn store
        acknowledged = [op.value["txn"] for op in ops if op.f == TXN and op.type == OK]
        chosen = sa.select(table).where(table.c.txn.in_(acknowledged)).limit(2)
        first, second = conn.execute(chosen).all()
        conn.execute(table.insert(), [first._asdict()])  # stored twice
        c = table.c
        conn.execute(
            table.delete().where(
                c.topic == second.topic, c.partition == second.partition, c.offset == second.offset
            )
        )
    engine.dispose()
    found = reread(workload, ops)
    duplicate = [a for a in found if a["kind"] == "duplicate"]
    assert [(a["offset"], a["value"]) for a in duplicate] == [(first.offset, first.value)], found
    lost = [a for a in found if a["kind"] == "lost-write"]
    assert lost and all(second.value in str(a) for a in lost), found
    assert {a["kind"] for a in found} == {"duplicate", "lost-write"}, found


def topic_of(ops: list[Op]) -> str:
    """The input topic: what the loaders read."""
    return next(op.value["reads"][0][0] for op in ops if op.f == TXN and op.value.get("reads"))


def reread(workload: WorkloadSpec, ops: list[Op]) -> list[dict[str, Any]]:
    """The table read again after the run's history, and checked."""
    history = History(start=0.0)
    history.ops = list(ops)
    read_database(workload, history)
    anomalies, _ = check_database(history.ops)
    return [a.to_json() for a in anomalies]


def test_an_aborted_row_in_the_table_is_found() -> None:
    """A row of a Kafka transaction that aborted, and a row of a store that rolled back, in
    an otherwise exact table: aborted-read for each (a history made by hand)."""
    ops = [
        Op(0, 0, "producer0#1", "invoke", TXN, {"txn": "p.1", "writes": [["in", 0, "a"]]}),
        Op(1, 0, "producer0#1", "ok", TXN, {"txn": "p.1", "delivered": [["in", 0, 0, "a"]]}),
        Op(2, 0, "producer0#1", "invoke", TXN, {"txn": "p.2", "writes": [["in", 0, "b"]]}),
        Op(3, 0, "producer0#1", FAIL, TXN, {"txn": "p.2", "delivered": [["in", 0, 1, "b"]]}),
        Op(4, 0, "loader0#1", "invoke", TXN, {"txn": "l.1", "writes": [], "reads": []}),
        Op(5, 0, "loader0#1", FAIL, TXN, {"txn": "l.1"}),
        Op(6, 0, "loader0#1", "invoke", TXN, {"txn": "l.2", "writes": [], "reads": []}),
        Op(7, 0, "loader0#1", "ok", TXN, {"txn": "l.2"}),
        Op(8, 0, "final-rc", "ok", "poll", {"isolation": "read_committed", "records": []}),
        Op(9, 0, "final-rc", "ok", "poll", {"records": [["in", 0, 0, "a"]]}),
        Op(
            10,
            0,
            "final-rc",
            "info",
            "final-read",
            {"isolation": "read_committed", "partitions": [["in", 0, 3, 3]]},
        ),
        Op(
            11,
            0,
            DATABASE_READ,
            "ok",
            DATABASE_READ,
            {
                "topic": "in",
                "rows": [["in", 0, 0, "a", "l.1"], ["in", 0, 1, "b", "l.2"]],
                "positions": [["in", 0, 3]],
            },
        ),
    ]
    anomalies, _ = check_database(ops)
    found = sorted((a.kind, a.details.get("txn") or a.details.get("store")) for a in anomalies)
    assert found == [("aborted-read", "l.1"), ("aborted-read", "p.2")], anomalies


def test_verify_database_on_its_own_postgres_killed(tmp_path: Path) -> None:
    """--postgres: the run's PostgreSQL server is SIGKILLed (postmaster and backends) and
    restarted under the loaders (seed 4: the first kill is the server's); 0 anomalies."""
    require_postgres()
    report, _ = run_verify(
        tmp_path,
        *("--workload", "database", "--postgres", "--duration", "20s", "--faults", "kill"),
        *("--seed", "4", "--transaction-timeout-ms", "5000"),
        timeout=240,
    )
    assert report["valid"] and report["ok"], report
    assert report["operations"]["database_rows"] >= 200, report["operations"]
    assert report["operations"]["database_unstored"] == 0, report["operations"]
    kills = [
        op.value["target"]
        for op in History.load(Path(report["history"])).ops
        if op.process == NEMESIS and op.f == "kill" and op.type == OK
    ]
    assert kills[:1] == ["database server"], kills
