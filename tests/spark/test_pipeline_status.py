"""`onceflow run copy --until-caught-up` prints its status line while it runs: records/s,
the batch's duration and the lag from Spark's query progress, lag 0 at the end."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import onceflow.pipelines.session as pipeline_session
from onceflow.pipelines import copy_topic
from onceflow.pipelines.topic_reader import read_topic
from tests.spark.kafka_io import create_topic, produce

LINE = re.compile(
    r"^batch \d+: [\d,]+ records, [\d,]+ records/s in, [\d,]+ processed, batch [\d,]+ ms, "
    r"lag ([\d,]+)$"
)


def test_copy_prints_status_lines_down_to_lag_zero(
    spark: SparkSession,
    bootstrap: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    suffix = uuid.uuid4().hex[:8]
    source, target = f"in-{suffix}", f"out-{suffix}"
    create_topic(bootstrap, source)
    create_topic(bootstrap, target)
    produce(bootstrap, source, [f"v{i}" for i in range(120)])
    monkeypatch.setattr(pipeline_session, "session", lambda *_: spark)  # the shared one
    copy_topic.main(
        [
            *("--bootstrap-server", bootstrap, "--input", source, "--output", target),
            *("--checkpoint", str(tmp_path / "cp"), "--max-offsets-per-trigger", "40"),
            *("--until-caught-up", "--progress-interval", "0.2"),
        ]
    )
    assert len(read_topic(bootstrap, target)) == 120
    lines = [line for line in capsys.readouterr().err.splitlines() if LINE.match(line)]
    assert lines, "no status line"
    assert LINE.match(lines[-1]).group(1) == "0"  # type: ignore[union-attr]
