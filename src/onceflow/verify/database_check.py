"""The database view of a verify run (the database workload): the loaders' table, read at the
end (`database-read`), checked against the committed input and the loaders' own stores.

The truth about the input is the final read_committed pass of the input topic; each row of the
table names the record it stores (topic, partition, offset, value) and the store (database
transaction) that wrote it; the database's positions say, per input partition, the next offset
to read. In one linear pass over each, in verify's vocabulary:
- duplicate: one input record in two rows;
- aborted-read: a row holding a value of a Kafka transaction that did not commit, or written
  by a store that certainly did not commit (rolled back, or killed before its commit);
- phantom-read: a row whose value is not the committed input at its offset, or written by no
  store the history knows;
- lost-write: a committed input record below the database's position without its row, or a
  store acknowledged committed with rows missing;
- torn-transaction: a store of unknown outcome partly visible, or a row at or past its
  partition's position (rows and positions were not committed together);
- phantom-offsets: a position past the partition's high watermark.
The table must equal the committed input exactly: the harness waits for the positions to
cover it all (else the run reports an error, and what was not stored yet is counted).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from onceflow.verify.anomalies import Anomaly, listed, listed_rows, place_details
from onceflow.verify.database_workload import DATABASE_READ
from onceflow.verify.faults import CRASH_CLIENT
from onceflow.verify.history import NEMESIS, OK, READ_COMMITTED, Op
from onceflow.verify.indexed_history import FinalPass, IndexedHistory
from onceflow.verify.workload import LOADER


def check_database(ops: Iterable[Op]) -> tuple[list[Anomaly], dict[str, Any]]:
    """The anomalies of the table, and its figures (for the run's operations)."""
    everything = list(ops)
    model = IndexedHistory(everything)
    model.final_passes()
    read = next(
        (op for op in reversed(everything) if op.f == DATABASE_READ and op.type == OK), None
    )
    if read is None:
        return [], {"database_read": False}
    return _TableView(model, read, everything).run()


class _TableView:
    def __init__(self, model: IndexedHistory, read: Op, ops: list[Op]) -> None:
        self.model, self.ops = model, ops
        self.final = model.finals.get(READ_COMMITTED, FinalPass(READ_COMMITTED))
        self.rows = [
            (str(t), int(p), int(o), str(v), str(x)) for t, p, o, v, x in read.value["rows"]
        ]
        self.positions = {(str(t), int(p)): int(o) for t, p, o in read.value["positions"]}
        self.topic = str(read.value["topic"])
        self.anomalies: list[Anomaly] = []
        self.killed = 0  # stores their loader's SIGKILL interrupted

    def flag(self, kind: str, message: str, **details: Any) -> None:
        self.anomalies.append(Anomaly(kind, message, details))

    def run(self) -> tuple[list[Anomaly], dict[str, Any]]:
        at: dict[tuple[str, int, int], list[tuple[str, str]]] = defaultdict(list)
        by_store: dict[str, set[tuple[str, int, int]]] = defaultdict(set)
        for t, p, o, value, store in self.rows:
            at[(t, p, o)].append((value, store))
            by_store[store].add((t, p, o))
        for place, found in sorted(at.items()):
            self._row(place, found)
        stores = self._stores(by_store)
        unstored = self._positions(at)
        kills = sum(
            op.process == NEMESIS
            and op.f == CRASH_CLIENT
            and op.type == OK
            and str(op.value.get("target", "")).startswith(LOADER)
            for op in self.ops
        )
        return self.anomalies, {
            "database_loader_kills": kills,
            "database_stores_killed": self.killed,
            "database_rows": len(self.rows),
            "database_stores": sum(stores.values()),
            "database_stores_committed": stores[OK],
            "database_stores_rolled_back": stores["fail"],
            "database_stores_unknown": stores["unknown"],
            "database_unstored": unstored,
        }

    def _row(self, place: tuple[str, int, int], found: list[tuple[str, str]]) -> None:
        t, p, o = place
        value, store = found[0]
        if len(found) > 1:
            self.flag(
                "duplicate",
                f"input {t}-{p}:{o} is {len(found)} times in the table",
                **place_details(t, p, o, value),
                stores=listed(s for _, s in found),
            )
        writer = self.model.writer.get(value)
        loader = self.model.txns.get(store)
        committed = self.final.at.get((t, p), {}).get(o)
        position, _ = self.final.ends.get((t, p), (0, 0))
        if writer is not None and writer.aborted:
            self.flag(
                "aborted-read",
                f"the table holds {value!r} ({t}-{p}:{o}) of transaction {writer.id}, which "
                "did not commit",
                **place_details(t, p, o, value, reader=DATABASE_READ),
                txn=writer.id,
                txn_outcome=writer.outcome,
            )
        elif committed != value and (committed is not None or o < position):
            self.flag(
                "phantom-read",
                f"the table holds {value!r} for {t}-{p}:{o}, where the committed input is "
                f"{committed!r}",
                **place_details(t, p, o, value, reader=DATABASE_READ),
                committed=committed,
            )
        if loader is None:
            self.flag(
                "phantom-read",
                f"the table holds {value!r} ({t}-{p}:{o}) from store {store!r}, which no "
                "loader ran",
                **place_details(t, p, o, value, reader=DATABASE_READ),
                store=store,
            )
        elif loader.aborted:
            self.flag(
                "aborted-read",
                f"the table holds {value!r} ({t}-{p}:{o}) from store {store}, which did not "
                f"commit ({loader.error})",
                **place_details(t, p, o, value, reader=DATABASE_READ),
                store=store,
            )

    def _stores(self, by_store: dict[str, set[tuple[str, int, int]]]) -> Counter[str]:
        """Each store whole or not at all: an acknowledged one whole."""
        outcomes: Counter[str] = Counter()
        for txn in self.model.txns.values():
            if not txn.process.startswith(LOADER):
                continue
            outcomes[txn.outcome or "unknown"] += 1
            self.killed += str(txn.error).startswith("crashed")
            if txn.aborted:
                continue  # its rows, if any, are flagged row by row
            wanted = [(t, p, o, v) for t, p, o, v in txn.reads]
            visible = by_store.get(txn.id, set())
            missing = [r for r in wanted if r[:3] not in visible]
            if not missing or (txn.uncertain and len(missing) == len(wanted)):
                continue
            if txn.committed:
                self.flag(
                    "lost-write",
                    f"store {txn.id} committed (acknowledged), but {len(missing)} of its "
                    f"{len(wanted)} rows are not in the table",
                    store=txn.id,
                    missing=listed_rows(missing),
                )
            else:
                self.flag(
                    "torn-transaction",
                    f"store {txn.id} (outcome unknown) is partly in the table: "
                    f"{len(wanted) - len(missing)} of its {len(wanted)} rows",
                    store=txn.id,
                    missing=listed_rows(missing),
                )
        return outcomes

    def _positions(self, at: dict[tuple[str, int, int], list[tuple[str, str]]]) -> int:
        """Rows and positions agree, and every committed input below a position is stored;
        returns how many committed input records are not stored yet (past the positions)."""
        unstored = 0
        for (t, p), offsets in sorted(self.final.at.items()):
            if t != self.topic:
                continue
            position = self.positions.get((t, p), 0)
            _, high_watermark = self.final.ends.get((t, p), (0, 0))
            if position > high_watermark:
                self.flag(
                    "phantom-offsets",
                    f"the database's position of {t}-{p} is {position}, past its high "
                    f"watermark {high_watermark}",
                    **place_details(t, p, position),
                    high_watermark=high_watermark,
                )
            lost, torn = [], []
            for o, value in sorted(offsets.items()):
                stored = (t, p, o) in at
                if o < position and not stored:
                    lost.append((t, p, o, value))
                elif o >= position and stored:
                    torn.append((t, p, o, value))
                elif o >= position:
                    unstored += 1
            if lost:
                self.flag(
                    "lost-write",
                    f"{len(lost)} committed input record(s) of {t}-{p} below the database's "
                    f"position {position} are not in the table, first {lost[0][3]!r} at "
                    f"offset {lost[0][2]}",
                    topic=t,
                    partition=p,
                    position=position,
                    missing=listed_rows(lost),
                )
            if torn:
                self.flag(
                    "torn-transaction",
                    f"{len(torn)} row(s) of {t}-{p} are in the table at or past the database's "
                    f"position {position}, first {torn[0][3]!r} at offset {torn[0][2]}",
                    topic=t,
                    partition=p,
                    position=position,
                    rows=listed_rows(torn),
                )
        return unstored
