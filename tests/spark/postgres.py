"""The PostgreSQL server of the onceflow-sql tests (onceflow.sql.postgres_server), or a skip
naming what is missing (a failure under CI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from onceflow.sql.postgres_server import MissingPostgres, PostgresServer, binaries

__all__ = ["PostgresServer", "require_postgres"]


def require_postgres() -> Path:
    """The server's bin directory, or a skip naming what is missing (a failure under CI)."""
    try:
        return binaries()
    except MissingPostgres as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the PostgreSQL tests, but {e}", pytrace=False)
        pytest.skip(f"PostgreSQL tests skipped: {e}")
