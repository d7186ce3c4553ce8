"""onceflow-sql batch writes, and bad input: a database that does not answer, a table whose
columns do not match. Each is one clear error, and nothing of a failed write is visible."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import sqlalchemy as sa
from pyspark.sql import SparkSession

from onceflow.spark.sql_sink import FAULT_DIR_ENV, register


def _count(url: str, table: str) -> int:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
    finally:
        engine.dispose()


def test_batch_write_is_whole_through_a_task_failure(spark: SparkSession, sql_url: str) -> None:
    register(spark)
    (Path(os.environ[FAULT_DIR_ENV]) / "fail-task-numbers").touch()
    df = spark.range(0, 1000, numPartitions=4).selectExpr("id", "cast(id * 2 as string) AS doubled")
    df.write.format("onceflow-sql").option("url", sql_url).option("table", "numbers").option(
        "keys", "id"
    ).mode("append").save()
    assert (Path(os.environ[FAULT_DIR_ENV]) / "fail-task-numbers.fired").exists()
    assert _count(sql_url, "numbers") == 1000
    assert _count(sql_url, "numbers__onceflow_staging") == 0


def test_unreachable_database_is_one_clear_error(spark: SparkSession) -> None:
    register(spark)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    url = f"postgresql://nobody:secret@127.0.0.1:{port}/nowhere"
    with pytest.raises(Exception, match=r"cannot connect to postgresql\+psycopg://nobody:\*\*\*@"):
        spark.range(3).write.format("onceflow-sql").option("url", url).option("table", "t").mode(
            "append"
        ).save()


def test_table_with_other_columns_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    register(spark)
    url = f"sqlite:///{tmp_path / 'other.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE words (word TEXT PRIMARY KEY, total INTEGER)"))
    engine.dispose()
    df = spark.createDataFrame([("a", 1)], "word string, count long")
    with pytest.raises(Exception, match=r"table 'words' has columns .* \(missing: \['count'\]\)"):
        df.write.format("onceflow-sql").option("url", url).option("table", "words").option(
            "mode", "upsert"
        ).option("keys", "word").mode("append").save()
    assert _count(url, "words") == 0
