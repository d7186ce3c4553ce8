"""The target view of a mirrored verify run: what read_committed consumers see on the target
cluster, checked against what was committed on the source.

The source history is checked by the checker as in any run; its final read_committed pass is
the truth about what the source committed. The harness then reads every mirrored partition of
the target to its end, read_committed, as process `mirror-rc` (its polls and its `final-read`
op, as the source's final passes are recorded). Target topics are renamed (`{alias}.{topic}`
under the default policy) and target offsets differ from source offsets (the source's
transaction markers take offsets the target's own markers need not match), so records are
compared by identity (a value names its writer) and by order within the partition of the same
number, never by offset:
- lost-write: a value committed on the source missing from the target;
- duplicate: a value at two places on the target;
- aborted-read: a value of a transaction that certainly did not commit visible on the target;
- phantom-read: a value on the target the source did not commit there (written by nobody, not
  visible in the source's final read_committed pass, or in another partition);
- reordered: two values of one source partition in the other order on the target;
- hanging-transaction: the target read could not reach the end of a partition.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from onceflow.verify.anomalies import Anomaly, listed, place_details
from onceflow.verify.history import READ_COMMITTED, Op, TopicPartition
from onceflow.verify.indexed_history import FinalPass, IndexedHistory

MIRROR_READ = "mirror-rc"  # the process of the target's final read_committed pass


def source_ops(ops: Iterable[Op]) -> list[Op]:
    """The history without the target read (what the ordinary checker checks)."""
    return [op for op in ops if op.process != MIRROR_READ]


def check_mirror(ops: Iterable[Op], rename: Callable[[str], str]) -> list[Anomaly]:
    """The anomalies of the target view (`rename`: source topic -> target topic)."""
    everything = list(ops)
    source = IndexedHistory(source_ops(everything))
    source.final_passes()
    target = IndexedHistory(
        [op for op in everything if op.process == MIRROR_READ], final_process_prefix=MIRROR_READ
    )
    target.final_passes()
    committed = source.finals.get(READ_COMMITTED, FinalPass(READ_COMMITTED))
    mirrored = target.finals.get(READ_COMMITTED, FinalPass(READ_COMMITTED))
    return _TargetView(source, committed, mirrored, rename).run()


class _TargetView:
    def __init__(
        self,
        source: IndexedHistory,
        committed: FinalPass,
        mirrored: FinalPass,
        rename: Callable[[str], str],
    ) -> None:
        self.source, self.committed, self.mirrored = source, committed, mirrored
        self.rename = rename
        self.anomalies: list[Anomaly] = []

    def flag(self, kind: str, message: str, **details: object) -> None:
        self.anomalies.append(Anomaly(kind, message, dict(details)))

    def run(self) -> list[Anomaly]:
        places = self._places()
        self._incomplete()
        self._lost(places)
        for tp, offsets in sorted(self.committed.at.items()):
            target_tp = (self.rename(tp[0]), tp[1])
            self._order(tp, offsets, self.mirrored.at.get(target_tp, {}))
        return self.anomalies

    def _places(self) -> dict[str, list[tuple[str, int, int]]]:
        """Where each target value is; flags duplicates, aborted and phantom values."""
        where: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
        for (t, p), offsets in sorted(self.mirrored.at.items()):
            for o, value in sorted(offsets.items()):
                where[value].append((t, p, o))
        source_place = {
            value: (tp, o)
            for tp, offsets in self.committed.at.items()
            for o, value in offsets.items()
        }
        for value, found in where.items():
            t, p, o = found[0]
            if len(found) > 1:
                self.flag(
                    "duplicate",
                    f"{value!r} is {len(found)} times on the target: {found[:3]}",
                    value=value,
                    places=listed(list(x) for x in found),
                )
            txn = self.source.writer.get(value)
            if txn is not None and txn.aborted:
                self.flag(
                    "aborted-read",
                    f"the target shows {value!r} at {t}-{p}:{o}, of transaction {txn.id} "
                    f"({txn.outcome}) that did not commit",
                    **place_details(t, p, o, value, reader=MIRROR_READ),
                    txn=txn.id,
                    txn_outcome=txn.outcome,
                )
                continue
            origin = source_place.get(value)
            if origin is None or (self.rename(origin[0][0]), origin[0][1]) != (t, p):
                why = "not committed on the source" if origin is None else f"from {origin[0]}"
                self.flag(
                    "phantom-read",
                    f"the target shows {value!r} at {t}-{p}:{o}, {why}",
                    **place_details(t, p, o, value, reader=MIRROR_READ),
                )
        return where

    def _incomplete(self) -> None:
        for (t, p), done in sorted(self.mirrored.complete.items()):
            if not done:
                position, hw = self.mirrored.ends[(t, p)]
                self.flag(
                    "hanging-transaction",
                    f"the target read of {t}-{p} stopped at {position}, below its high "
                    f"watermark {hw}",
                    topic=t,
                    partition=p,
                    position=position,
                    high_watermark=hw,
                )

    def _lost(self, places: dict[str, list[tuple[str, int, int]]]) -> None:
        for (t, p), offsets in sorted(self.committed.at.items()):
            missing = [(o, v) for o, v in sorted(offsets.items()) if v not in places]
            if missing:
                self.flag(
                    "lost-write",
                    f"{len(missing)} value(s) committed at {t}-{p} are not on the target "
                    f"{self.rename(t)}-{p}, first {missing[0][1]!r} (source offset "
                    f"{missing[0][0]})",
                    topic=t,
                    partition=p,
                    values=listed(v for _, v in missing),
                    missing=len(missing),
                )

    def _order(self, tp: TopicPartition, source: dict[int, str], target: dict[int, str]) -> None:
        """The values both sides hold, in the source's offset order, must be in the same order
        on the target (a value's copies after its first are duplicates, flagged as such)."""
        rank = {value: i for i, (_, value) in enumerate(sorted(source.items()))}
        last: tuple[int, int, str] | None = None  # rank, target offset, value
        seen: set[str] = set()
        for o, value in sorted(target.items()):
            if value not in rank or value in seen:
                continue
            seen.add(value)
            if last is not None and rank[value] < last[0]:
                t, p = self.rename(tp[0]), tp[1]
                self.flag(
                    "reordered",
                    f"the target has {value!r} at {t}-{p}:{o} after {last[2]!r} "
                    f"(at {last[1]}), the other way round on the source {tp[0]}-{tp[1]}",
                    **place_details(t, p, o, value, reader=MIRROR_READ),
                    after=last[2],
                )
            last = (rank[value], o, value)
