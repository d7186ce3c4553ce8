"""A verify run over time, from its history: committed transactions per second, end-to-end
latency (a transaction's start to a read_committed consumer's poll that returned its value)
per time bin, each fault as an interval with its kind, broker (and mirror) halts and
restarts, and where each anomaly happened. What the HTML report draws (html_report.py)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from onceflow.verify.anomalies import Anomaly
from onceflow.verify.history import (
    FINAL,
    INFO,
    INVOKE,
    NEMESIS,
    OK,
    POLL,
    READ_COMMITTED,
    TXN,
    Op,
    records,
)

MAX_BINS = 240  # time bins across the run: one per second up to 4 minutes, then wider


@dataclass(frozen=True)
class FaultSpan:
    kind: str
    start: float
    end: float
    target: str


@dataclass(frozen=True)
class Event:
    time: float
    process: str  # broker, target-broker, mirror
    event: str  # exited, restarted, restart-failed, gave-up


@dataclass(frozen=True)
class Marked:
    time: float
    kind: str
    message: str


@dataclass
class Timeline:
    bin_s: float
    end: float
    committed_per_s: list[float] = field(default_factory=list)
    latency_p50_ms: list[float | None] = field(default_factory=list)
    latency_p99_ms: list[float | None] = field(default_factory=list)
    faults: list[FaultSpan] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    anomalies: list[Marked] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _bin_width(end: float) -> float:
    return max(1.0, math.ceil(end / MAX_BINS))


def _percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank percentile of a sorted, non-empty list."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def timeline(ops: Iterable[Op], anomalies: Iterable[Anomaly] = ()) -> Timeline:
    """The run over time (ops in the order they were recorded)."""
    ops = list(ops)
    end = max((op.time for op in ops), default=0.0)
    width = _bin_width(end)
    bins = int(end // width) + 1
    line = Timeline(width, end)
    committed = [0] * bins
    latencies: dict[int, list[float]] = defaultdict(list)
    started: dict[str, float] = {}  # txn id -> invoke time
    writer_start: dict[str, float] = {}  # value -> its transaction's start
    first_read: dict[str, float] = {}  # value -> first read_committed poll that returned it
    open_faults: dict[str, Op] = {}
    for op in ops:
        v = op.value
        if op.process == NEMESIS:
            if op.type == INVOKE:
                open_faults[op.f] = op
            elif op.f in open_faults:
                invoked = open_faults.pop(op.f)
                if op.type == OK:  # a fault that failed to inject was never in force
                    target = str(invoked.value.get("target", invoked.value.get("mode", "")))
                    line.faults.append(FaultSpan(op.f, invoked.time, op.time, target))
        elif op.type == INFO and "event" in v and op.f == op.process:
            line.events.append(Event(op.time, op.process, str(v["event"])))
        elif op.f == TXN and op.type == INVOKE:
            started[str(v.get("txn"))] = op.time
            for _, _, value in v.get("writes", []):
                writer_start[str(value)] = op.time
        elif op.f == TXN and op.type == OK:
            committed[int(op.time // width)] += 1
        elif (
            op.f == POLL
            and op.type == OK
            and v.get("isolation", READ_COMMITTED) == READ_COMMITTED
            and not op.process.startswith(FINAL)
        ):
            for *_, value in records(v):
                first_read.setdefault(value, op.time)
                if value in writer_start:
                    latencies[int(op.time // width)].append(op.time - writer_start[value])
    line.committed_per_s = [n / width for n in committed]
    for b in range(bins):
        found = sorted(latencies.get(b, ()))
        line.latency_p50_ms.append(round(_percentile(found, 0.5) * 1000, 1) if found else None)
        line.latency_p99_ms.append(round(_percentile(found, 0.99) * 1000, 1) if found else None)
    txn_end = {str(op.value.get("txn")): op.time for op in ops if op.f == TXN and op.type != INVOKE}
    for anomaly in anomalies:
        line.anomalies.append(
            Marked(
                _when(anomaly, first_read, writer_start, txn_end, end),
                anomaly.kind,
                anomaly.message,
            )
        )
    return line


def _when(
    anomaly: Anomaly,
    first_read: dict[str, float],
    writer_start: dict[str, float],
    txn_end: dict[str, float],
    end: float,
) -> float:
    """Where an anomaly happened: the first read of its value, else its transaction's end,
    else its value's write; failing all, the end of the run (the final reads)."""
    d = anomaly.details
    value = d.get("value")
    if isinstance(value, str) and value in first_read:
        return first_read[value]
    txn = d.get("txn")
    if isinstance(txn, str) and txn in txn_end:
        return txn_end[txn]
    if isinstance(value, str) and value in writer_start:
        return writer_start[value]
    return end
