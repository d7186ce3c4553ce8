"""`onceflow verify --report DIR` on a generated history: the page is written, self-contained,
with one shaded interval per injected fault, the halts and restarts, the anomalies where they
happened, the checker's table and the command that reproduces the run."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from onceflow.verify.checker import check
from onceflow.verify.harness import VerifyOptions, VerifyRun
from onceflow.verify.history import FAIL, INFO, INVOKE, NEMESIS, OK, Op
from onceflow.verify.html_report import FAULT_ID, reproduce_command, write_report
from onceflow.verify.timeline import timeline
from tests.verify.synthetic import Shape, generate

FAULTS = [("kill", 1.0, 2.5, OK), ("pause", 3.0, 4.0, OK), ("partition", 5.0, 5.2, FAIL)]
INJECTED = 2  # the partition failed to inject: it was never in force


def history(anomalies: int = 0) -> list[Op]:
    """A generated history spread over 8 s, with faults and a broker halt and restart."""
    ops = generate(Shape(committed=300, aborted=80, readers=2, anomalies=anomalies), seed=5)
    step = 8.0 / len(ops)
    timed = [Op(op.index, op.index * step, op.process, op.type, op.f, op.value) for op in ops]
    extra = []
    for kind, start, end, outcome in FAULTS:
        extra.append((start, NEMESIS, INVOKE, kind, {"target": "broker"}))
        extra.append((end, NEMESIS, outcome, kind, {"target": "broker"}))
    extra.append((1.1, "broker", INFO, "broker", {"event": "exited", "code": -9}))
    extra.append((2.4, "broker", INFO, "broker", {"event": "restarted"}))
    merged = sorted(
        [(op.time, op.index, op) for op in timed]
        + [(at, -1, Op(0, at, p, t, f, v)) for at, p, t, f, v in extra],
        key=lambda x: (x[0], x[1]),
    )
    return [Op(i, at, op.process, op.type, op.f, op.value) for i, (at, _, op) in enumerate(merged)]


def verify_run(ops: list[Op], tmp_path: Path) -> VerifyRun:
    options = VerifyOptions(duration_s=8, faults=("kill", "pause", "partition"), seed=42)
    result = check(ops)
    return VerifyRun(
        options,
        result,
        tmp_path,
        tmp_path / "history.jsonl",
        9.0,
        {"kill": 1, "pause": 1},
        {},
        details={"broker_exits": 1, "check_s": 0.1, "run_s": 8.5},
        history=ops,
    )


def test_the_report_holds_one_shaded_interval_per_injected_fault(tmp_path: Path) -> None:
    run = verify_run(history(), tmp_path)
    assert run.result.valid
    page = write_report(run, tmp_path / "report")
    text = page.read_text()
    assert page.name == "index.html" and text.startswith("<!doctype html>")
    assert len(re.findall(rf'<g id="{FAULT_ID}\d+"', text)) == INJECTED
    assert "<img" not in text and "href=" not in text.replace('xlink:href="#', "")  # inline
    line = json.loads((tmp_path / "report" / "timeline.json").read_text())
    assert [(f["kind"], f["start"], f["end"]) for f in line["faults"]] == [
        (kind, start, end) for kind, start, end, outcome in FAULTS if outcome == OK
    ]
    assert [e["event"] for e in line["events"]] == ["exited", "restarted"]
    assert sum(line["committed_per_s"]) * line["bin_s"] == run.result.stats["committed"]
    assert any(p is not None for p in line["latency_p99_ms"])
    assert "no anomalies" in text and "onceflow verify --embedded" in text
    assert "poll-skip" in text  # the checker's table, every kind with its count


def test_anomalies_are_marked_where_they_happened(tmp_path: Path) -> None:
    ops = history(anomalies=6)
    run = verify_run(ops, tmp_path)
    assert not run.result.valid
    line = timeline(ops, run.result.anomalies)
    assert len(line.anomalies) == len(run.result.anomalies)
    assert any(0 < a.time < line.end for a in line.anomalies), line.anomalies
    text = write_report(run, tmp_path / "report").read_text()
    assert f"{len(run.result.anomalies)} anomalies" in text
    assert f"anomalies ({len(run.result.anomalies)})" in text  # the crosses' legend


def test_the_reproducing_command_parses_back_to_the_same_options() -> None:
    options = VerifyOptions(duration_s=90, faults=("kill", "pause"), seed=7, producers=4, copiers=1)
    run = VerifyRun(options, check([]), Path("."), Path("h"), 0.0, {}, {})
    args = shlex.split(reproduce_command(run))
    assert args[:3] == ["onceflow", "verify", "--embedded"]
    pairs = dict(zip(args[3::2], args[4::2], strict=False))
    assert pairs["--duration"] == "90s" and pairs["--faults"] == "kill,pause"
    assert pairs["--seed"] == "7" and pairs["--producers"] == "4" and pairs["--copiers"] == "1"
