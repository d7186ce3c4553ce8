"""Kafka positions kept in the database: read them to start a pipeline (or a consumer) where
the rows already in the database end."""

from __future__ import annotations

import json
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from onceflow.sql.engine import DatabaseError, describe, engine_for, first_line
from onceflow.sql.tables import positions_table

Positions = dict[tuple[str, int], int]  # (topic, partition) -> next offset to read


def read_positions(url: str, pipeline: str, topics: Iterable[str] | None = None) -> Positions:
    """The positions `pipeline` recorded (empty when it never committed, or no table yet)."""
    table = positions_table(sa.MetaData())
    try:
        with engine_for(url).connect() as conn:
            if not sa.inspect(conn).has_table(table.name):
                return {}
            rows = conn.execute(
                sa.select(table.c.topic, table.c.partition, table.c.next_offset).where(
                    table.c.pipeline == pipeline
                )
            ).all()
    except sa.exc.SQLAlchemyError as exc:
        raise DatabaseError(
            f"cannot read positions from {describe(url)}: {first_line(exc)}"
        ) from None
    wanted = None if topics is None else set(topics)
    return {
        (topic, int(partition)): int(offset)
        for topic, partition, offset in rows
        if wanted is None or topic in wanted
    }


def write_positions(conn: Connection, pipeline: str, positions: Positions) -> None:
    """Upsert `positions` inside the caller's transaction."""
    if not positions:
        return
    table = positions_table(sa.MetaData())
    rows = [
        {"pipeline": pipeline, "topic": t, "partition": p, "next_offset": o}
        for (t, p), o in sorted(positions.items())
    ]
    conn.execute(upsert(conn, table, ("pipeline", "topic", "partition"), ["next_offset"]), rows)


def upsert(conn: Connection, table: sa.Table, keys: Iterable[str], update: Iterable[str]):
    """INSERT ... ON CONFLICT (keys) DO UPDATE, in the connection's dialect."""
    insert = dialect_insert(conn)(table)
    return insert.on_conflict_do_update(
        index_elements=list(keys), set_={c: insert.excluded[c] for c in update}
    )


def dialect_insert(conn: Connection):
    name = conn.dialect.name
    if name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        raise DatabaseError(f"no upsert for the {name} dialect")
    return insert


def to_spark_starting_offsets(positions: Positions, partitions: Iterable[tuple[str, int]]) -> str:
    """Spark's startingOffsets JSON: the database's positions, -2 (earliest) for partitions it
    has none for (new ones, or ones no batch has read yet)."""
    spec: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(partitions):
        spec.setdefault(topic, {})[str(partition)] = positions.get((topic, partition), -2)
    return json.dumps(spec)
