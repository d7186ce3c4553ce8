"""The checker: reads a verify history and reports every exactly-once anomaly in it.

What it knows: which transaction wrote each value (values are unique, so a value names its
writer), each transaction's outcome as its client saw it (ok = committed, fail = certainly
not committed, unknown = either), the offsets delivery reports gave, every record every
consumer polled, the group offsets seen, and the final reads: after the faults stop and the
clients exit, one read_committed and one read_uncommitted pass over every partition to its
end. The final read_committed pass is the truth about what is committed; a transaction of
unknown outcome may be visible or not, but all-or-nothing.

Anomalies (each with the offending values and offsets):
- aborted-read: a read_committed consumer (reader, copier, final read) saw a value of a
  transaction that certainly did not commit;
- phantom-read: a value nobody wrote, or read in a partition it was not written to;
- lost-write: a committed value (acknowledged, or seen by a read_committed reader) missing
  from the final read_committed pass, an acknowledged write missing from the log, or an input
  the copiers consumed (their committed offset is past it) without a committed copy;
- duplicate: one value at two offsets, or one input copied twice into committed output;
- inconsistent-offset: one offset holding two values;
- nonmonotonic-poll: a consumer got an offset at or below one it already got;
- poll-skip: a consumer went past records its isolation level should have returned;
- torn-transaction: a reader saw part of a transaction and went past the rest without it, a
  transaction partly visible in the final read, or a copy committed without its offsets;
- aborted-offsets / phantom-offsets: a committed group offset that only an aborted
  transaction (or no transaction) committed;
- hanging-transaction: the final read_committed pass could not reach the end of a partition
  (its last stable offset stayed below the high watermark: a transaction never completed).

Compacted topics (`cleanup.policy` with `compact`, from the harness's `topics` operation; the
writes carry keys). The cleaner legitimately removes a record that is *removable*: a tombstone
(after `delete.retention.ms`), a record of a transaction not known to have committed (aborted
records go; unknown outcomes are given the benefit of the doubt), or a record *superseded* by a
write of the same key at a higher offset of the same partition whose transaction did not
certainly abort (or whose offset is unknown). The checks above that want a value present
(lost-write, torn-transaction) excuse removable values there, and three checks are added:
- last-value-lost: per key, the *last committed value* is the committed write (acknowledged,
  or of an unknown-outcome transaction seen by a read_committed read) at the highest offset:
  the log order, which is the order compaction keeps and a consumer materialising a table
  applies, not the order the commits completed in. The final read_committed pass (after the
  cleaner ran) must hold, as the key's highest-offset record, that value or a later write of a
  transaction of unknown outcome; or nothing, if that value is a tombstone or a later
  tombstone of unknown outcome may have committed (and then been removed);
- aborted-read covers the final read_committed pass too: no aborted value becomes visible
  when cleaning drops its transaction's abort marker;
- offset-changed: a value the final passes hold at one offset was delivered or read at
  another (the cleaner must never move a record; reported instead of duplicate when the
  final passes hold the value only once).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from onceflow.verify.anomalies import (
    Anomaly,
    CheckResult,
    listed,
    listed_rows,
    place_details,
)
from onceflow.verify.history import (
    COMMIT,
    FAIL,
    OK,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    UNKNOWN,
    Op,
    Record,
    TopicPartition,
)
from onceflow.verify.indexed_history import FinalPass, IndexedHistory, Session, Txn
from onceflow.verify.workload import COPY_MARK


class Checker:
    def __init__(self, ops: Iterable[Op]) -> None:
        self.model = IndexedHistory(ops)
        self.model.final_passes()
        self.anomalies: list[Anomaly] = []
        m = self.model
        self.final_rc = m.finals.get(READ_COMMITTED, FinalPass(READ_COMMITTED))
        self.final_ru = m.finals.get(READ_UNCOMMITTED, FinalPass(READ_UNCOMMITTED))
        self.final_processes = {f.process for f in m.finals.values() if f.process}
        # Where each value was seen (deliveries and every read), and what each offset held.
        self.where: dict[str, set[tuple[str, int, int]]] = defaultdict(set)
        self.at: dict[tuple[str, int, int], set[str]] = defaultdict(set)
        self.first_source: dict[tuple[str, int, int, str], str] = {}
        self.committed_values: set[str] = {
            value for offsets in self.final_rc.at.values() for value in offsets.values()
        }

    def flag(self, kind: str, message: str, **details: Any) -> None:
        self.anomalies.append(Anomaly(kind, message, details))

    def _flag_read(self, kind: str, process: str, record: Record, why: str, **details: Any) -> None:
        """A reader's read that is wrong: the message names who read what where, then why."""
        t, p, o, value = record
        self.flag(
            kind,
            f"{process} read {value!r} at {t}-{p}:{o}{why}",
            **place_details(t, p, o, value, reader=process),
            **details,
        )

    def run(self, progress: Callable[[str], None] | None = None) -> CheckResult:
        """Every check in turn; `progress` is told each step's name as it starts."""
        steps = (
            ("observations", self._observations),
            ("compaction", self._compaction),
            ("consistency", self._consistency),
            ("reads", self._reads),
            ("consumer sessions", self._sessions),
            ("final state", self._final),
            ("copies", self._copies),
            ("group offsets", self._offsets),
            ("last values", self._last_values),
        )
        for i, (name, step) in enumerate(steps, 1):
            if progress is not None:
                progress(f"{name} ({i}/{len(steps)})")
            step()
        return CheckResult(self.anomalies, self._stats())

    # -- what was seen where ---------------------------------------------------------------

    def _observe(self, t: str, p: int, o: int, value: str, source: str) -> None:
        self.where[value].add((t, p, o))
        self.at[(t, p, o)].add(value)
        self.first_source.setdefault((t, p, o, value), source)

    def _observations(self) -> None:
        m = self.model
        for txn in m.txns.values():
            for value, (t, p, o) in txn.delivered.items():
                if o >= 0:
                    self._observe(t, p, o, value, f"delivery to {txn.process}")
            for t, p, o, value in txn.reads:
                self._observe(t, p, o, value, f"read by {txn.process}")
        for session in m.sessions.values():
            for t, p, o, value in session.records:
                self._observe(t, p, o, value, f"read by {session.process}")

    # -- compaction ------------------------------------------------------------------------

    def _compaction(self) -> None:
        """What compaction may remove: transactions known committed, and per key the highest
        offset a not-aborted write of it was seen at (or that one was never placed)."""
        m = self.model
        self.known_committed: set[str] = {t.id for t in m.txns.values() if t.committed}
        for _, (_, _, _, value) in self._committed_reads():
            txn = m.writer.get(value)
            if txn is not None and txn.uncertain:
                self.known_committed.add(txn.id)
        self.latest: dict[tuple[str, int, str], int] = {}
        self.unplaced: set[tuple[str, int, str]] = set()
        for place, values in m.by_key.items():
            for value in values:
                if m.writer[value].aborted:
                    continue
                offset = self._offset(value)
                if offset is None:
                    self.unplaced.add(place)
                else:
                    self.latest[place] = max(self.latest.get(place, -1), offset)
        self.final_places: dict[str, set[tuple[str, int, int]]] = defaultdict(set)
        for final in self.model.finals.values():
            for (t, p), offsets in final.at.items():
                for o, value in offsets.items():
                    self.final_places[value].add((t, p, o))

    def _offset(self, value: str) -> int | None:
        """The (lowest) offset a value was delivered or read at in its partition."""
        tp = self.model.written_to.get(value)
        offsets = [o for t, p, o in self.where.get(value, ()) if (t, p) == tp]
        return min(offsets) if offsets else None

    def removable(self, value: str) -> bool:
        """Whether the cleaner may have removed this value (see the module's docstring)."""
        m = self.model
        tp = m.written_to.get(value)
        if tp is None or tp[0] not in m.compacted or value not in m.keys:
            return False
        key, tombstone = m.keys[value]
        if tombstone or m.writer[value].id not in self.known_committed:
            return True
        place = (*tp, key)
        offset = self._offset(value)
        return offset is None or place in self.unplaced or self.latest.get(place, -1) > offset

    def _last_values(self) -> None:
        """Per key of a compacted topic: its last committed value is what the final
        read_committed pass holds for it (see the module's docstring)."""
        m = self.model
        found: dict[tuple[str, int, str], tuple[int, str]] = {}
        for (t, p), offsets in self.final_rc.at.items():
            for o, value in offsets.items():
                if value in m.keys and t in m.compacted:
                    place = (t, p, m.keys[value][0])
                    found[place] = max(found.get(place, (-1, "")), (o, value))
        self.keys_checked = self.keys_deleted = 0
        for place, values in sorted(m.by_key.items()):
            t, p, key = place
            if t not in m.compacted or not self.final_rc.complete.get((t, p), False):
                continue
            committed = [
                (o, v)
                for v in values
                if m.writer[v].id in self.known_committed and (o := self._offset(v)) is not None
            ]
            if not committed:
                continue
            self.keys_checked += 1
            last_offset, last = max(committed)
            deleted = m.keys[last][1]
            self.keys_deleted += deleted
            final = found.get(place)
            if final is not None and final[0] >= last_offset:
                continue  # the last committed value, or a later one of unknown outcome
            if final is None and (deleted or self._maybe_deleted_after(place, last_offset)):
                continue
            holds = f"{final[1]!r} at offset {final[0]}" if final else "nothing"
            self.flag(
                "last-value-lost",
                f"key {key!r} of {t}-{p}: the last committed value is {last!r} at offset "
                f"{last_offset}, but the final read_committed pass holds {holds}",
                **place_details(t, p, last_offset, last),
                key=key,
                tombstone=deleted,
                txn=m.writer[last].id,
                final=list(final) if final else None,
            )

    def _maybe_deleted_after(self, place: tuple[str, int, str], offset: int) -> bool:
        """A tombstone of this key, of unknown outcome, at a higher or unknown offset: it may
        have committed and been removed after delete.retention.ms."""
        m = self.model
        for value in m.by_key.get(place, ()):
            txn = m.writer[value]
            if m.keys[value][1] and txn.uncertain:
                at = self._offset(value)
                if at is None or at > offset:
                    return True
        return False

    # -- the same value, the same offset ----------------------------------------------------

    def _consistency(self) -> None:
        for (t, p, o), values in sorted(self.at.items()):
            if len(values) > 1:
                sources = {v: self.first_source[(t, p, o, v)] for v in sorted(values)}
                self.flag(
                    "inconsistent-offset",
                    f"{t}-{p} offset {o} holds {len(values)} values",
                    **place_details(t, p, o),
                    values=sources,
                )
        for value, places in sorted(self.where.items()):
            final = self.final_places.get(value, set())
            if len(places) > 1 and len(final) == 1 and next(iter(final))[0] in self.model.compacted:
                (t, p, o), before = next(iter(final)), sorted(places - final)
                self.flag(
                    "offset-changed",
                    f"value {value!r} is at {t}-{p}:{o} at the end, but was at offset(s) "
                    f"{[x[2] for x in before]} before",
                    **place_details(t, p, o, value),
                    before={
                        f"{bt}-{bp}:{bo}": self.first_source[(bt, bp, bo, value)]
                        for bt, bp, bo in before
                    },
                    writer=self._writer_id(value),
                )
            elif len(places) > 1:
                self.flag(
                    "duplicate",
                    f"value {value!r} at {len(places)} offsets",
                    value=value,
                    offsets=[list(x) for x in sorted(places)],
                    writer=self._writer_id(value),
                )

    def _writer_id(self, value: str) -> str | None:
        txn = self.model.writer.get(value)
        return txn.id if txn else None

    # -- reads -----------------------------------------------------------------------------

    def _committed_reads(self) -> Iterable[tuple[str, Record]]:
        m = self.model
        for session in m.sessions.values():
            if session.isolation == READ_COMMITTED:
                for record in session.records:
                    yield session.process, record
        for txn in m.txns.values():
            for record in txn.reads:  # copiers read read_committed
                yield txn.process, record

    def _reads(self) -> None:
        m = self.model
        flagged: set[tuple[str, str]] = set()
        for session in m.sessions.values():
            for t, p, o, value in session.records:
                self._check_placed(session.process, t, p, o, value, flagged)
        for process, record in self._committed_reads():
            t, p, o, value = record
            self._check_placed(process, t, p, o, value, flagged)
            txn = m.writer.get(value)
            if txn is not None and txn.aborted and (process, value) not in flagged:
                flagged.add((process, value))
                self._flag_read(
                    "aborted-read",
                    process,
                    record,
                    f", written by transaction {txn.id}, which did not commit "
                    f"({txn.error or txn.intent})",
                    txn=txn.id,
                    txn_outcome=txn.outcome,
                )

    def _check_placed(
        self, process: str, t: str, p: int, o: int, value: str, flagged: set[tuple[str, str]]
    ) -> None:
        expected = self.model.written_to.get(value)
        if expected == (t, p) or (process, value) in flagged:
            return
        flagged.add((process, value))
        where = "nobody wrote it" if expected is None else f"it was written to {expected}"
        self._flag_read("phantom-read", process, (t, p, o, value), f", but {where}")

    def _sessions(self) -> None:
        """Per consumer: offsets only go up, nothing is skipped, transactions are whole."""
        expected = {
            READ_COMMITTED: self._sorted(self.final_rc),
            READ_UNCOMMITTED: self._sorted(self.final_ru),
        }
        for session in self.model.sessions.values():
            last: dict[TopicPartition, int] = {}
            # What a gap may pass over without a poll-skip, indexed once per session (not per
            # gap: a 1-hour run has tens of thousands of gaps): values of torn transactions,
            # flagged as such, and records the consumer did read at another offset
            # (offset-changed, duplicate or inconsistent-offset).
            excused: set[str] = {value for *_, value in session.records}
            if session.isolation == READ_COMMITTED and session.process not in self.final_processes:
                excused.update(self._torn_in_session(session))  # the final pass is judged whole
            for t, p, o, value in session.records:
                tp = (t, p)
                previous = last.get(tp, -1)
                if tp in last and o <= previous:
                    self.flag(
                        "nonmonotonic-poll",
                        f"{session.process} got {t}-{p}:{o} after offset {previous}",
                        **place_details(t, p, o, reader=session.process),
                        previous_offset=previous,
                        value=value,
                    )
                elif o > previous + 1:
                    self._skip(session, tp, previous, o, expected[session.isolation], excused)
                last[tp] = max(previous, o)

    @staticmethod
    def _sorted(final: FinalPass) -> dict[TopicPartition, tuple[list[int], list[str]]]:
        out = {}
        for tp, offsets in final.at.items():
            keys = sorted(offsets)
            out[tp] = (keys, [offsets[k] for k in keys])
        return out

    def _skip(
        self,
        session: Session,
        tp: TopicPartition,
        previous: int,
        offset: int,
        expected: dict[TopicPartition, tuple[list[int], list[str]]],
        excused: set[str],
    ) -> None:
        keys, values = expected.get(tp, ([], []))
        lo, hi = bisect.bisect_right(keys, previous), bisect.bisect_left(keys, offset)
        missed = [(keys[i], values[i]) for i in range(lo, hi) if values[i] not in excused]
        if not missed:
            return
        t, p = tp
        self.flag(
            "poll-skip",
            f"{session.process} went from {t}-{p}:{previous} to {offset}, past "
            f"{len(missed)} record(s) it should have read",
            reader=session.process,
            isolation=session.isolation,
            topic=t,
            partition=p,
            from_offset=previous,
            to_offset=offset,
            missed=listed_rows(missed),
            missed_count=len(missed),
        )

    def _torn_in_session(self, session: Session) -> dict[str, str]:
        """Transactions this read_committed consumer saw part of, having gone past the offset
        of another of their writes without seeing it. Returns missed value -> transaction."""
        m = self.model
        furthest: dict[TopicPartition, int] = {}
        seen: set[str] = set()
        for t, p, o, value in session.records:
            furthest[(t, p)] = max(furthest.get((t, p), -1), o)
            seen.add(value)
        missed: dict[str, str] = {}
        checked: set[str] = set()
        for value in seen:
            txn = m.writer.get(value)
            if txn is None or txn.id in checked:
                continue
            checked.add(txn.id)
            passed = []
            for t, p, other in txn.writes:
                if other in seen or self.removable(other):
                    continue
                offsets = [po for pt, pp, po in self.where.get(other, ()) if (pt, pp) == (t, p)]
                if offsets and furthest.get((t, p), -1) > min(offsets):
                    passed.append((t, p, min(offsets), other))
            if passed:
                for *_, other in passed:
                    missed[other] = txn.id
                self.flag(
                    "torn-transaction",
                    f"{session.process} saw part of transaction {txn.id} and read past "
                    f"{len(passed)} of its other write(s) without them",
                    reader=session.process,
                    txn=txn.id,
                    txn_outcome=txn.outcome,
                    seen=listed(v for _, _, v in txn.writes if v in seen),
                    passed=listed_rows(passed),
                )
        return missed

    # -- the final state -------------------------------------------------------------------

    def _final(self) -> None:
        m = self.model
        if not m.finals:
            return
        for tp, complete in sorted(self.final_rc.complete.items()):
            if not complete:
                position, hw = self.final_rc.ends[tp]
                self.flag(
                    "hanging-transaction",
                    f"the final read_committed pass stopped at {tp[0]}-{tp[1]}:{position}, "
                    f"below the high watermark {hw}: a transaction there never completed",
                    topic=tp[0],
                    partition=tp[1],
                    position=position,
                    high_watermark=hw,
                )
        rc_done = {tp for tp, ok in self.final_rc.complete.items() if ok}
        ru_done = {tp for tp, ok in self.final_ru.complete.items() if ok}
        ru_values = {v for offsets in self.final_ru.at.values() for v in offsets.values()}
        committed = self.committed_values
        for txn in m.txns.values():
            visible = [(t, p, v) for t, p, v in txn.writes if v in committed]
            hidden = [
                (t, p, v)
                for t, p, v in txn.writes
                if v not in committed and (t, p) in rc_done and not self.removable(v)
            ]
            if visible and hidden:
                self.flag(
                    "torn-transaction",
                    f"transaction {txn.id} ({txn.outcome}) is partly visible in the final "
                    f"read: {len(visible)} value(s) committed, {len(hidden)} not",
                    txn=txn.id,
                    txn_outcome=txn.outcome,
                    visible=listed_rows(visible),
                    missing=listed_rows(hidden),
                )
            elif txn.committed and hidden:
                self.flag(
                    "lost-write",
                    f"transaction {txn.id} committed (acknowledged), but {len(hidden)} of its "
                    "value(s) are missing from the final read_committed pass",
                    txn=txn.id,
                    missing=[
                        [t, p, txn.delivered.get(v, (t, p, -1))[2], v] for t, p, v in listed(hidden)
                    ],
                )
            lost = [
                (t, p, o, v)
                for v, (t, p, o) in txn.delivered.items()
                if o >= 0 and v not in ru_values and (t, p) in ru_done and not self.removable(v)
            ]
            if lost:
                self.flag(
                    "lost-write",
                    f"transaction {txn.id}: {len(lost)} acknowledged write(s) missing from "
                    "the log (final read_uncommitted pass)",
                    txn=txn.id,
                    txn_outcome=txn.outcome,
                    missing=listed_rows(lost),
                )
        # A value a read_committed consumer saw was committed; it must still be there.
        reported: set[str] = set()
        for process, record in self._committed_reads():
            t, p, _, value = record
            if process in self.final_processes or value in committed or value in reported:
                continue
            txn = m.writer.get(value)
            if (t, p) not in rc_done or txn is None or txn.aborted or self.removable(value):
                continue
            reported.add(value)
            self._flag_read(
                "lost-write",
                process,
                record,
                " read_committed, but the final read_committed pass does not have it",
                txn=txn.id,
                txn_outcome=txn.outcome,
            )

    def _copies(self) -> None:
        """Consume-transform-produce: the committed copies and the committed offsets agree."""
        m = self.model
        if m.final_offsets is None:
            return
        copies: dict[str, list[tuple[str, int, int, str]]] = defaultdict(list)
        for (t, p), offsets in self.final_rc.at.items():
            for o, value in offsets.items():
                txn = m.writer.get(value)
                if txn is not None and txn.reads and COPY_MARK in value:
                    copies[value.rpartition(COPY_MARK)[0]].append((t, p, o, value))
        for source, found in copies.items():
            if len(found) > 1:
                self.flag(
                    "duplicate",
                    f"input {source!r} copied {len(found)} times into committed output",
                    value=source,
                    copies=[list(x) for x in found],
                )
        for tp, group_offset in sorted(m.final_offsets.items()):
            if not self.final_rc.complete.get(tp, False):
                continue
            for o, value in sorted(self.final_rc.at.get(tp, {}).items()):
                more: dict[str, Any] = {}
                if o < group_offset and value not in copies:
                    kind = "lost-write"
                    why = (
                        f"is below the group's committed offset {group_offset}, "
                        "but no copy of it is committed"
                    )
                elif o >= group_offset and value in copies:
                    kind = "torn-transaction"
                    why = (
                        f"has a committed copy, but the group's committed offset {group_offset} "
                        "is not past it"
                    )
                    more = {"copies": [list(x) for x in copies[value]]}
                else:
                    continue
                self.flag(
                    kind,
                    f"input {value!r} at {tp[0]}-{tp[1]}:{o} {why}",
                    **place_details(*tp, o, value),
                    group_offset=group_offset,
                    **more,
                )

    def _offsets(self) -> None:
        """Every committed group offset seen was committed by a transaction that committed
        (or may have)."""
        m = self.model
        by_offset: dict[tuple[TopicPartition, int], list[Txn]] = defaultdict(list)
        for txn in m.txns.values():
            for tp, o in txn.offsets.items():
                by_offset[(tp, o)].append(txn)
        observations = list(m.offset_reads)
        if m.final_offsets is not None:
            observations.append((None, m.final_offsets))  # type: ignore[arg-type]
        reported: set[tuple[TopicPartition, int]] = set()
        for op, found in observations:
            for tp, o in sorted(found.items()):
                if o < 0 or (tp, o) in reported:
                    continue
                writers = by_offset.get((tp, o), [])
                more: dict[str, Any] = {}
                if not writers:
                    kind, why = "phantom-offsets", "no transaction committed"
                elif all(txn.aborted for txn in writers):
                    kind = "aborted-offsets"
                    why = f"only aborted transaction(s) committed: {[t.id for t in writers]}"
                    more = {"txns": {t.id: t.error or t.intent for t in writers}}
                else:
                    continue
                reported.add((tp, o))
                where = "the final offsets" if op is None else f"offsets read at op {op.index}"
                self.flag(
                    kind,
                    f"{where}: {tp[0]}-{tp[1]} committed at {o}, which {why}",
                    **place_details(*tp, o),
                    **more,
                )

    # -- figures ---------------------------------------------------------------------------

    def _stats(self) -> dict[str, Any]:
        m = self.model
        outcomes = Counter(t.outcome or UNKNOWN for t in m.txns.values())
        committed = self.committed_values
        unknown_visible = sum(
            1
            for t in m.txns.values()
            if t.uncertain and any(v in committed for _, _, v in t.writes)
        )
        return {
            "operations": m.ops,
            "transactions": len(m.txns),
            "committed": outcomes.get(OK, 0),
            "aborted": outcomes.get(FAIL, 0),
            "unknown": outcomes.get(UNKNOWN, 0),
            "unknown_committed": unknown_visible,
            "aborted_on_purpose": sum(1 for t in m.txns.values() if t.intent != COMMIT),
            "copy_transactions": sum(1 for t in m.txns.values() if t.reads),
            "values_written": len(m.writer),
            "values_committed": len(committed),
            "polls_records": sum(
                len(s.records) for s in m.sessions.values() if s.process not in self.final_processes
            ),
            "offset_reads": len(m.offset_reads),
            "faults": dict(m.faults),
            **(self._compaction_stats() if m.compacted else {}),
        }

    def _compaction_stats(self) -> dict[str, Any]:
        """How much the checks of a compacted topic had to work on: keys whose last value was
        checked, and the values seen in the log that the cleaner removed by the end."""
        m = self.model
        ru_done = {tp for tp, ok in self.final_ru.complete.items() if ok}
        cleaned: Counter[str] = Counter()
        for value, (t, p) in m.written_to.items():
            if t not in m.compacted or (t, p) not in ru_done or value in self.final_places:
                continue
            if self._offset(value) is None:
                continue  # never in the log as far as anyone saw
            if m.writer[value].aborted:
                cleaned["aborted"] += 1
            elif m.keys.get(value, ("", False))[1]:
                cleaned["tombstones"] += 1
            else:
                cleaned["superseded"] += 1
        return {
            "keys": sum(1 for t, _, _ in m.by_key if t in m.compacted),
            "keys_checked": self.keys_checked,
            "keys_deleted": self.keys_deleted,
            "tombstones_written": sum(1 for _, dead in m.keys.values() if dead),
            "cleaned_superseded": cleaned["superseded"],
            "cleaned_aborted": cleaned["aborted"],
            "cleaned_tombstones": cleaned["tombstones"],
        }


def check(ops: Iterable[Op], progress: Callable[[str], None] | None = None) -> CheckResult:
    """Check a history (operations in the order they were recorded); `progress` is told
    what the checker is doing ("indexing", then each step)."""
    if progress is not None:
        progress("indexing the history")
    return Checker(ops).run(progress)
