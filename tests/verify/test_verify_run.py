"""`onceflow verify --embedded` for real, with every fault kind, for a bounded time: zero
anomalies, every fault injected, real progress; and the same history, tampered with, is
flagged (the checker is not vacuous on real data)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from onceflow.verify.checker import check
from onceflow.verify.faults import FAULT_KINDS
from onceflow.verify.history import FAIL, OK, TXN, History, Op
from onceflow.verify.html_report import FAULT_ID
from tests.verify.runs import assert_clean, run_verify

DURATION = "50s"


def test_verify_embedded_with_every_fault_finds_no_anomaly(tmp_path: Path) -> None:
    report, stdout = run_verify(
        tmp_path,
        *("--duration", DURATION, "--faults", "all", "--seed", "11"),
        *("--transaction-timeout-ms", "5000", "--report", str(tmp_path / "report")),
        timeout=240,
    )
    # each kind injected (the disk simulated where it cannot mount)
    operations = assert_clean(report, FAULT_KINDS)
    assert operations["copy_transactions"] >= 10, operations
    assert operations["polls_records"] >= 1000, operations
    assert report["details"]["copiers_drained"]  # so committed input = committed output
    assert report["details"]["copy_group_type"] == "classic"  # the default protocol
    summary = json.loads(stdout.strip().splitlines()[-1])  # the one-line JSON summary
    assert summary["anomalies"] == report["anomalies"]
    assert report["check_s"] >= 0
    # the HTML report: one shaded interval per injected fault, halts and restarts marked
    page = (tmp_path / "report" / "index.html").read_text()
    injected = sum(report["faults_injected"].values())
    assert len(re.findall(rf'<g id="{FAULT_ID}\d+"', page)) == injected, report["faults_injected"]
    line = json.loads((tmp_path / "report" / "timeline.json").read_text())
    assert len(line["faults"]) == injected
    exits = report["details"].get("broker_exits", 0)
    assert sum(e["event"] == "exited" for e in line["events"]) == exits

    history = History.load(Path(report["history"]))
    assert check(history.ops).valid  # the file says what the run said
    tampered_outcome(history.ops)
    tampered_final_read(history.ops)


def test_verify_simulates_the_full_disk_where_it_cannot_mount_one(tmp_path: Path) -> None:
    """Without `mount` (as without root) the disk fault is simulated in the broker's log layer:
    still injected, the broker halts and restarts, and nothing is lost or seen twice."""
    report, _ = run_verify(
        tmp_path,
        *("--duration", "30s", "--faults", "disk", "--seed", "3"),
        timeout=180,
        env={**os.environ, "PATH": str(Path(sys.executable).parent)},  # no `mount` on it
    )
    assert report["details"]["disk"].startswith("simulated in the log layer"), report["details"]
    assert report["faults_injected"].get("disk", 0) >= 1, report["faults_injected"]
    assert report["details"]["broker_exits"] >= 1  # it halted on the full disk
    assert report["valid"] and set(report["anomalies"].values()) == {0}, report["anomalies"]
    # something to check on both sides of the fault; how much fits in 30 s is the machine's
    assert report["operations"]["committed"] >= 10, report["operations"]


def visible_committed_txn(ops: list[Op]) -> str:
    """A committed transaction whose values the final read_committed pass returned."""
    final = {
        r[3]
        for op in ops
        if op.process == "final-rc" and op.type == OK
        for r in op.value.get("records", [])
    }
    for op in ops:
        delivered = op.value.get("delivered") if op.f == TXN and op.type == OK else None
        if delivered and all(d[3] in final for d in delivered):
            return str(op.value["txn"])
    raise AssertionError("no committed transaction visible in the final read")


def tampered_outcome(ops: list[Op]) -> None:
    """Say a committed transaction failed: every read of it becomes an aborted read."""
    txn = visible_committed_txn(ops)
    forged = [
        Op(o.index, o.time, o.process, FAIL, o.f, o.value)
        if o.f == TXN and o.type == OK and o.value.get("txn") == txn
        else o
        for o in ops
    ]
    result = check(forged)
    assert "aborted-read" in {a.kind for a in result.anomalies}
    assert any(a.details.get("txn") == txn for a in result.anomalies if a.kind == "aborted-read")


def tampered_final_read(ops: list[Op]) -> None:
    """Drop a committed value from the final read_committed pass: a lost write."""
    txn = visible_committed_txn(ops)
    victim = next(
        d[3]
        for o in ops
        if o.f == TXN and o.type == OK and o.value.get("txn") == txn
        for d in o.value["delivered"]
    )
    forged = []
    for o in ops:
        if o.process == "final-rc" and o.type == OK:
            kept = [r for r in o.value["records"] if r[3] != victim]
            o = Op(o.index, o.time, o.process, o.type, o.f, {**o.value, "records": kept})
        forged.append(o)
    lost = [a for a in check(forged).anomalies if a.kind == "lost-write"]
    assert any(a.details.get("txn") == txn for a in lost), [a.to_json() for a in lost]
