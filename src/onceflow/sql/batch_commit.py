"""The two steps of a micro-batch: tasks stage their rows where no reader looks, and one
database transaction on the driver claims the batch's mark, moves the staged rows into the
target, and records the Kafka positions the batch read up to.

Claiming the mark first (an upsert that only raises the batch id) takes the mark row's lock
(PostgreSQL) or the write lock (SQLite) before anything else: two drivers committing the same
batch (a zombie and its replacement) serialize there, and the second finds the batch done.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from onceflow.sql.engine import DatabaseError, describe, engine_for, first_line
from onceflow.sql.positions import Positions, dialect_insert, write_positions
from onceflow.sql.tables import SinkTables

# Rows per INSERT statement of a task's staging write.
STAGE_CHUNK = 2_000


def stage_rows(
    url: str,
    tables: SinkTables,
    query_id: str,
    batch_id: int,
    partition: int,
    writer: str,
    chunks: Iterable[Sequence[Mapping[str, Any]]],
) -> int:
    """One task's rows into the staging table, replacing any earlier attempt's; one
    transaction, so a task that dies leaves nothing half-staged."""
    staging = tables.staging
    c = staging.c
    key = {"ofq_query": query_id, "ofq_batch": batch_id, "ofq_partition": partition}
    written = 0
    try:
        with engine_for(url).begin() as conn:
            conn.execute(
                staging.delete().where(
                    c.ofq_query == query_id, c.ofq_batch == batch_id, c.ofq_partition == partition
                )
            )
            for chunk in chunks:
                if chunk:
                    conn.execute(
                        staging.insert(), [{**row, **key, "ofq_writer": writer} for row in chunk]
                    )
                    written += len(chunk)
    except sa.exc.SQLAlchemyError as exc:
        raise DatabaseError(
            f"staging batch {batch_id} partition {partition} into {describe(url)}: "
            f"{first_line(exc)}"
        ) from None
    return written


def commit_batch(
    url: str,
    tables: SinkTables,
    *,
    pipeline: str,
    query_id: str,
    batch_id: int,
    writers: Sequence[str],
    positions: Positions,
    accumulate: Sequence[str] = (),
    upsert: bool = False,
) -> int | None:
    """Make a batch visible: rows moved, mark raised, positions written, staging cleared, in
    one transaction. Returns the rows moved, or None for a batch already committed (a replay:
    its staged rows are dropped and nothing else changes)."""
    try:
        with engine_for(url).begin() as conn:
            if not _claim(conn, tables, pipeline, query_id, batch_id):
                _clear(conn, tables, query_id, batch_id)
                return None
            moved = _move(conn, tables, query_id, batch_id, writers, accumulate, upsert)
            write_positions(conn, pipeline, positions)
            _clear(conn, tables, query_id, batch_id)
            return moved
    except sa.exc.SQLAlchemyError as exc:
        raise DatabaseError(
            f"committing batch {batch_id} of {pipeline!r} into {describe(url)}: "
            f"{first_line(exc)} (nothing of this batch is visible)"
        ) from None


def last_batch(url: str, pipeline: str, query_id: str, tables: SinkTables) -> int | None:
    """The last batch `query_id` committed into `pipeline`'s table, if any."""
    marks = tables.marks
    with engine_for(url).connect() as conn:
        return conn.execute(
            sa.select(marks.c.batch_id).where(
                marks.c.pipeline == pipeline, marks.c.query_id == query_id
            )
        ).scalar()


def _claim(
    conn: sa.Connection, tables: SinkTables, pipeline: str, query_id: str, batch_id: int
) -> bool:
    marks = tables.marks
    insert = dialect_insert(conn)(marks).values(
        pipeline=pipeline, query_id=query_id, batch_id=batch_id, committed_at=datetime.now(UTC)
    )
    claim = insert.on_conflict_do_update(
        index_elements=["pipeline", "query_id"],
        set_={"batch_id": insert.excluded.batch_id, "committed_at": insert.excluded.committed_at},
        where=marks.c.batch_id < insert.excluded.batch_id,
    ).returning(marks.c.batch_id)
    return conn.execute(claim).first() is not None


def _move(
    conn: sa.Connection,
    tables: SinkTables,
    query_id: str,
    batch_id: int,
    writers: Sequence[str],
    accumulate: Sequence[str],
    upsert: bool,
) -> int:
    staging, target = tables.staging, tables.target
    names = tables.names
    where = (
        staging.c.ofq_query == query_id,
        staging.c.ofq_batch == batch_id,
        staging.c.ofq_writer.in_(list(writers)),
    )
    if not writers:
        return 0
    if not upsert:
        source = sa.select(*(staging.c[n] for n in names)).where(*where)
        return conn.execute(target.insert().from_select(names, source)).rowcount
    if accumulate:
        # one row per key: the batch's sums added to what the table holds
        source = (
            sa.select(
                *(
                    sa.func.sum(staging.c[n]).label(n)
                    if n in accumulate
                    else staging.c[n]
                    if n in tables.keys
                    else sa.func.max(staging.c[n]).label(n)
                    for n in names
                )
            )
            .where(*where)
            .group_by(*(staging.c[k] for k in tables.keys))
        )
    else:
        source = sa.select(*(staging.c[n] for n in names)).where(*where)
    insert = dialect_insert(conn)(target).from_select(names, source)
    update = {
        n: (target.c[n] + insert.excluded[n]) if n in accumulate else insert.excluded[n]
        for n in names
        if n not in tables.keys
    }
    if not update:
        statement = insert.on_conflict_do_nothing(index_elements=list(tables.keys))
    else:
        statement = insert.on_conflict_do_update(index_elements=list(tables.keys), set_=update)
    return conn.execute(statement).rowcount


def _clear(conn: sa.Connection, tables: SinkTables, query_id: str, batch_id: int) -> None:
    staging = tables.staging
    conn.execute(
        staging.delete().where(staging.c.ofq_query == query_id, staging.c.ofq_batch <= batch_id)
    )


__all__ = ["DatabaseError", "commit_batch", "last_batch", "stage_rows"]
