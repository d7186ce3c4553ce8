"""A database URL to a SQLAlchemy engine: PostgreSQL through psycopg 3, SQLite as a file.

Engines are cached per URL and process: Spark's Python workers are reused across tasks, so a
task does not pay a new connection pool each time.
"""

from __future__ import annotations

import threading

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

_engines: dict[str, Engine] = {}
_lock = threading.Lock()

# A writer waits this long for SQLite's single write lock (tasks and the commit share a file).
SQLITE_BUSY_TIMEOUT_S = 60.0


class DatabaseError(RuntimeError):
    """The database could not be reached, or refused what the sink asked: one clear line."""


def normalize_url(url: str) -> str:
    """`postgresql://` (and `postgres://`) mean psycopg 3, not SQLAlchemy's psycopg2 default."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain) :]
    return url


def _sqlite_pragmas(dbapi_connection: object, _record: object) -> None:
    # WAL: readers of the table never wait on, nor see, a batch being committed
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()


def _make(url: str) -> Engine:
    parsed = sa.make_url(normalize_url(url))
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise DatabaseError(f"{url!r}: SQLite must be a file, shared by the Spark tasks")
        engine = sa.create_engine(
            parsed,
            poolclass=NullPool,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S},
        )
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if backend == "postgresql":
        return sa.create_engine(
            parsed,
            pool_pre_ping=True,  # a restarted server: drop the dead connections, not the task
            connect_args={"connect_timeout": 10},
        )
    raise DatabaseError(f"{url!r}: onceflow-sql supports postgresql:// and sqlite:/// URLs")


def engine_for(url: str) -> Engine:
    """The engine of `url`, made once per process."""
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            try:
                engine = _engines[url] = _make(url)
            except sa.exc.ArgumentError as exc:
                raise DatabaseError(f"{url!r} is not a database URL: {exc}") from None
        return engine


def describe(url: str) -> str:
    """The URL with its password hidden, for messages."""
    try:
        return sa.make_url(normalize_url(url)).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<malformed URL>"


def check_connects(url: str) -> None:
    """Connect once, so a wrong URL fails the query before any task runs."""
    try:
        with engine_for(url).connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError as exc:
        raise DatabaseError(f"cannot connect to {describe(url)}: {first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    """The driver's own message, without SQLAlchemy's background links."""
    original = getattr(exc, "orig", None) or exc
    text = str(original).strip().splitlines()
    return text[0] if text else type(original).__name__
