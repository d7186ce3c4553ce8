"""A hypothesis state machine: random clients against one partition's producer state.

Producers send in-order batches, retries of earlier batches, gaps, stale epochs, local epoch
bumps, COMMIT/ABORT markers (also fencing ones), while the high watermark lags and snapshots
are taken and restored. Every outcome is compared with a small independent model of Kafka's
rules, and invariants are checked after every step: no sequence range accepted twice, the LSO
never passes an open transaction, a snapshot + replay equals the live state.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)
from tests.txn.producer_log import (
    T0,
    assert_restore_and_replay_match,
    data,
    marker_header,
    with_offset,
)

from onceflow.clock import ManualClock
from onceflow.log.producer_errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
    TxnError,
)
from onceflow.log.producer_state import (
    CompletedTxn,
    DuplicateBatch,
    OpenTxn,
    ProducerStateManager,
)
from onceflow.records.batch import BatchHeader

PIDS = (1, 2, 3)
pids = st.sampled_from(PIDS)


@dataclass
class Cached:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass
class ModelEntry:
    """The model's view of one producer on the partition (Kafka's rules, written plainly)."""

    epoch: int = -1
    cache: deque[Cached] = field(default_factory=lambda: deque(maxlen=5))
    open_first: int | None = None
    coordinator_epoch: int = -1


@dataclass
class Client:
    epoch: int = 0
    next_seq: int = 0
    sent: list[BatchHeader] = field(default_factory=list)  # accepted, current epoch


APPEND = "append"


class ProducerStateMachine(RuleBasedStateMachine):
    snapshots = Bundle("snapshots")

    @initialize()
    def setup(self) -> None:
        self.clock = ManualClock(T0)
        self.psm = ProducerStateManager(self.clock)
        self.log: list[tuple[BatchHeader, tuple[bool, int] | None]] = []
        self.end = 0
        self.hw = 0
        self.model: dict[int, ModelEntry] = {}
        self.completed: list[tuple[int, int]] = []  # (first offset, marker offset)
        self.clients = {pid: Client() for pid in PIDS}
        self.coordinator_epoch = 0
        self.accepted: dict[tuple[int, int], list[tuple[int, int]]] = {}

    # -- the model --------------------------------------------------------------------------

    def expect_append(self, h: BatchHeader) -> object:
        e = self.model.get(h.producer_id)
        if e is not None and e.epoch == h.producer_epoch:
            for c in e.cache:
                if (c.first_seq, c.last_seq) == (h.base_sequence, h.last_sequence):
                    return DuplicateBatch(c.first_offset, c.last_offset, c.timestamp)
        if e is not None and h.producer_epoch < e.epoch:
            return InvalidProducerEpochError
        if e is not None and e.epoch != -1:
            if h.producer_epoch != e.epoch:
                if h.base_sequence != 0:
                    return OutOfOrderSequenceError
            else:
                last = e.cache[-1].last_seq if e.cache else -1
                if h.base_sequence != last + 1:
                    return OutOfOrderSequenceError
        if e is not None and e.open_first is not None and not h.is_transactional:
            return InvalidTxnStateError
        return APPEND

    def model_append(self, h: BatchHeader) -> None:
        e = self.model.setdefault(h.producer_id, ModelEntry())
        if h.producer_epoch != e.epoch:
            e.cache.clear()
            e.epoch = h.producer_epoch
        e.cache.append(
            Cached(h.base_sequence, h.last_sequence, h.base_offset, h.last_offset, h.max_timestamp)
        )
        if h.is_transactional and e.open_first is None:
            e.open_first = h.base_offset

    def expect_marker(self, pid: int, epoch: int, coordinator_epoch: int) -> object:
        e = self.model.get(pid)
        if e is not None and epoch < e.epoch:
            return InvalidProducerEpochError
        if e is not None and e.coordinator_epoch > coordinator_epoch:
            return TransactionCoordinatorFencedError
        return APPEND

    def model_marker(
        self, pid: int, epoch: int, commit: bool, offset: int, coordinator_epoch: int
    ) -> CompletedTxn | None:
        e = self.model.setdefault(pid, ModelEntry())
        completed = None
        if e.open_first is not None:
            others = [
                m.open_first for p, m in self.model.items() if p != pid and m.open_first is not None
            ]
            lso = min(others) if others else offset + 1
            completed = CompletedTxn(pid, e.open_first, offset, not commit, lso)
            self.completed.append((e.open_first, offset))
            e.open_first = None
        if epoch != e.epoch:
            e.cache.clear()
            e.epoch = epoch
        e.coordinator_epoch = coordinator_epoch
        return completed

    # -- driving the manager as the broker does ---------------------------------------------

    def submit(self, h: BatchHeader) -> object:
        expected = self.expect_append(h)
        try:
            outcome: object = self.psm.check_append(h)
        except TxnError as exc:
            outcome = type(exc)
        if outcome is None:
            outcome = APPEND
        assert outcome == expected, (h, outcome, expected)
        if outcome is APPEND:
            assigned = with_offset(h, self.end)
            self.end = assigned.next_offset
            self.log.append((assigned, None))
            self.psm.on_append(assigned)
            self.model_append(assigned)
            ranges = self.accepted.setdefault((h.producer_id, h.producer_epoch), [])
            for first, last in ranges:  # no sequence accepted twice within an epoch
                assert h.last_sequence < first or h.base_sequence > last, (h, ranges)
            ranges.append((h.base_sequence, h.last_sequence))
        return outcome

    @rule(pid=pids, count=st.integers(1, 4), txn=st.booleans())
    def send_next(self, pid: int, count: int, txn: bool) -> None:
        c = self.clients[pid]
        h = data(pid, c.epoch, c.next_seq, count, txn=txn, ts=self.clock())
        if self.submit(h) is APPEND:
            c.next_seq += count
            c.sent.append(h)

    @rule(pid=pids, back=st.integers(0, 7))
    def retry(self, pid: int, back: int) -> None:
        c = self.clients[pid]
        if not c.sent:
            return
        i = max(0, len(c.sent) - 1 - back)
        original = c.sent[i]
        outcome = self.submit(original)
        entry = self.model[pid]
        if len(c.sent) - i <= 5 and entry.epoch == c.epoch:
            # one of the last five: acknowledged with its original offsets, not appended again
            assert isinstance(outcome, DuplicateBatch), outcome
            assigned = next(
                a
                for a, ctl in self.log
                if ctl is None
                and a.producer_id == pid
                and a.producer_epoch == c.epoch
                and a.base_sequence == original.base_sequence
            )
            assert (outcome.first_offset, outcome.last_offset) == (
                assigned.base_offset,
                assigned.last_offset,
            )

    @rule(pid=pids, gap=st.integers(1, 3), txn=st.booleans())
    def send_with_gap(self, pid: int, gap: int, txn: bool) -> None:
        c = self.clients[pid]
        outcome = self.submit(data(pid, c.epoch, c.next_seq + gap, txn=txn, ts=self.clock()))
        if outcome is APPEND:  # only an unknown producer may start anywhere
            c.next_seq += gap + 1

    @rule(pid=pids, txn=st.booleans())
    def send_stale_epoch(self, pid: int, txn: bool) -> None:
        c = self.clients[pid]
        if c.epoch > 0:
            known = self.model.get(pid)
            fenced = known is not None and known.epoch > c.epoch - 1
            outcome = self.submit(data(pid, c.epoch - 1, c.next_seq, txn=txn, ts=self.clock()))
            if fenced:
                assert outcome is InvalidProducerEpochError

    @rule(pid=pids, start_at_zero=st.booleans())
    def bump_epoch_locally(self, pid: int, start_at_zero: bool) -> None:
        c = self.clients[pid]
        c.epoch += 1
        c.next_seq = 0
        c.sent = []
        if not start_at_zero:
            outcome = self.submit(data(pid, c.epoch, 3, ts=self.clock()))
            if outcome is APPEND:
                c.next_seq = 4

    @rule(
        pid=pids,
        commit=st.booleans(),
        epoch_delta=st.sampled_from([-1, 0, 0, 1]),
        coordinator_delta=st.sampled_from([-1, 0, 0, 1]),
    )
    def write_marker(
        self, pid: int, commit: bool, epoch_delta: int, coordinator_delta: int
    ) -> None:
        c = self.clients[pid]
        epoch = max(0, c.epoch + epoch_delta)
        coordinator_epoch = max(0, self.coordinator_epoch + coordinator_delta)
        expected = self.expect_marker(pid, epoch, coordinator_epoch)
        try:
            self.psm.check_marker(pid, epoch, coordinator_epoch)
            outcome: object = APPEND
        except TxnError as exc:
            outcome = type(exc)
        assert outcome == expected
        if outcome is not APPEND:
            return
        offset, header = self.end, marker_header(self.end, pid, epoch, self.clock())
        self.log.append((header, (commit, coordinator_epoch)))
        self.end += 1
        completed = self.psm.on_marker(header, commit, coordinator_epoch)
        assert completed == self.model_marker(pid, epoch, commit, offset, coordinator_epoch)
        self.coordinator_epoch = max(self.coordinator_epoch, coordinator_epoch)
        if epoch != c.epoch:  # the coordinator fenced and bumped the producer
            c.epoch, c.next_seq, c.sent = epoch, 0, []

    @rule(ms=st.integers(0, 1000))
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(data=st.data())
    def advance_high_watermark(self, data: st.DataObject) -> None:
        self.hw = data.draw(st.integers(self.hw, self.end))

    @rule(target=snapshots)
    def take_snapshot(self) -> tuple[bytes, int]:
        return self.psm.snapshot(), len(self.log)

    @rule(snap=consumes(snapshots))
    def restart_from_snapshot(self, snap: tuple[bytes, int]) -> None:
        data_, length = snap
        restored, full = assert_restore_and_replay_match(
            data_, self.log, length, self.psm, self.clock
        )
        assert restored.snapshot() == full.snapshot() == self.psm.snapshot()
        self.psm = restored
        self.hw = self.end  # what a restart recovered is durable

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def lso_never_passes_an_unstable_transaction(self) -> None:
        if not hasattr(self, "psm"):
            return
        lso = self.psm.last_stable_offset(self.hw)
        unstable = [m.open_first for m in self.model.values() if m.open_first is not None]
        unstable += [first for first, marker in self.completed if marker >= self.hw]
        assert lso == min([*unstable, self.hw])
        assert self.psm.first_undecided_offset() == min(
            (m.open_first for m in self.model.values() if m.open_first is not None), default=None
        )

    @invariant()
    def open_transactions_and_epochs_match_the_model(self) -> None:
        if not hasattr(self, "psm"):
            return
        opened = sorted(
            (m.open_first, pid) for pid, m in self.model.items() if m.open_first is not None
        )
        assert [(t.first_offset, t.producer_id) for t in self.psm.open_transactions()] == opened
        assert all(isinstance(t, OpenTxn) for t in self.psm.open_transactions())
        for pid, m in self.model.items():
            described = self.psm.producer(pid)
            assert described is not None
            assert described.producer_epoch == m.epoch
            assert described.coordinator_epoch == m.coordinator_epoch
            cached = [(b.first_offset, b.last_offset) for b in self.psm.batch_metadata(pid)]
            assert cached == [(c.first_offset, c.last_offset) for c in m.cache]


TestProducerStateMachine = ProducerStateMachine.TestCase
TestProducerStateMachine.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None
)
