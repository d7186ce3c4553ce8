"""Running `onceflow verify --embedded` in a subprocess, and what a clean run's report holds:
shared by the verify run tests (plain, compacted, mirror)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from onceflow.cli.main import app


def verify_command() -> list[str]:
    names = {c.name for c in app.registered_commands}
    module = "onceflow.cli.main" if "verify" in names else "tests.verify.verify_app"
    return [sys.executable, "-m", module, "verify"]


def run_verify(
    tmp_path: Path,
    *args: str,
    timeout: float,
    env: dict[str, str] | None = None,
    target: tuple[str, ...] = ("--embedded",),
) -> tuple[dict[str, Any], str]:
    """`onceflow verify TARGET ARGS` (--embedded by default) in a subprocess that must exit 0:
    its JSON report and what it printed."""
    report_path = tmp_path / "report.json"
    done = subprocess.run(
        [
            *verify_command(),
            *target,
            *args,
            "--work-dir",
            str(tmp_path / "run"),
            "--json",
            str(report_path),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(report_path.read_text()), done.stdout


def assert_clean(report: dict[str, Any], kinds: tuple[str, ...]) -> dict[str, Any]:
    """A run with no anomaly, no error, each of `kinds` injected; returns its operations."""
    assert report["valid"] and report["ok"], report
    assert set(report["anomalies"].values()) == {0}
    assert report["anomaly_details"] == {}
    for kind in kinds:
        assert report["faults_injected"].get(kind, 0) >= 1, report["faults_injected"]
    assert report["faults_unavailable"] == {}
    operations: dict[str, Any] = report["operations"]
    assert operations["committed"] >= 100, operations
    assert operations["aborted_on_purpose"] >= 10, operations
    return operations
