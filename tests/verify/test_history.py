"""The history as JSON lines: what a run writes is what the checker reads back."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.verify.history import FAIL, INVOKE, OK, TXN, History, HistoryError


def test_history_round_trips_through_its_file(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history = History(path, start=100.0)
    history.append("p#1", INVOKE, TXN, {"txn": "t1", "writes": [["a", 0, "v"]]}, at=100.5)
    history.append("p#1", OK, TXN, {"txn": "t1", "delivered": [["a", 0, 7, "v"]]}, at=101.0)
    history.append("p#2", INVOKE, TXN, {"txn": "t2", "writes": []}, at=101.5)
    history.crashed("p#2", "SIGKILL")
    history.close()
    loaded = History.load(path)
    assert [op.to_json() for op in loaded.ops] == [op.to_json() for op in history.ops]
    assert [(op.index, op.time) for op in loaded.ops][:2] == [(0, 0.5), (1, 1.0)]
    assert loaded.ops[-1].type == FAIL and loaded.ops[-1].value["error"] == "SIGKILL"


def test_a_damaged_history_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text('{"index": 0, "time": 0, "process": "p", "type": "ok", "f": "txn"}\n{"ind')
    with pytest.raises(HistoryError, match="line 2"):
        History.load(path)
    path.write_text('{"index": 0, "time": 0, "process": "p", "type": "maybe", "f": "txn"}\n')
    with pytest.raises(HistoryError, match="unknown type"):
        History.load(path)
