"""The driver killed with SIGKILL mid-batch (with its JVM and workers), then restarted from its
checkpoint: the exactly-once output is exact; the plain sink's has duplicates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.process_group import kill_process_group

from .conftest import ROOT
from .copy_job import check_output
from .driver_job import EXACTLY_ONCE_OUT, PLAIN_OUT
from .kafka_io import create_topic, produce, read_values, wait_mid_batch


def _start(
    bootstrap: str, source: str, checkpoints: Path, mode: str, log: Path
) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.driver_job", bootstrap, source, str(checkpoints), mode],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        # its own process group: the kill takes the JVM and the Python workers down with it
        start_new_session=True,
    )


def _failure(log: str) -> str:
    """The driver's own failure line and the first Java/Python error lines, not a stack's tail."""
    lines = log.splitlines()
    wanted = [
        line
        for line in lines
        if line.startswith("query failed")
        or "Exception" in line
        or "Error" in line
        or line.startswith("Caused by")
    ]
    return "\n".join(dict.fromkeys(wanted))[:6000]


@pytest.mark.slow
def test_driver_sigkill_mid_stream_then_restart(
    bootstrap: str, topic_name: str, tmp_path: Path
) -> None:
    source = topic_name
    eos_out = EXACTLY_ONCE_OUT.format(source=source)
    plain_out = PLAIN_OUT.format(source=source)
    for topic in (source, eos_out, plain_out):
        create_topic(bootstrap, topic, 2)
    values = [f"r{i}-" + "x" * 1000 for i in range(1200)]
    produce(bootstrap, source, values)
    checkpoints = tmp_path / "checkpoints"
    log = tmp_path / "driver.log"

    driver = _start(bootstrap, source, checkpoints, "run", log)
    try:
        wait_mid_batch(checkpoints / "plain", bootstrap, plain_out, 0, 180)
    finally:
        kill_process_group(driver)

    again = _start(bootstrap, source, checkpoints, "finish", log)
    try:
        assert again.wait(240) == 0, _failure(log.read_text())
    finally:
        kill_process_group(again)
    check_output(read_values(bootstrap, eos_out), values, exactly_once=True)
    check_output(read_values(bootstrap, plain_out), values, exactly_once=False)
