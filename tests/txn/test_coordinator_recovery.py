"""Crash recovery: loading any prefix of the log gives the state the coordinator had there.

A scripted scenario exercises every kind of record (producer id blocks, epoch bumps, fencing,
timeouts, producer id rotation, commits, aborts, expiration, failed writes). After each record
the live coordinator's durable state is snapshotted; then, for every prefix of the log, a new
coordinator replays it and must hold exactly that snapshot, report exactly its Prepare*
transactions as in doubt, and be able to finish them and carry on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from kio.schema.errors import ErrorCode
from tests.txn.coordinator_harness import Producer, SimulatedBroker

from onceflow.txn.coordinator import CoordinatorResult, MarkerJob, TransactionCoordinator
from onceflow.txn.transaction_log import (
    TransactionLogValue,
    decode_key,
    decode_producer_id_block_value,
    transaction_record,
)
from onceflow.txn.transaction_metadata import TransactionMetadata
from onceflow.txn.transaction_state import TransactionState

T = TypeVar("T")
S = TransactionState
T0 = ("topic", 0)
T1 = ("topic", 1)
CRAFTED_PRODUCER_ID = 1_000_000


@dataclass
class Snapshot:
    transactions: dict[str, TransactionMetadata]
    # Producer ids answered to clients so far (their records are durable).
    answered_producer_ids: set[int]


@dataclass
class RecordingBroker(SimulatedBroker):
    """Snapshots the durable state after every record it appends."""

    snapshots: list[Snapshot] = field(default_factory=list)
    answered: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.snapshots.append(Snapshot({}, set()))
        replay = self.coordinator.replay

        def replay_and_snapshot(key: bytes, value: bytes | None) -> None:
            replay(key, value)
            self.snapshots.append(
                Snapshot(dict(self.coordinator.transactions()), set(self.answered))
            )

        self.coordinator.replay = replay_and_snapshot  # type: ignore[method-assign]

    def write(self, result: CoordinatorResult[T]) -> T:
        response: Any = super().write(result)
        pid = getattr(response, "producer_id", -1)
        if getattr(response, "error", None) == ErrorCode.none and pid >= 0:
            self.answered.add(pid)
            # The answer goes out after the last record: the last snapshot includes it.
            self.snapshots[-1].answered_producer_ids.add(pid)
        return response


def run_scenario() -> RecordingBroker:
    b = RecordingBroker(
        config={"producer_id_block_size": 2, "transactional_id_expiration_ms": 100_000}
    )
    c = b.coordinator
    for _ in range(3):  # idempotent producers span two blocks
        assert b.write(c.init_producer_id(None, 1000)).error == ErrorCode.none

    a = b.new_producer("a")
    b.add(a, T0)
    b.add_offsets(a)
    assert b.end(a, True) == ErrorCode.none
    b.write_markers()

    z = b.new_producer("b")
    b.add(z, T1)
    assert b.end(z, False) == ErrorCode.none
    b.add(a, T1)  # a's second transaction while b's markers are pending
    b.write_markers()
    b.end(a, True)
    b.write_markers()

    fenced = b.new_producer("c")
    b.add(fenced, T0, T1)
    assert b.fail(c.add_partitions("c", fenced.producer_id, 0, [("x", 1)])) != ErrorCode.none
    assert b.init(Producer("c")).error == ErrorCode.concurrent_transactions  # fence + abort
    b.write_markers()
    assert b.init(Producer("c")).error == ErrorCode.none

    slow = b.new_producer("d", timeout_ms=500)
    b.add(slow, T0)
    b.clock.advance(501)
    for result in c.expire_timed_out():
        b.write(result)
    b.write_markers()

    # Epoch exhaustion: a producer near the end of its epochs, bumped into a new producer id.
    record = transaction_record(
        "e",
        TransactionLogValue(CRAFTED_PRODUCER_ID, 32765, 1000, S.EMPTY, frozenset(), b.clock(), -1),
    )
    b.write(CoordinatorResult([record], None))
    e = Producer("e", CRAFTED_PRODUCER_ID, 32765)
    assert b.init(e, kip360=True).producer_epoch == 32766
    rotated = b.init(e, kip360=True)
    assert rotated.producer_epoch == 0 and rotated.producer_id != CRAFTED_PRODUCER_ID
    # The KIP-360 retry of that rotation gets the same answer.
    assert b.init(Producer("e", CRAFTED_PRODUCER_ID, 32766), kip360=True) == rotated

    b.clock.advance(100_000)
    for result in c.expire_transactional_ids():
        b.write(result)
    b.new_producer("b")  # expired, then back with a new producer id

    f = b.new_producer("f")
    b.add(f, T0)
    b.add_offsets(f)
    b.end(f, True)  # left in PrepareCommit: in doubt at the end of the log
    g = b.new_producer("g")
    b.add(g, T1)
    b.end(g, False)
    b.tasks.clear()  # the crash comes before any marker is written
    h = b.new_producer("h")
    b.add(h, T0)  # left Ongoing
    assert len(b.snapshots) == len(b.log) + 1
    return b


SCENARIO = run_scenario()


def test_scenario_covers_every_durable_state() -> None:
    seen = {meta.state for snap in SCENARIO.snapshots for meta in snap.transactions.values()}
    assert seen == {s for s in S if s not in (S.DEAD, S.PREPARE_EPOCH_FENCE)}
    keys = [decode_key(k) for k, _ in SCENARIO.log]
    assert sum(1 for k in keys if type(k).__name__ == "ProducerIdBlockKey") >= 3
    assert any(v is None for _, v in SCENARIO.log)  # a tombstone


def _load(prefix: int) -> TransactionCoordinator:
    coordinator = TransactionCoordinator(SCENARIO.clock, **SCENARIO.config)
    for key, value in SCENARIO.log[:prefix]:
        coordinator.replay(key, value)
    return coordinator


def _expected_in_doubt(snapshot: Snapshot) -> list[MarkerJob]:
    return [
        MarkerJob(
            txn_id,
            meta.producer_id,
            meta.producer_epoch,
            meta.state is S.PREPARE_COMMIT,
            0,
            tuple(sorted(meta.partitions)),
        )
        for txn_id, meta in sorted(snapshot.transactions.items())
        if meta.state.is_prepare
    ]


@pytest.mark.parametrize("prefix", range(len(SCENARIO.log) + 1))
def test_loading_every_prefix_restores_that_state(prefix: int) -> None:
    snapshot = SCENARIO.snapshots[prefix]
    coordinator = _load(prefix)
    assert coordinator.transactions() == snapshot.transactions
    assert coordinator.in_doubt() == _expected_in_doubt(snapshot)
    # Loading is idempotent with respect to describe/list as well.
    ids = sorted(snapshot.transactions)
    assert [d.state for d in coordinator.describe(ids)] == [
        snapshot.transactions[i].state.kafka_name for i in ids
    ]

    # Carry on after the crash: finish what is in doubt, then every id can be initialised.
    broker = SimulatedBroker(clock=SCENARIO.clock, config=SCENARIO.config)
    broker.log = list(SCENARIO.log[:prefix])
    broker.restart()
    broker.write_markers()
    for job in coordinator.in_doubt():
        meta = broker.coordinator.get(job.transactional_id)
        assert meta is not None
        assert meta.state is (S.COMPLETE_COMMIT if job.commit else S.COMPLETE_ABORT)
    for txn_id, before in snapshot.transactions.items():
        response = broker.init(Producer(txn_id))
        if before.state is S.ONGOING:
            assert response.error == ErrorCode.concurrent_transactions
            broker.write_markers()
            response = broker.init(Producer(txn_id))
        assert response.error == ErrorCode.none
        assert (response.producer_id, response.producer_epoch) > (-1, -1)
        if response.producer_id == before.producer_id:
            assert response.producer_epoch > before.producer_epoch
    # No producer id answered before the crash is ever handed out again.
    fresh = {broker.init(Producer(f"new-{i}")).producer_id for i in range(3)}
    fresh |= {broker.write(broker.coordinator.init_producer_id(None, 1000)).producer_id}
    assert not fresh & snapshot.answered_producer_ids
    assert not fresh & {m.producer_id for m in snapshot.transactions.values()}


def test_in_doubt_at_the_end_of_the_scenario() -> None:
    coordinator = _load(len(SCENARIO.log))
    assert [(j.transactional_id, j.commit) for j in coordinator.in_doubt()] == [
        ("f", True),
        ("g", False),
    ]
    (f_job, g_job) = coordinator.in_doubt()
    assert f_job.partitions == (("__consumer_offsets", 0), T0)
    assert g_job.partitions == (T1,)


def test_block_records_in_the_log_cover_every_answered_id() -> None:
    ends = [
        decode_producer_id_block_value(v).end
        for k, v in SCENARIO.log
        if v is not None and type(decode_key(k)).__name__ == "ProducerIdBlockKey"
    ]
    allocated = SCENARIO.answered - {CRAFTED_PRODUCER_ID}
    assert allocated and all(pid < max(ends) for pid in allocated)
