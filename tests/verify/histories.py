"""Hand-made verify histories: a tiny builder that writes operations as the workers and the
harness would, so that each checker test states its scenario in a few lines."""

from __future__ import annotations

from typing import Any

from onceflow.verify.history import (
    ABORT,
    COMMIT,
    FAIL,
    FINAL,
    FINAL_READ,
    INFO,
    INVOKE,
    OFFSETS,
    OK,
    POLL,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    TOPICS,
    TXN,
    TXN_END,
    History,
    Op,
)

A, B, OUT = "topic-a", "topic-b", "copy"
GROUP = "copiers"
Placed = tuple[str, int, int, str]  # topic, partition, offset, value


class Scenario:
    def __init__(self) -> None:
        self.history = History(start=0.0)
        self.clock = 0.0

    def _add(self, process: str, type_: str, f: str, value: dict[str, Any]) -> None:
        self.clock += 0.001
        self.history.append(process, type_, f, value, at=self.clock)

    def txn(
        self,
        process: str,
        txn: str,
        placed: list[Placed],
        outcome: str,
        *,
        intent: str = COMMIT,
        reads: list[Placed] | None = None,
        offsets: list[tuple[str, int, int]] | None = None,
        keys: dict[str, tuple[str, bool]] | None = None,
    ) -> None:
        """A transaction whose writes landed at the given offsets (offset -1: not delivered);
        `keys` gives keyed writes their key and whether they are tombstones."""
        invoke: dict[str, Any] = {
            "txn": txn,
            "intent": intent,
            "writes": [[t, p, v] for t, p, _, v in placed],
        }
        if keys is not None:
            invoke["keys"] = {v: [k, dead] for v, (k, dead) in keys.items()}
        if reads is not None:
            invoke |= {"reads": [list(r) for r in reads], "group": GROUP}
            invoke["offsets"] = [list(o) for o in offsets or []]
        delivered = [[t, p, o, v] for t, p, o, v in placed if o >= 0]
        self._add(process, INVOKE, TXN, invoke)
        end = ABORT if intent == ABORT or outcome == FAIL else COMMIT
        self._add(process, INFO, TXN_END, {"txn": txn, "end": end, "delivered": delivered})
        error = None if outcome == OK else "test"
        self._add(process, outcome, TXN, {"txn": txn, "delivered": delivered, "error": error})

    def topics(self, topics: dict[str, tuple[int, dict[str, str]]]) -> None:
        """The harness's record of the topics it created: name -> (partitions, configs)."""
        value = {name: {"partitions": n, "configs": c} for name, (n, c) in topics.items()}
        self._add("harness", INFO, TOPICS, {"topics": value})

    def poll(self, process: str, records: list[Placed], isolation: str = READ_COMMITTED) -> None:
        self._add(process, INVOKE, POLL, {"isolation": isolation})
        self._add(
            process, OK, POLL, {"isolation": isolation, "records": [list(r) for r in records]}
        )

    def offsets(self, process: str, found: list[tuple[str, int, int]]) -> None:
        self._add(process, INVOKE, OFFSETS, {"group": GROUP})
        self._add(process, OK, OFFSETS, {"group": GROUP, "offsets": [list(o) for o in found]})

    def final(
        self,
        isolation: str,
        records: list[Placed],
        ends: dict[tuple[str, int], int],
        positions: dict[tuple[str, int], int] | None = None,
        process: str | None = None,
    ) -> None:
        """A final pass that read `records` and reached each partition's end (a high
        watermark), unless `positions` says it stopped short."""
        process = process or f"{FINAL}-{'rc' if isolation == READ_COMMITTED else 'ru'}"
        if records:
            self.poll(process, records, isolation)
        at = positions or {}
        partitions = [[t, p, at.get((t, p), hw), hw] for (t, p), hw in sorted(ends.items())]
        self._add(process, INFO, FINAL_READ, {"isolation": isolation, "partitions": partitions})

    def final_offsets(self, found: list[tuple[str, int, int]]) -> None:
        self.offsets(FINAL, found)

    def finals(
        self,
        committed: list[Placed],
        uncommitted: list[Placed],
        ends: dict[tuple[str, int], int],
    ) -> None:
        self.final(READ_COMMITTED, committed, ends)
        self.final(READ_UNCOMMITTED, uncommitted, ends)

    @property
    def ops(self) -> list[Op]:
        return self.history.ops


# The base scenario the checker tests vary (clean() builds it).
V1: Placed = (A, 0, 0, "p1.1.0")
V2: Placed = (B, 0, 0, "p1.1.1")  # same transaction as V1, other partition
V3: Placed = (A, 0, 2, "p2.1.0")  # aborted on purpose; its ABORT marker at A-0:3
V4: Placed = (A, 0, 4, "p1.2.0")
COPY: Placed = (OUT, 0, 0, "p1.1.0>c.1")  # the copier's copy of V1
ENDS = {(A, 0): 6, (B, 0): 2, (OUT, 0): 2}
ALL_UNCOMMITTED = [V1, V3, V4, V2, COPY]  # the final read_uncommitted pass of clean()


def clean(
    *,
    committed: list[Placed] | None = None,
    uncommitted: list[Placed] | None = None,
    final_offsets: list[tuple[str, int, int]] | None = None,
    extra: Any = None,
) -> Scenario:
    """Two producers (one transaction aborted on purpose), a copier, read_committed and
    read_uncommitted readers and the final passes, all consistent; `extra(s)` adds more
    operations before the final passes."""
    s = Scenario()
    s.txn("p1#1", "p1.1", [V1, V2], OK)
    s.txn("p2#1", "p2.1", [V3], FAIL, intent="abort")
    s.txn("p1#1", "p1.2", [V4], OK)
    s.txn("c#1", "c.1", [COPY], OK, reads=[V1], offsets=[(A, 0, 1)])
    s.poll("rc#1", [V1, V4, V2, COPY])
    s.poll("ru#1", [V1, V3, V4, V2], READ_UNCOMMITTED)
    s.offsets("offsets#1", [(A, 0, 1)])
    if extra is not None:
        extra(s)
    s.finals(
        [V1, V4, V2, COPY] if committed is None else committed,
        [V1, V3, V4, V2, COPY] if uncommitted is None else uncommitted,
        ENDS,
    )
    s.final_offsets([(A, 0, 1)] if final_offsets is None else final_offsets)
    return s


__all__ = [
    "ALL_UNCOMMITTED",
    "COPY",
    "ENDS",
    "FAIL",
    "GROUP",
    "OK",
    "OUT",
    "READ_UNCOMMITTED",
    "V1",
    "V2",
    "V3",
    "V4",
    "A",
    "B",
    "Scenario",
    "clean",
]
