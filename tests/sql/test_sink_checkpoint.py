"""The database sink says when it cannot record the Kafka positions, rather than leaving them
out without a word."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from onceflow.spark.sql_sink import SqlSinkOptions, SqlStreamWriter

SCHEMA = StructType([StructField("word", StringType()), StructField("n", LongType())])


def writer(tmp_path: Path, checkpoint: str) -> SqlStreamWriter:
    options = SqlSinkOptions.parse(
        {
            "url": f"sqlite:///{tmp_path / 'db.sqlite'}",
            "table": "counts",
            "checkpointLocation": checkpoint,
        }
    )
    return SqlStreamWriter(options, SCHEMA)


@pytest.mark.parametrize("checkpoint", ["hdfs:///cp/counts", "s3a://bucket/cp/counts"])
def test_a_checkpoint_not_on_a_local_path_is_said_to_leave_positions_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, checkpoint: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="onceflow.spark.sql_sink"):
        writer(tmp_path, checkpoint)
    assert f"checkpoint {checkpoint} is not a local path: positions not recorded" in caplog.text


def test_a_local_checkpoint_records_positions_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="onceflow.spark.sql_sink"):
        writer(tmp_path, str(tmp_path / "cp"))
        writer(tmp_path, f"file://{tmp_path / 'cp'}")
    assert "positions not recorded" not in caplog.text
