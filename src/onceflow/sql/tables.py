"""The sink's tables: the target (key columns as its primary key), its staging table, and the
two bookkeeping tables every sink shares (batch marks, Kafka positions).

A `SinkTables` is a plain description (names and type names) so that it pickles cheaply to the
Spark tasks; each process builds the SQLAlchemy `Table` objects from it once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

MARKS_TABLE = "onceflow_sql_marks"
POSITIONS_TABLE = "onceflow_sql_positions"
STAGING_SUFFIX = "__onceflow_staging"
CREATE_LOCK_KEY = 0x6F6E6365  # "once": the advisory lock that serializes table creation

# The staging table's own columns: which query, batch, task (partition) and task attempt
# (`writer`, a token each attempt makes) wrote a row. Only the attempts whose commit messages
# reached the driver are moved into the target.
STAGING_COLUMNS = ("ofq_query", "ofq_batch", "ofq_partition", "ofq_writer")

TYPES: dict[str, sa.types.TypeEngine] = {
    "string": sa.Text(),
    "binary": sa.LargeBinary(),
    "long": sa.BigInteger(),
    "integer": sa.Integer(),
    "short": sa.SmallInteger(),
    "double": sa.Float(precision=53),
    "float": sa.Float(),
    "boolean": sa.Boolean(),
    "timestamp": sa.DateTime(timezone=True),
    "date": sa.Date(),
}


class TableMismatchError(ValueError):
    """The target table exists with columns other than the DataFrame's."""


@dataclass(frozen=True)
class SinkTables:
    """The target table's name and columns (name, Spark type name), and its key columns."""

    table: str
    columns: tuple[tuple[str, str], ...]
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [name for name, _ in self.columns]
        for name, kind in self.columns:
            if kind not in TYPES:
                raise TableMismatchError(
                    f"column {name!r}: Spark type {kind!r} has no SQL mapping here "
                    f"(supported: {', '.join(TYPES)})"
                )
        missing = [k for k in self.keys if k not in names]
        if missing:
            raise TableMismatchError(f"key columns {missing} are not among the columns {names}")
        clash = [n for n in names if n in STAGING_COLUMNS]
        if clash:
            raise TableMismatchError(f"column names {clash} are reserved by the sink")

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.columns]

    @property
    def staging_name(self) -> str:
        return self.table + STAGING_SUFFIX

    @functools.cached_property
    def metadata(self) -> sa.MetaData:
        md = sa.MetaData()
        sa.Table(
            self.table,
            md,
            *(
                sa.Column(
                    name, TYPES[kind], primary_key=name in self.keys, nullable=name not in self.keys
                )
                for name, kind in self.columns
            ),
        )
        sa.Table(
            self.staging_name,
            md,
            sa.Column("ofq_query", sa.Text(), nullable=False),
            sa.Column("ofq_batch", sa.BigInteger(), nullable=False),
            sa.Column("ofq_partition", sa.Integer(), nullable=False),
            sa.Column("ofq_writer", sa.Text(), nullable=False),
            *(sa.Column(name, TYPES[kind]) for name, kind in self.columns),
            sa.Index(f"{self.staging_name}_batch", "ofq_query", "ofq_batch", "ofq_partition"),
        )
        sa.Table(
            MARKS_TABLE,
            md,
            sa.Column("pipeline", sa.Text(), primary_key=True),
            sa.Column("query_id", sa.Text(), primary_key=True),
            sa.Column("batch_id", sa.BigInteger(), nullable=False),
            sa.Column("committed_at", sa.DateTime(timezone=True), nullable=False),
        )
        positions_table(md)
        return md

    @property
    def target(self) -> sa.Table:
        return self.metadata.tables[self.table]

    @property
    def staging(self) -> sa.Table:
        return self.metadata.tables[self.staging_name]

    @property
    def marks(self) -> sa.Table:
        return self.metadata.tables[MARKS_TABLE]

    @property
    def positions(self) -> sa.Table:
        return self.metadata.tables[POSITIONS_TABLE]

    def create(self, engine: Engine) -> None:
        """Create what is missing; check that an existing target has the DataFrame's columns.

        Queries starting together race to create the shared tables: PostgreSQL serializes them
        on an advisory lock; on SQLite the loser of the race tries again."""
        for attempt in range(3):
            try:
                with engine.begin() as conn:
                    if conn.dialect.name == "postgresql":
                        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(CREATE_LOCK_KEY)))
                    self.metadata.create_all(conn, checkfirst=True)
                    self._check_target(conn)
                return
            except sa.exc.OperationalError:
                if attempt == 2:
                    raise

    def __getstate__(self) -> dict:
        # the cached SQLAlchemy objects stay in the process that made them
        return {k: v for k, v in self.__dict__.items() if k != "metadata"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def _check_target(self, conn: Connection) -> None:
        inspector = sa.inspect(conn)
        found = {c["name"]: c for c in inspector.get_columns(self.table)}
        wanted = self.names
        missing = [n for n in wanted if n not in found]
        extra = [n for n, c in found.items() if n not in wanted and not c.get("nullable", True)]
        if missing or extra:
            raise TableMismatchError(
                f"table {self.table!r} has columns {sorted(found)}; the DataFrame writes "
                f"{wanted}"
                + (f" (missing: {missing})" if missing else "")
                + (f" (not null and not written: {extra})" if extra else "")
            )
        if self.keys:
            primary = inspector.get_pk_constraint(self.table).get("constrained_columns") or []
            if sorted(primary) != sorted(self.keys):
                raise TableMismatchError(
                    f"table {self.table!r} has primary key {primary}; upsert keys are "
                    f"{list(self.keys)}"
                )


def positions_table(md: sa.MetaData) -> sa.Table:
    """Per pipeline and topic partition, the next offset to read (Kafka's committed offset)."""
    return sa.Table(
        POSITIONS_TABLE,
        md,
        sa.Column("pipeline", sa.Text(), primary_key=True),
        sa.Column("topic", sa.Text(), primary_key=True),
        sa.Column("partition", sa.Integer(), primary_key=True),
        sa.Column("next_offset", sa.BigInteger(), nullable=False),
    )
