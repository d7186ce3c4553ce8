"""The history of a verify run: every operation the clients and the fault injector performed.

As in Jepsen, an operation is an `invoke` followed by its completion: `ok` (it happened),
`fail` (it certainly did not happen) or `unknown` (it may or may not have happened: a
timeout, a crash). `info` lines are events without an outcome (a transaction's commit being
requested, a worker starting). The history is kept in memory for the checker and written as
JSON lines as it grows, so a run can be checked again later (`History.load`).

Record values are tuples `(topic, partition, offset, value)`; writes not yet placed are
`(topic, partition, value)`. A value names its record uniquely; keyed writes (the compacted
workload) also give each value's key, and a tombstone (a null value) is named by its `id`
header.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from onceflow.json_lines import JsonLineError, json_lines

INVOKE, OK, FAIL, UNKNOWN, INFO = "invoke", "ok", "fail", "unknown", "info"
TYPES = frozenset({INVOKE, OK, FAIL, UNKNOWN, INFO})
COMPLETIONS = frozenset({OK, FAIL, UNKNOWN})

# Operation functions.
TXN = "txn"  # a producer's (or copier's) transaction
TXN_END = "txn-end"  # info: commit_transaction / abort_transaction is about to be called
POLL = "poll"  # one consumer poll with the records it returned
OFFSETS = "offsets"  # a read of a group's committed offsets
FINAL_READ = "final-read"  # info: how far the final reads got, per partition
WORKER = "worker"  # info: a client process started or exited
TOPICS = "topics"  # info: the topics the harness created, with their configs

COMMIT, ABORT = "commit", "abort"
READ_COMMITTED, READ_UNCOMMITTED = "read_committed", "read_uncommitted"
NEMESIS = "nemesis"
FINAL = "final"

TopicPartition = tuple[str, int]
Record = tuple[str, int, int, str]


class HistoryError(ValueError):
    """A history line that cannot be an operation."""


@dataclass(slots=True)
class Op:
    index: int
    time: float  # seconds since the run started
    process: str
    type: str
    f: str
    value: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "time": round(self.time, 6),
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "value": self.value,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Op:
        try:
            op = cls(
                int(data["index"]),
                float(data["time"]),
                str(data["process"]),
                str(data["type"]),
                str(data["f"]),
                dict(data.get("value") or {}),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise HistoryError(f"not an operation: {data!r} ({e})") from None
        if op.type not in TYPES:
            raise HistoryError(f"operation {op.index}: unknown type {op.type!r}")
        return op


class History:
    """Thread-safe, append-only list of operations, optionally mirrored to a JSON-lines file."""

    def __init__(self, sink: Path | None = None, start: float | None = None) -> None:
        self.start = time.monotonic() if start is None else start
        self.ops: list[Op] = []
        self._lock = threading.Lock()
        self._open: dict[tuple[str, str], Op] = {}  # (process, f) -> its pending invoke
        self._last_end: dict[str, Op] = {}  # process -> its latest txn-end
        self._sink: IO[str] | None = sink.open("w", encoding="utf-8") if sink else None

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(list(self.ops))

    def append(
        self,
        process: str,
        type_: str,
        f: str,
        value: dict[str, Any] | None = None,
        *,
        at: float | None = None,
    ) -> Op:
        """Add an operation; `at` is a time.monotonic() stamp (default: now)."""
        if type_ not in TYPES:
            raise HistoryError(f"unknown operation type {type_!r}")
        stamp = time.monotonic() if at is None else at
        with self._lock:
            op = Op(len(self.ops), stamp - self.start, process, type_, f, dict(value or {}))
            self.ops.append(op)
            if type_ == INVOKE:
                self._open[(process, f)] = op
            elif type_ in COMPLETIONS:
                self._open.pop((process, f), None)
            elif f == TXN_END:
                self._last_end[process] = op
            if self._sink is not None:
                self._sink.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")
        return op

    def pending(self, process: str) -> list[Op]:
        """Invocations of `process` still waiting for their completion."""
        with self._lock:
            return [op for (p, _), op in self._open.items() if p == process]

    def txn_phase(self, process: str) -> str | None:
        """Where `process` is in a transaction: None (outside one), "open", or the end it
        requested ("commit" / "abort") and is waiting for."""
        with self._lock:
            invoke = self._open.get((process, TXN))
            if invoke is None:
                return None
            end = self._last_end.get(process)
        if end is not None and end.value.get("txn") == invoke.value.get("txn"):
            return str(end.value.get("end"))
        return "open"

    def crashed(self, process: str, reason: str) -> list[Op]:
        """Complete what a dead process left open: a transaction whose commit was never
        requested certainly did not commit (`fail`); anything else is `unknown`."""
        completed = []
        for invoke in self.pending(process):
            value: dict[str, Any] = {"error": reason}
            outcome = UNKNOWN
            if invoke.f == TXN:
                txn = invoke.value.get("txn")
                with self._lock:
                    end = self._last_end.get(process)
                if end is None or end.value.get("txn") != txn:
                    end = None
                if end is None or end.value.get("end") != COMMIT:
                    outcome = FAIL
                value["txn"] = txn
                value["delivered"] = list(end.value.get("delivered", [])) if end else []
            completed.append(self.append(process, outcome, invoke.f, value))
        return completed

    def close(self) -> None:
        with self._lock:
            if self._sink is not None:
                self._sink.close()
                self._sink = None

    @classmethod
    def load(cls, path: Path) -> History:
        """Read a history written by a run (a torn last line, from a crash, is an error)."""
        history = cls(start=0.0)
        with path.open(encoding="utf-8") as lines:
            history.ops = list(parse_lines(lines))
        for i, op in enumerate(history.ops):
            if op.index != i:
                raise HistoryError(f"operation {i} has index {op.index}")
        return history


def parse_lines(lines: Iterable[str]) -> Iterator[Op]:
    try:
        for _, data in json_lines(lines):
            yield Op.from_json(data)
    except JsonLineError as e:
        raise HistoryError(str(e)) from None


def records(value: dict[str, Any], key: str = "records") -> list[Record]:
    """The (topic, partition, offset, value) records an operation carries under `key`."""
    return [(str(t), int(p), int(o), str(v)) for t, p, o, v in value.get(key, [])]
