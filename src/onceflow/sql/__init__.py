"""Exactly-once into SQL databases: rows, batch marks and Kafka positions in one transaction.

SQLAlchemy Core over psycopg 3 (PostgreSQL) or the standard library's sqlite3 (SQLite, a
file): the URL chooses. Every value travels as a bound parameter; only identifiers (table and
column names, quoted by SQLAlchemy) are part of the statements.
"""

from onceflow.sql.batch_commit import commit_batch, stage_rows
from onceflow.sql.engine import DatabaseError, engine_for
from onceflow.sql.positions import read_positions
from onceflow.sql.tables import SinkTables, TableMismatchError

__all__ = [
    "DatabaseError",
    "SinkTables",
    "TableMismatchError",
    "commit_batch",
    "engine_for",
    "read_positions",
    "stage_rows",
]
