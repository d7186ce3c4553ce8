"""A verify history indexed for the checks: every transaction with its writes, reads,
offsets and outcome, who wrote each value and where, every consumer's polls, the group
offsets seen, the final passes, and the keys of the compacted topics' values."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from onceflow.verify.history import (
    COMMIT,
    FAIL,
    FINAL_READ,
    INVOKE,
    NEMESIS,
    OFFSETS,
    OK,
    POLL,
    READ_COMMITTED,
    TOPICS,
    TXN,
    TXN_END,
    Op,
    Record,
    TopicPartition,
    records,
)


class CheckerError(ValueError):
    """The history itself is inconsistent (a workload or harness bug, not a broker bug)."""


@dataclass
class Txn:
    id: str
    process: str
    intent: str
    writes: list[tuple[str, int, str]]
    reads: list[Record] = field(default_factory=list)
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    outcome: str | None = None  # None: never completed (as unknown)
    end: str | None = None  # commit or abort, once requested
    error: str | None = None
    delivered: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    keys: dict[str, tuple[str, bool]] = field(default_factory=dict)  # value -> key, tombstone

    @property
    def committed(self) -> bool:
        return self.outcome == OK

    @property
    def aborted(self) -> bool:
        return self.outcome == FAIL

    @property
    def uncertain(self) -> bool:
        return self.outcome not in (OK, FAIL)


@dataclass
class Session:
    """The polls of one consumer process (or one final pass), in order."""

    process: str
    isolation: str
    records: list[Record] = field(default_factory=list)


@dataclass
class FinalPass:
    isolation: str
    process: str | None = None  # the session that made this pass
    complete: dict[TopicPartition, bool] = field(default_factory=dict)
    ends: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)  # position, HW
    at: dict[TopicPartition, dict[int, str]] = field(default_factory=dict)  # offset -> value


class IndexedHistory:
    """Everything the history says, indexed for the checks."""

    def __init__(self, ops: Iterable[Op], final_process_prefix: str = "final") -> None:
        self.txns: dict[str, Txn] = {}
        self.writer: dict[str, Txn] = {}  # value -> transaction that wrote it
        self.written_to: dict[str, TopicPartition] = {}
        self.sessions: dict[str, Session] = {}
        self.offset_reads: list[tuple[Op, dict[TopicPartition, int]]] = []
        self.finals: dict[str, FinalPass] = {}
        self.final_offsets: dict[TopicPartition, int] | None = None
        self.faults: Counter[str] = Counter()
        self.compacted: set[str] = set()  # topics the cleaner compacts
        self.keys: dict[str, tuple[str, bool]] = {}  # value -> (key, is a tombstone)
        self.by_key: dict[tuple[str, int, str], list[str]] = defaultdict(list)  # values
        self.ops = 0
        for op in ops:
            self.ops += 1
            self._add(op, final_process_prefix)

    def _add(self, op: Op, final_prefix: str) -> None:
        v = op.value
        if op.process == NEMESIS:
            if op.type == INVOKE:
                self.faults[op.f] += 1
            return
        if op.f == TXN:
            if op.type == INVOKE:
                self._invoke(op)
            else:
                txn = self.txns.get(str(v.get("txn")))
                if txn is None:
                    raise CheckerError(f"op {op.index}: completion of unknown transaction {v}")
                txn.outcome, txn.error = op.type, v.get("error")
                self._delivered(txn, v.get("delivered", []))
        elif op.f == TXN_END:
            txn = self.txns.get(str(v.get("txn")))
            if txn is not None:
                txn.end = v.get("end")
                self._delivered(txn, v.get("delivered", []))
        elif op.f == POLL and op.type == OK:
            session = self.sessions.get(op.process)
            if session is None:
                isolation = str(v.get("isolation", READ_COMMITTED))
                session = self.sessions[op.process] = Session(op.process, isolation)
            session.records.extend(records(v))
        elif op.f == OFFSETS and op.type == OK:
            found = {(str(t), int(p)): int(o) for t, p, o in v.get("offsets", [])}
            if op.process.startswith(final_prefix):
                self.final_offsets = found
            else:
                self.offset_reads.append((op, found))
        elif op.f == TOPICS:
            for name, topic in v.get("topics", {}).items():
                policy = str(topic.get("configs", {}).get("cleanup.policy", "delete"))
                if "compact" in policy.split(","):
                    self.compacted.add(str(name))
        elif op.f == FINAL_READ:
            final = self.finals.setdefault(str(v["isolation"]), FinalPass(str(v["isolation"])))
            for t, p, position, hw in v.get("partitions", []):
                tp = (str(t), int(p))
                final.ends[tp] = (int(position), int(hw))
                final.complete[tp] = int(position) >= int(hw)
            final.process = op.process

    def _invoke(self, op: Op) -> None:
        v = op.value
        txn_id = str(v["txn"])
        if txn_id in self.txns:
            raise CheckerError(f"op {op.index}: transaction {txn_id} invoked twice")
        txn = Txn(
            txn_id,
            op.process,
            str(v.get("intent", COMMIT)),
            [(str(t), int(p), str(val)) for t, p, val in v.get("writes", [])],
            records(v, "reads"),
            {(str(t), int(p)): int(o) for t, p, o in v.get("offsets", [])},
            keys={str(val): (str(k), bool(dead)) for val, (k, dead) in v.get("keys", {}).items()},
        )
        self.txns[txn_id] = txn
        for t, p, value in txn.writes:
            if value in self.writer:
                raise CheckerError(f"value {value!r} written by two transactions")
            self.writer[value] = txn
            self.written_to[value] = (t, p)
            if value in txn.keys:
                self.keys[value] = txn.keys[value]
                self.by_key[(t, p, txn.keys[value][0])].append(value)

    @staticmethod
    def _delivered(txn: Txn, delivered: Iterable[Any]) -> None:
        for t, p, o, value in delivered:
            txn.delivered[str(value)] = (str(t), int(p), int(o))

    def final_passes(self) -> None:
        """Attach to each final pass the records its session read."""
        for final in self.finals.values():
            session = self.sessions.get(final.process) if final.process else None
            for t, p, o, value in session.records if session else []:
                final.at.setdefault((t, p), {})[o] = value
