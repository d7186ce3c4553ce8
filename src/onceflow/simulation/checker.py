"""The invariants, checked as the simulation runs, after every crash and at the end.

The checker does not trust the cores' own bookkeeping: it audits each log as a separate,
simple model (values, epochs, open and closed transactions), reads partitions as a
read_committed Kafka consumer does (aborted transactions dropped from their first offset to
their ABORT marker), and judges what it reads by what the clients know of their transactions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from onceflow.log.unified_log import FetchIsolation, UnifiedLog
from onceflow.records.batch import iter_batches
from onceflow.records.control import ControlType, parse_control_record
from onceflow.simulation.messages import (
    AddOffsets,
    AddPartitions,
    Answer,
    EndTxn,
    InitProducerId,
    TopicPartition,
    TxnOffsetCommit,
    TxnRecord,
)
from onceflow.simulation.storage import SimulatedLog, StoredBatch


class InvariantViolation(AssertionError):
    """An exactly-once guarantee broke; the message says which, where and with what values."""


def encode_value(value_id: int) -> bytes:
    return b"%d" % value_id


def decode_value(raw: bytes | None) -> int:
    if raw is None or not raw.isdigit():
        raise InvariantViolation(f"a record value {raw!r} no simulated client wrote")
    return int(raw)


@dataclass
class ValueInfo:
    """Who wrote a value: a transaction, or an idempotent producer (txn None)."""

    client: str
    partition: TopicPartition
    txn: TxnRecord | None
    acked_offset: int | None = None


@dataclass
class PartitionAudit:
    """An independent model of one partition's log, fed batch by batch in log order."""

    tp: TopicPartition
    values: dict[int, int] = field(default_factory=dict)  # value -> offset
    epochs: dict[int, int] = field(default_factory=dict)  # producer id -> highest epoch seen
    open: dict[int, tuple[int, set[int]]] = field(default_factory=dict)  # pid -> first, epochs
    # (first offset, marker offset) of closed transactions, by marker offset
    closed: list[tuple[int, int]] = field(default_factory=list)
    end: int = 0
    # Whether a value's writer ends its transactions with an epoch bump (transactions version
    # 2): its commit marker then carries the epoch after its batches'.
    bumps: Callable[[int], bool] = lambda _value: False
    bumping: set[int] = field(default_factory=set)  # producer ids whose open txn bumps

    def add(self, stored: StoredBatch) -> None:
        header = stored.header
        if header.base_offset != self.end:
            raise InvariantViolation(
                f"{self.tp}: batch at {header.base_offset} does not follow the log end {self.end}"
            )
        self.end = header.next_offset
        pid, epoch = header.producer_id, header.producer_epoch
        if pid >= 0:
            if epoch < self.epochs.get(pid, -1):
                raise InvariantViolation(
                    f"{self.tp}: producer {pid} appended epoch {epoch} at {header.base_offset} "
                    f"after epoch {self.epochs[pid]}: a fenced producer wrote again"
                )
            self.epochs[pid] = epoch
        if header.is_control:
            control, _ = parse_control_record(stored.decoded.records[0])
            txn = self.open.pop(pid, None)
            if txn is None:
                return
            first, epochs = txn
            written = epoch - 1 if pid in self.bumping else epoch
            self.bumping.discard(pid)
            if control == ControlType.COMMIT and epochs != {written}:
                raise InvariantViolation(
                    f"{self.tp}: transaction of producer {pid} from offset {first} committed at "
                    f"{header.base_offset} with epoch {epoch} holds batches of epochs "
                    f"{sorted(epochs)}: a zombie's data was committed"
                )
            self.closed.append((first, header.base_offset))
            return
        for record in stored.decoded.records:
            value = decode_value(record.value)
            if value in self.values:
                raise InvariantViolation(
                    f"{self.tp}: value {value} appended twice, at offsets {self.values[value]} "
                    f"and {record.offset}: a retried batch was duplicated"
                )
            self.values[value] = record.offset
        if header.is_transactional:
            if pid not in self.open and any(
                self.bumps(decode_value(r.value)) for r in stored.decoded.records
            ):
                self.bumping.add(pid)
            first, epochs = self.open.get(pid, (header.base_offset, set()))
            epochs.add(epoch)
            self.open[pid] = (first, epochs)

    def first_unstable(self, high_watermark: int) -> int | None:
        """First offset of a transaction whose marker is not yet below the high watermark.

        Transactions whose marker is below it are forgotten: the high watermark never goes
        down (check_partitions checks it), so they never count again."""
        if self.closed and self.closed[0][1] < high_watermark:
            self.closed = [t for t in self.closed if t[1] >= high_watermark]
        firsts = [first for first, _ in self.open.values()]
        firsts += [first for first, _ in self.closed]
        return min(firsts, default=None)


def audit_log(
    tp: TopicPartition, log: SimulatedLog, bumps: Callable[[int], bool] | None = None
) -> PartitionAudit:
    audit = PartitionAudit(tp, end=log.log_start_offset)
    if bumps is not None:
        audit.bumps = bumps
    for stored in log.iter_stored(0):
        audit.add(stored)
    return audit


@dataclass(frozen=True)
class ReadRecord:
    offset: int
    value: int


def read_committed(
    partition: UnifiedLog, fetch_offset: int, max_bytes: int
) -> tuple[list[ReadRecord], int]:
    """A read_committed Fetch as `broker.handlers.fetch` answers it (`UnifiedLog.read`, the
    response's first partition), consumed as Kafka's consumer does: (records handed to the
    application, next fetch offset)."""
    if fetch_offset >= partition.last_stable_offset:
        return [], fetch_offset
    info = partition.read(fetch_offset, max_bytes, FetchIsolation.TXN_COMMITTED, min_one=True)
    assert info.aborted_transactions is not None
    aborted = sorted(info.aborted_transactions, key=lambda a: a[1])
    # the offset after the last batch returned
    end = fetch_offset
    for _, header in iter_batches(info.records, verify_crc=False):
        end = header.next_offset
    log = partition.log
    assert isinstance(log, SimulatedLog)
    aborted_producers: set[int] = set()
    out: list[ReadRecord] = []
    next_offset = fetch_offset
    for stored in _batches_in(log, fetch_offset, end):
        header = stored.header
        next_offset = header.next_offset
        while aborted and aborted[0][1] <= header.last_offset:
            aborted_producers.add(aborted.pop(0)[0])
        if header.is_control:
            control, _ = parse_control_record(stored.decoded.records[0])
            if control == ControlType.ABORT:
                aborted_producers.discard(header.producer_id)
            continue
        if header.is_transactional and header.producer_id in aborted_producers:
            continue
        for record in stored.decoded.records:
            if record.offset >= fetch_offset:
                out.append(ReadRecord(record.offset, decode_value(record.value)))
    return out, next_offset


def _batches_in(log: SimulatedLog, start: int, end: int) -> Iterable[StoredBatch]:
    # the batches Fetch returned: the read's bytes are whole stored batches from `start`
    for stored in log.iter_stored(start):
        if stored.header.base_offset >= end:
            break
        yield stored


class Checker:
    """The books of the simulation: values, transactions, what was read, what was handed out."""

    def __init__(self) -> None:
        self.values: dict[int, ValueInfo] = {}
        self.txns: list[TxnRecord] = []
        self.offset_owner: dict[tuple[str, int], TxnRecord] = {}
        self.audits: dict[TopicPartition, PartitionAudit] = {}
        # producer id -> highest epoch InitProducerId has answered for a transactional id
        self.issued: dict[int, int] = {}
        self.lso: dict[TopicPartition, int] = {}
        self.hw: dict[TopicPartition, int] = {}
        # What each partition was last checked at: (partition, log end, high watermark). Its
        # last stable offset and the audit change only with one of them.
        self._checked: dict[TopicPartition, tuple[UnifiedLog, int, int]] = {}
        self.reader_position: dict[TopicPartition, int] = {}
        self.read: dict[TopicPartition, list[ReadRecord]] = {}
        self.read_values: set[int] = set()
        self.committed_offsets: dict[str, int] = {}
        self.coordinator_epochs: dict[str, tuple[int, int]] = {}
        self.lines: list[str] = []
        self.tracing = False

    # -- BrokerObserver --------------------------------------------------------------------

    def trace(self, line: str) -> None:
        if self.tracing:
            self.lines.append(line)
            print(line, flush=True)

    def appended(self, tp: TopicPartition, batches: list[StoredBatch]) -> None:
        audit = self.audits[tp]
        for stored in batches:
            header = stored.header
            if not header.is_control and header.producer_id in self.issued:
                issued = self.issued[header.producer_id]
                if header.producer_epoch < issued:
                    raise InvariantViolation(
                        f"{tp}: producer {header.producer_id} epoch {header.producer_epoch} "
                        f"appended at {header.base_offset} after InitProducerId handed out epoch "
                        f"{issued}: two live epochs for one transactional id"
                    )
            audit.add(stored)

    def answered(self, request: object, answer: Answer) -> None:
        if isinstance(request, InitProducerId):
            if request.transactional_id is not None and answer.error == ErrorCode.none:
                pid, epoch = answer.value
                self.issued[pid] = max(self.issued.get(pid, -1), epoch)
            return
        ok = answer.error == ErrorCode.none
        if isinstance(request, TxnOffsetCommit) and request.txn is not None and ok:
            request.txn.offsets_pending = True
        if isinstance(request, EndTxn) and request.transaction_version >= 2 and ok:
            # Version 2: the answer hands out the bumped epoch (or the next producer id). A
            # retried EndTxn presents the epoch before the bump it was answered with.
            pid, epoch = answer.value
            self.issued[pid] = max(self.issued.get(pid, -1), epoch)
            bumped = pid == request.producer_id and epoch == request.producer_epoch + 1
            if bumped or (pid != request.producer_id and epoch == 0):
                return  # the bump (or the new producer id) of this very request's epoch
        if isinstance(request, AddPartitions | AddOffsets | TxnOffsetCommit | EndTxn):
            issued = self.issued.get(request.producer_id, -1)
            if answer.error == ErrorCode.none and request.producer_epoch < issued:
                raise InvariantViolation(
                    f"{type(request).__name__} of {request.transactional_id} with epoch "
                    f"{request.producer_epoch} succeeded after epoch {issued} was handed out"
                )

    # -- books -----------------------------------------------------------------------------

    def new_value(self, client: str, tp: TopicPartition, txn: TxnRecord | None) -> int:
        value = len(self.values)
        self.values[value] = ValueInfo(client, tp, txn)
        return value

    # -- after each step -------------------------------------------------------------------

    def check_partitions(self, partitions: dict[TopicPartition, UnifiedLog]) -> None:
        for tp, partition in partitions.items():
            hw = partition.high_watermark
            seen = (partition, partition.log.log_end_offset, hw)
            if self._checked.get(tp) == seen:
                continue
            self._checked[tp] = seen
            lso = partition.last_stable_offset
            if lso > hw:
                raise InvariantViolation(
                    f"{tp}: last stable offset {lso} above the high watermark {hw}"
                )
            if hw < self.hw.get(tp, 0):
                raise InvariantViolation(
                    f"{tp}: high watermark went down from {self.hw[tp]} to {hw}"
                )
            if lso < self.lso.get(tp, 0):
                raise InvariantViolation(
                    f"{tp}: last stable offset went down from {self.lso[tp]} to {lso}"
                )
            unstable = self.audits[tp].first_unstable(hw)
            if unstable is not None and lso > unstable:
                raise InvariantViolation(
                    f"{tp}: last stable offset {lso} passes the transaction open at {unstable}"
                )
            self.hw[tp], self.lso[tp] = hw, lso

    def check_coordinator(self, transactions: dict[str, tuple[int, int]]) -> None:
        for txn_id, (pid, epoch) in transactions.items():
            before = self.coordinator_epochs.get(txn_id)
            if before is not None and before[0] == pid and epoch < before[1]:
                raise InvariantViolation(
                    f"{txn_id}: producer {pid} epoch went down from {before[1]} to {epoch}"
                )
            self.coordinator_epochs[txn_id] = (pid, epoch)

    def poll(
        self, partitions: dict[TopicPartition, UnifiedLog], tp: TopicPartition, max_bytes: int
    ) -> int:
        """One read_committed poll of `tp`; returns how many records it handed out."""
        position = self.reader_position.get(tp, 0)
        records, next_offset = read_committed(partitions[tp], position, max_bytes)
        for record in records:
            self._judge_read(tp, record)
        self.reader_position[tp] = next_offset
        self.read.setdefault(tp, []).extend(records)
        return len(records)

    def _judge_read(self, tp: TopicPartition, record: ReadRecord) -> None:
        info = self.values.get(record.value)
        if info is None:
            raise InvariantViolation(f"{tp}: read value {record.value} that nobody wrote")
        if info.partition != tp:
            raise InvariantViolation(f"{tp}: read value {record.value} written to {info.partition}")
        if record.value in self.read_values:
            raise InvariantViolation(
                f"{tp}: read value {record.value} twice (offset {record.offset})"
            )
        self.read_values.add(record.value)
        txn = info.txn
        if txn is not None and not txn.commit_sent:
            raise InvariantViolation(
                f"{tp}: read_committed read value {record.value} at offset {record.offset} of "
                f"{txn.transactional_id} transaction #{txn.txn_no} ({txn.outcome}), which was "
                "never committed: an aborted or uncommitted read"
            )
        if info.acked_offset is not None and info.acked_offset != record.offset:
            raise InvariantViolation(
                f"{tp}: value {record.value} read at {record.offset}, acknowledged at "
                f"{info.acked_offset}"
            )

    def check_offsets(self, group: str, committed: int | None, stable: object) -> None:
        """A committed offset is visible only once its transaction committed; never backwards."""
        if committed is None or committed < 0:
            if group in self.committed_offsets:
                raise InvariantViolation(
                    f"group {group}: committed offset {self.committed_offsets[group]} vanished"
                )
            return
        txn = self.offset_owner.get((group, committed))
        if txn is None:
            raise InvariantViolation(f"group {group}: offset {committed} nobody committed")
        if not txn.commit_sent:
            raise InvariantViolation(
                f"group {group}: offset {committed} of {txn.transactional_id} transaction "
                f"#{txn.txn_no} ({txn.outcome}) is visible, but it was never committed"
            )
        previous = self.committed_offsets.get(group, -1)
        if committed < previous:
            raise InvariantViolation(
                f"group {group}: committed offset went back from {previous} to {committed}"
            )
        self.committed_offsets[group] = committed
        if stable is not None and stable != committed:
            raise InvariantViolation(
                f"group {group}: require_stable answered {stable}, the committed offset is "
                f"{committed}"
            )

    # -- after a crash ---------------------------------------------------------------------

    def check_durable_reads(self, partitions: dict[TopicPartition, UnifiedLog]) -> None:
        """Whatever a reader saw, and every acknowledged write, is still where it was."""
        for tp, records in self.read.items():
            audit = self.audits[tp]
            for record in records:
                if audit.values.get(record.value) != record.offset:
                    raise InvariantViolation(
                        f"{tp}: value {record.value} read at offset {record.offset} is gone "
                        "after a crash"
                    )
            if self.reader_position.get(tp, 0) > partitions[tp].high_watermark:
                raise InvariantViolation(
                    f"{tp}: the reader's position is past the log after a crash"
                )
        for value, info in self.values.items():
            if info.acked_offset is None:
                continue
            found = self.audits[info.partition].values.get(value)
            if found != info.acked_offset:
                raise InvariantViolation(
                    f"{info.partition}: acknowledged value {value} at offset {info.acked_offset} "
                    f"is {'gone' if found is None else f'at {found}'} after a crash"
                )

    def rebuild_audits(self, logs: dict[TopicPartition, SimulatedLog]) -> None:
        self.audits = {tp: audit_log(tp, log, self._bumps) for tp, log in logs.items()}

    def _bumps(self, value: int) -> bool:
        info = self.values.get(value)
        return info is not None and info.txn is not None and info.txn.transaction_version >= 2
        self._checked.clear()

    # -- at the end ------------------------------------------------------------------------

    def check_final(self, partitions: dict[TopicPartition, UnifiedLog]) -> None:
        visible: dict[int, int] = {}
        for tp, partition in partitions.items():
            if partition.last_stable_offset != partition.log.log_end_offset:
                raise InvariantViolation(
                    f"{tp}: last stable offset {partition.last_stable_offset} below the log end "
                    f"{partition.log.log_end_offset} with every transaction complete"
                )
            # a fresh read_committed consumer from the start, in small polls
            position = 0
            while position < partition.last_stable_offset:
                records, position_after = read_committed(partition, position, 1)
                if position_after == position:
                    raise InvariantViolation(f"{tp}: a read_committed read is stuck at {position}")
                position = position_after
                for record in records:
                    visible[record.value] = record.offset
        for txn in self.txns:
            acked = [v for v in txn.values if self.values[v].acked_offset is not None]
            seen = [v for v in acked if v in visible]
            if txn.outcome == "committed" and len(seen) != len(acked):
                missing = sorted(set(acked) - set(seen))
                raise InvariantViolation(
                    f"{txn.transactional_id} transaction #{txn.txn_no} committed, but its "
                    f"acknowledged values {missing} are not visible: lost writes"
                )
            if seen and not txn.commit_sent:
                raise InvariantViolation(
                    f"{txn.transactional_id} transaction #{txn.txn_no} ({txn.outcome}) has "
                    f"visible values {seen}"
                )
            if seen and len(seen) != len(acked):
                raise InvariantViolation(
                    f"{txn.transactional_id} transaction #{txn.txn_no} is torn: {seen} of "
                    f"{acked} visible"
                )
        for value, info in self.values.items():
            acked = info.txn is None and info.acked_offset is not None
            if acked and visible.get(value) != info.acked_offset:
                raise InvariantViolation(
                    f"{info.partition}: acknowledged idempotent value {value} at "
                    f"{info.acked_offset} is not visible: a lost write"
                )

    def check_final_offsets(self, group: str, committed: int | None) -> None:
        txns = [t for (g, _), t in self.offset_owner.items() if g == group]
        acked = [t.offsets[group] for t in txns if t.outcome == "committed"]
        if not acked:
            return
        if committed is None or committed < max(acked):
            raise InvariantViolation(
                f"group {group}: committed offset {committed}, but the transaction that "
                f"committed offset {max(acked)} was acknowledged"
            )
