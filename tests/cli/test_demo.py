"""`onceflow demo`, the main job, end to end at a smaller size: the driver and the broker are
SIGKILLed part-way, and the exactly-once counts come out exact while the at-least-once run's
are checked the same way; its output is the progress and the summary, not client logs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SUMMARY = re.compile(r"^exactly-once: expected=(\d+) counted=(\d+) duplicates=0 missing=0$", re.M)
AT_LEAST_ONCE = re.compile(r"^at-least-once: expected=(\d+) counted=(\d+) duplicates=(\d+) ", re.M)


@pytest.mark.slow
# The run has its own 600 s deadline (its output is then in the failure); under a loaded
# machine it takes over 300 s, pytest's default timeout, which would cut it short silently.
@pytest.mark.timeout(660)
def test_demo_counts_exactly_once_through_driver_and_broker_kills(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "onceflow.cli.main",
            "demo",
            "--sentences",
            "6000",
            "--per-trigger",
            "1000",
            "--keep",
            str(tmp_path / "demo"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    exact = SUMMARY.search(done.stdout)
    assert exact is not None, done.stdout
    expected, counted = map(int, exact.groups())
    assert expected == counted > 0
    at_least_once = AT_LEAST_ONCE.search(done.stdout)
    assert at_least_once is not None, done.stdout
    assert int(at_least_once.group(1)) == expected
    assert "SIGKILL" in done.stderr  # the faults happened (progress goes to stderr)
    assert not re.search(r"^%\d\|", done.stderr, re.M), done.stderr  # no librdkafka log lines
