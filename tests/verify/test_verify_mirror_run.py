"""`onceflow verify --embedded --mirror` for real: the workload on a source broker mirrored by
the mirror pipeline (PySpark, a child process) to a target broker, with either broker and the
mirror's driver SIGKILLed; the target, read read_committed, holds every committed source
record once, in order, and nothing aborted; and that target read, tampered with, is flagged
(the target view is not vacuous on real data)."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest

from onceflow.verify.history import OK, POLL, History, Op
from onceflow.verify.mirror_check import MIRROR_READ, check_mirror
from onceflow.verify.mirror_run import target_topic
from tests.verify.runs import assert_clean, run_verify, verify_command

FAULTS = ("kill", "kill-mirror")


@pytest.mark.slow
def test_verify_mirror_with_broker_and_driver_kills_finds_no_anomaly(tmp_path: Path) -> None:
    report, _ = run_verify(
        tmp_path,
        *("--mirror", "--duration", "50s", "--faults", ",".join(FAULTS), "--seed", "5"),
        *("--producers", "2", "--copiers", "1", "--transaction-timeout-ms", "5000"),
        timeout=600,
    )
    operations = assert_clean(report, FAULTS)
    assert report["mirror_caught_up"], report["details"]
    assert report["mirror_values"] == operations["values_committed"], report
    assert "target_kills" in report  # kill picks the source or the target at random

    ops = History.load(Path(report["history"])).ops
    assert check_mirror(ops, target_topic) == []
    kinds = {a.kind for a in check_mirror(_tampered(ops), target_topic)}
    assert kinds == {"duplicate", "lost-write"}, kinds


@pytest.mark.slow
def test_verify_reports_a_mirror_driver_that_cannot_start(tmp_path: Path) -> None:
    """A checkpoint path that is a file (a careless admin's): the driver fails the same way at
    every start. The run ends with that error, after five starts, instead of restarting the
    driver until the run's deadline and then waiting out the catch-up's five minutes."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "mirror-checkpoint").write_text("not a directory")
    report_path = tmp_path / "report.json"
    done = subprocess.run(
        [
            *verify_command(),
            *("--embedded", "--mirror", "--duration", "120s", "--faults", "kill"),
            *("--producers", "1", "--copiers", "0", "--seed", "3"),
            *("--work-dir", str(tmp_path / "run"), "--json", str(report_path)),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 1, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = json.loads(report_path.read_text())
    assert not report["ok"]
    [error] = [e for e in report["errors"] if "mirror" in e]
    assert error.startswith("the mirror exited 5 times in a row, each within 60 s"), error
    assert "Destination exists and is not a directory" in error, error  # the driver's own
    assert "mirror_caught_up" not in report  # no wait for a driver that will not come back


def _tampered(ops: list[Op]) -> list[Op]:
    """The target read with a record's value overwritten by the next one's in its partition:
    the first value lost, the second held twice."""
    forged, done = [], False
    for op in ops:
        if not done and op.process == MIRROR_READ and op.f == POLL and op.type == OK:
            records = [list(r) for r in op.value["records"]]
            for first, second in itertools.pairwise(records):
                if first[:2] == second[:2]:  # same topic and partition
                    first[3], done = second[3], True
                    break
            op = Op(op.index, op.time, op.process, op.type, op.f, {**op.value, "records": records})
        forged.append(op)
    assert done, "no target read with two records of one partition"
    return forged


def test_mirror_needs_embedded() -> None:
    done = subprocess.run(
        [*verify_command(), "--mirror", "--bootstrap-server", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    assert "--mirror needs --embedded" in done.stderr
