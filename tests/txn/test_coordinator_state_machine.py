"""Random client requests, record-write failures, lost answers, timeouts and crashes against the
transaction coordinator, checking the exactly-once invariants:

- at most one client instance per transactional id holds the live (producer id, epoch);
- epochs never go down: per producer id the durable epoch only grows, a new producer id is one
  never handed out before, and answers to InitProducerId never go back;
- a decision is never reversed: after PrepareCommit the next record of that id is
  CompleteCommit (likewise for abort), across crashes;
- after a crash the reloaded state equals the state before it, and in_doubt() is exactly the
  set of transactional ids whose last durable record is Prepare*;
- a transactional id has a pending transition exactly while a result of it is in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from kio.schema.errors import ErrorCode
from tests.txn.coordinator_harness import SimulatedBroker

from onceflow.clock import ManualClock
from onceflow.txn.coordinator import CoordinatorResult, TransactionCoordinator
from onceflow.txn.transaction_log import (
    ProducerIdBlockKey,
    TransactionLogValue,
    decode_key,
    decode_value,
)
from onceflow.txn.transaction_state import TransactionState

S = TransactionState
TXN_IDS = ("t0", "t1", "t2")
INSTANCES = (0, 1, 2)
PARTITIONS = (("a", 0), ("a", 1), ("b", 0))
CONFIG = {
    "transaction_max_timeout_ms": 10_000,
    "transactional_id_expiration_ms": 40_000,
    "producer_id_block_size": 3,
}

txn_ids = st.sampled_from(TXN_IDS)
# Mostly the instance holding the live epoch (progress), else any (zombies, strangers).
instances = st.sampled_from(["live", "live", "live", *INSTANCES])
indexes = st.integers(0, 1000)
write_outcomes = st.sampled_from(["ok"] * 6 + ["later", "later", "fail", "lost answer"])


@dataclass
class Client:
    producer_id: int = -1
    producer_epoch: int = -1

    @property
    def identity(self) -> tuple[int, int]:
        return self.producer_id, self.producer_epoch


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        # The broker's coordinator runtime over in-memory logs; every record that becomes
        # durable is checked first.
        self.broker = SimulatedBroker(self.clock, CONFIG)
        self.broker.on_durable = lambda record: self.check_record(*record)
        # The transactional id of each write held by the broker (not yet durable), in order.
        self.in_flight: list[str | None] = []
        self.clients = {(t, i): Client() for t in TXN_IDS for i in INSTANCES}
        # Who a producer id was handed to (a transactional id, or "idempotent").
        self.pid_owner: dict[int, str] = {}
        self.last_answered: dict[str, tuple[int, int]] = {}
        self.last_record: dict[str, TransactionLogValue | None] = {}

    @property
    def coordinator(self) -> TransactionCoordinator:
        return self.broker.coordinator

    # -- the broker's part ------------------------------------------------------------------

    def with_outcome(
        self, outcome: str, transactional_id: str | None, run: Callable[[], None]
    ) -> None:
        """Run `run` (which may append) with the append failing, held until a later
        complete_a_write, or durable at once."""
        broker = self.broker
        broker.hold = outcome == "later"
        broker.fail_appends = 1 if outcome == "fail" else 0
        held = len(broker.held)
        try:
            run()
        finally:
            broker.hold = False
            broker.fail_appends = 0
        if len(broker.held) > held:
            self.in_flight.append(transactional_id)

    def submit(
        self, result: CoordinatorResult[Any], outcome: str, on_answer: Callable[[Any], None]
    ) -> None:
        """Hand a result to the broker's runtime, as a handler does: answered at once if it has
        nothing to write; else its append fails now, or it is durable now (its answer maybe
        lost on the way), or it is held for later."""
        if not result.records:
            assert result.transactional_id is None and result.markers is None
        respond = (lambda _r: None) if outcome == "lost answer" else on_answer
        self.with_outcome(
            outcome,
            result.transactional_id,
            lambda: self.broker.runtime.run(result, respond, lambda _error: None),
        )

    @rule(index=indexes)
    def complete_a_write(self, index: int) -> None:
        if self.in_flight:
            i = index % len(self.in_flight)
            self.in_flight.pop(i)
            self.broker.release(i)

    @rule(index=indexes)
    def fire_a_timer(self, index: int) -> None:
        """The held-request bound passes (the client is answered, the write goes on), or a
        marker retry comes."""
        if self.broker.timers:
            label, callback = self.broker.timers.pop(index % len(self.broker.timers))
            event(f"timer: {label}")
            callback()

    def check_record(self, key: bytes, raw: bytes | None) -> None:
        parsed = decode_key(key)
        if isinstance(parsed, ProducerIdBlockKey):
            return
        txn_id = parsed.transactional_id
        new = None if raw is None else decode_value(raw)
        event(f"wrote {'tombstone' if new is None else new.state.kafka_name}")
        previous = self.last_record.get(txn_id)
        if previous is not None and previous.state.is_prepare:
            # The decision point: only its completion may follow.
            completes = {S.PREPARE_COMMIT: S.COMPLETE_COMMIT, S.PREPARE_ABORT: S.COMPLETE_ABORT}
            assert new is not None and new.state is completes[previous.state]
            assert (new.producer_id, new.producer_epoch) == (
                previous.producer_id,
                previous.producer_epoch,
            )
        if new is not None:
            if previous is not None and new.producer_id == previous.producer_id:
                assert new.producer_epoch >= previous.producer_epoch
            else:
                assert self.pid_owner.get(new.producer_id, txn_id) == txn_id
                self.pid_owner[new.producer_id] = txn_id
        self.last_record[txn_id] = new

    @rule(index=indexes, outcome=write_outcomes)
    def write_markers(self, index: int, outcome: str) -> None:
        """One marker job runs: markers, then Complete* (appended as `outcome` says; a failed
        append is retried by the runtime after a pause, a timer here)."""
        tasks = self.broker.tasks
        if not tasks:
            return
        _, task = tasks.pop(index % len(tasks))
        # Held, it is the markers that wait; Complete* follows once they are durable.
        self.with_outcome(outcome, None, task)

    @rule()
    def crash_and_reload(self) -> None:
        before = dict(self.coordinator.transactions())
        self.in_flight.clear()
        self.broker.restart()
        assert self.coordinator.transactions() == before
        prepared = {
            txn_id
            for txn_id, value in self.last_record.items()
            if value is not None and value.state.is_prepare
        }
        in_doubt = self.coordinator.in_doubt()
        event(f"crash with {'some' if in_doubt else 'no'} transaction in doubt")
        assert {job.transactional_id for job in in_doubt} == prepared
        assert self.broker.marker_queue == in_doubt
        for job in in_doubt:
            value = self.last_record[job.transactional_id]
            assert value is not None
            assert job.commit is (value.state is S.PREPARE_COMMIT)
            assert job.partitions == tuple(sorted(value.partitions))

    @rule(cut=st.integers(min_value=0), drop_tombstones=st.booleans())
    def compact_the_log_and_reload(self, cut: int, drop_tombstones: bool) -> None:
        """The log cleaner's round on the transaction log (the broker compacts it while it
        runs): below the clean point only the last record of each key stays (a tombstone past
        delete.retention.ms goes too), nothing after it changes; then a crash: the compacted
        log loads to the same transactions and the same ones in doubt."""
        log = self.broker.log
        end = cut % (len(log) + 1)
        last = {key: i for i, (key, _) in enumerate(log[:end])}
        kept = [
            (key, value)
            for i, (key, value) in enumerate(log[:end])
            if last[key] == i and not (drop_tombstones and value is None)
        ]
        event(f"{end} records compacted to {len(kept)}")
        self.broker.log = kept + log[end:]
        self.crash_and_reload()

    # -- clients ----------------------------------------------------------------------------

    def client(self, txn_id: str, instance: int | str) -> Client:
        if instance == "live":
            meta = self.coordinator.get(txn_id)
            for i in INSTANCES:
                if meta is not None and self.clients[txn_id, i].identity == (
                    meta.producer_id,
                    meta.producer_epoch,
                ):
                    return self.clients[txn_id, i]
            instance = 0
        return self.clients[txn_id, int(instance)]

    def answered_init(self, txn_id: str, client: Client, response: Any) -> None:
        if response.error != ErrorCode.none:
            return
        identity = (response.producer_id, response.producer_epoch)
        last = self.last_answered.get(txn_id)
        if last is not None and last[0] == identity[0]:
            assert identity[1] >= last[1]
        assert self.pid_owner.get(identity[0], txn_id) == txn_id
        self.last_answered[txn_id] = identity
        client.producer_id, client.producer_epoch = identity

    @rule(
        txn_id=txn_ids,
        instance=instances,
        kip360=st.booleans(),
        timeout=st.sampled_from([2_000, 10_000, 10_000, 10_000, 10_000, 10_001]),
        outcome=write_outcomes,
    )
    def init_producer_id(
        self, txn_id: str, instance: int | str, kip360: bool, timeout: int, outcome: str
    ) -> None:
        client = self.client(txn_id, instance)
        expected = client.identity if kip360 else (-1, -1)
        result = self.coordinator.init_producer_id(txn_id, timeout, *expected)
        if timeout > CONFIG["transaction_max_timeout_ms"]:
            assert result.response.error == ErrorCode.invalid_transaction_timeout
        self.submit(result, outcome, lambda r: self.answered_init(txn_id, client, r))

    @rule(outcome=write_outcomes)
    def init_idempotent(self, outcome: str) -> None:
        def answered(response: Any) -> None:
            assert response.error == ErrorCode.none and response.producer_epoch == 0
            assert response.producer_id not in self.pid_owner
            self.pid_owner[response.producer_id] = "idempotent"

        self.submit(self.coordinator.init_producer_id(None, 1000), outcome, answered)

    def assert_live(self, txn_id: str, client: Client) -> None:
        meta = self.coordinator.get(txn_id)
        assert meta is not None and (meta.producer_id, meta.producer_epoch) == client.identity

    @rule(
        txn_id=txn_ids,
        instance=instances,
        partitions=st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=3),
        outcome=write_outcomes,
    )
    def add_partitions(
        self, txn_id: str, instance: int | str, partitions: list[Any], outcome: str
    ) -> None:
        client = self.client(txn_id, instance)
        result = self.coordinator.add_partitions(txn_id, *client.identity, partitions)

        def answered(response: dict[Any, ErrorCode]) -> None:
            if all(error == ErrorCode.none for error in response.values()):
                self.assert_live(txn_id, client)
                meta = self.coordinator.get(txn_id)
                assert meta is not None and meta.state is S.ONGOING
                assert meta.partitions.issuperset(partitions)

        self.submit(result, outcome, answered)

    @rule(txn_id=txn_ids, instance=instances, outcome=write_outcomes)
    def add_offsets(self, txn_id: str, instance: int | str, outcome: str) -> None:
        client = self.client(txn_id, instance)
        result = self.coordinator.add_offsets(txn_id, *client.identity, "group")

        def answered(response: ErrorCode) -> None:
            if response == ErrorCode.none:
                self.assert_live(txn_id, client)

        self.submit(result, outcome, answered)

    @rule(txn_id=txn_ids, instance=instances, commit=st.booleans(), outcome=write_outcomes)
    def end_txn(self, txn_id: str, instance: int | str, commit: bool, outcome: str) -> None:
        client = self.client(txn_id, instance)
        result = self.coordinator.end_txn(txn_id, *client.identity, commit)

        def answered(response: ErrorCode) -> None:
            if response == ErrorCode.none:
                self.assert_live(txn_id, client)
                meta = self.coordinator.get(txn_id)
                assert meta is not None
                decided = (
                    (S.PREPARE_COMMIT, S.COMPLETE_COMMIT)
                    if commit
                    else (S.PREPARE_ABORT, S.COMPLETE_ABORT)
                )
                assert meta.state in decided

        self.submit(result, outcome, answered)

    @initialize()
    def start_every_transactional_id(self) -> None:
        for txn_id in TXN_IDS:
            self.init_producer_id(txn_id, 0, kip360=False, timeout=10_000, outcome="ok")

    @rule(
        txn_id=txn_ids,
        partitions=st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=3),
        offsets=st.booleans(),
        commit=st.booleans(),
        add_outcome=write_outcomes,
        end_outcome=write_outcomes,
    )
    def whole_transaction(
        self,
        txn_id: str,
        partitions: list[Any],
        offsets: bool,
        commit: bool,
        add_outcome: str,
        end_outcome: str,
    ) -> None:
        """The live instance runs a transaction (so that random runs get far enough)."""
        self.add_partitions(txn_id, "live", partitions, add_outcome)
        if offsets:
            self.add_offsets(txn_id, "live", add_outcome)
        self.end_txn(txn_id, "live", commit, end_outcome)

    @rule(txn_id=txn_ids, instance=instances, partition=st.sampled_from(PARTITIONS))
    def verify_produce(self, txn_id: str, instance: int | str, partition: tuple[str, int]) -> None:
        client = self.client(txn_id, instance)
        error = self.coordinator.is_in_transaction(txn_id, *client.identity, *partition)
        if error == ErrorCode.none:
            self.assert_live(txn_id, client)
            meta = self.coordinator.get(txn_id)
            assert meta is not None and meta.state is S.ONGOING
            assert partition in meta.partitions

    # -- time and operators -----------------------------------------------------------------

    @rule(ms=st.integers(0, 4_000), outcome=write_outcomes)
    def abort_timed_out(self, ms: int, outcome: str) -> None:
        self.clock.advance(ms)
        for result in self.coordinator.expire_timed_out():
            assert result.markers is not None and not result.markers.commit
            self.submit(result, outcome, lambda r: None)

    @rule(ms=st.integers(0, 30_000), outcome=write_outcomes)
    def expire_transactional_ids(self, ms: int, outcome: str) -> None:
        self.clock.advance(ms)
        for result in self.coordinator.expire_transactional_ids():
            self.submit(result, outcome, lambda r: None)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def at_most_one_live_instance(self) -> None:
        for txn_id in TXN_IDS:
            meta = self.coordinator.get(txn_id)
            if meta is None:
                continue
            live = [
                i
                for i in INSTANCES
                if self.clients[txn_id, i].identity == (meta.producer_id, meta.producer_epoch)
            ]
            assert len(live) <= 1, (txn_id, live)

    @invariant()
    def pending_exactly_while_in_flight(self) -> None:
        in_flight = set(self.in_flight) - {None}
        assert {t for t in TXN_IDS if self.coordinator.has_pending(t)} == in_flight

    @invariant()
    def durable_state_is_the_last_record(self) -> None:
        for txn_id in TXN_IDS:
            value = self.last_record.get(txn_id)
            meta = self.coordinator.get(txn_id)
            assert (None if meta is None else meta.to_log_value()) == value


CoordinatorMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_coordinator_state_machine = CoordinatorMachine.TestCase
