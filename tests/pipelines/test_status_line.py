"""A bundled pipeline's status line, from Spark's query progress (no Spark needed here)."""

from __future__ import annotations

import io
import threading
from typing import Any

from onceflow.pipelines.progress import QueryStatus, StatusPrinter, end_offsets, status_line

PROGRESS: dict[str, Any] = {
    "batchId": 7,
    "numInputRows": 1200,
    "inputRowsPerSecond": 2400.4,
    "processedRowsPerSecond": 1999.6,
    "durationMs": {"triggerExecution": 612, "addBatch": 500},
    "sources": [{"endOffset": '{"in":{"0":40,"1":60}}', "startOffset": None}],
}


class Offsets:
    """TopicOffsets' two calls the lag needs."""

    def partitions(self) -> list[tuple[str, int]]:
        return [("in", 0), ("in", 1)]

    def latest(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return {("in", 0): 45, ("in", 1): 60}


def test_the_line_has_rates_the_batch_duration_and_the_lag() -> None:
    line = QueryStatus(Offsets()).line([{"batchId": 6}, PROGRESS])  # type: ignore[arg-type]
    assert line == (
        "batch 7: 1,200 records, 2,400 records/s in, 2,000 processed, batch 612 ms, lag 5"
    )


def test_before_the_first_batch_everything_is_lag() -> None:
    assert QueryStatus(Offsets()).line([]) == "waiting for the first batch, lag 105"  # type: ignore[arg-type]


def test_an_offset_that_is_not_onceflows_gives_no_lag() -> None:
    other = {**PROGRESS, "sources": [{"endOffset": "12"}]}
    assert end_offsets(other) is None
    assert "lag" not in QueryStatus(Offsets()).line([other])  # type: ignore[arg-type]
    assert status_line(PROGRESS, None).endswith("batch 612 ms")


def test_the_printer_prints_while_running_and_once_at_the_end() -> None:
    out = io.StringIO()
    printed = threading.Event()
    count = {"n": 0}

    def line() -> str:
        count["n"] += 1
        if count["n"] >= 2:
            printed.set()
        return f"line {count['n']}"

    with StatusPrinter(line, 0.01, out):
        assert printed.wait(30)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and lines[-1] == f"line {len(lines)}"
    with StatusPrinter(line, 0, out):  # 0: off
        pass
    assert out.getvalue().splitlines() == lines


def test_a_failing_line_does_not_stop_the_printer() -> None:
    out = io.StringIO()

    def broken() -> str:
        raise RuntimeError("no cluster")

    with StatusPrinter(broken, 0.01, out):
        pass
    assert out.getvalue() == "status unavailable: no cluster\n"
