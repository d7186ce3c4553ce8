"""The coordinator's transactions version 2 (KIP-890 part 2) state machine.

An EndTxn v5 bumps the epoch at every commit or abort (markers carry the bumped epoch, the
answer names it), a retried EndTxn of the same end is answered as it was, a late write of the
ended transaction is fenced, the epoch's exhaustion moves the transaction to a new producer id,
and all of it is restored by loading the log after a crash, between any two steps.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode
from tests.txn.coordinator_harness import Producer, SimulatedBroker

from onceflow.clock import ManualClock
from onceflow.coordinator.coordinators import _Partitions
from onceflow.coordinator.result import MarkerJob
from onceflow.log.config import LogConfig
from onceflow.log.producer_errors import InvalidProducerEpochError
from onceflow.log.unified_log import UnifiedLog
from onceflow.log.verification_guard import VerificationGuard
from onceflow.records.builder import build_batch
from onceflow.txn.coordinator import EndTxnResponse
from onceflow.txn.transaction_log import (
    NO_PRODUCER_ID,
    TransactionLogValue,
    decode_value,
    transaction_record,
)
from onceflow.txn.transaction_metadata import MAX_PRODUCER_EPOCH
from onceflow.txn.transaction_state import TransactionState

S = TransactionState
T0 = ("topic", 0)
T1 = ("topic", 1)
V2 = 2


def add_v2(broker: SimulatedBroker, producer: Producer, *partitions: tuple[str, int]) -> ErrorCode:
    """The partition leader's add for a version 2 producer's Produce v12."""
    errors = broker.write(
        broker.coordinator.add_partitions(
            producer.transactional_id,
            producer.producer_id,
            producer.producer_epoch,
            list(partitions),
            client_transaction_version=V2,
        )
    )
    (error,) = set(errors.values())
    return error


def end_v2(
    broker: SimulatedBroker, producer: Producer, commit: bool, *, epoch: int | None = None
) -> EndTxnResponse:
    """EndTxn v5; on success the producer goes on with the answer's id and epoch."""
    answer = broker.write(
        broker.coordinator.end_transaction(
            producer.transactional_id,
            producer.producer_id,
            producer.producer_epoch if epoch is None else epoch,
            commit,
            client_transaction_version=V2,
        )
    )
    if answer.error == ErrorCode.none and epoch is None:
        producer.producer_id, producer.producer_epoch = answer.producer_id, answer.producer_epoch
    return answer


def started(broker: SimulatedBroker, txn_id: str = "txn") -> Producer:
    producer = broker.new_producer(txn_id)
    assert add_v2(broker, producer, T0, T1) == ErrorCode.none
    return producer


def at_epoch(broker: SimulatedBroker, producer: Producer, epoch: int) -> None:
    """The producer's ongoing transaction at `epoch`: a record as thousands of transactions
    would leave it, then a load (the replay accepts an epoch that grew)."""
    meta = broker.coordinator.get(producer.transactional_id)
    assert meta is not None and meta.state is S.ONGOING
    value = dataclasses.replace(meta.to_log_value(), producer_epoch=epoch)
    broker.log.append(transaction_record(producer.transactional_id, value))
    broker.restart()
    producer.producer_epoch = epoch


def last_record(broker: SimulatedBroker) -> tuple[int, int, int, int, S]:
    value = broker.log[-1][1]
    assert value is not None
    v = decode_value(value)
    return (
        v.producer_id,
        v.producer_epoch,
        v.next_producer_id,
        v.client_transaction_version,
        v.state,
    )


def test_commit_bumps_the_epoch_and_markers_carry_it() -> None:
    broker = SimulatedBroker()
    producer = started(broker)
    pid, epoch = producer.producer_id, producer.producer_epoch
    assert broker.coordinator.get("txn").client_transaction_version == V2  # type: ignore[union-attr]
    answer = end_v2(broker, producer, commit=True)
    assert answer == EndTxnResponse(ErrorCode.none, pid, epoch + 1)
    assert last_record(broker) == (pid, epoch + 1, NO_PRODUCER_ID, V2, S.PREPARE_COMMIT)
    [job] = broker.marker_queue
    assert (job.producer_id, job.producer_epoch, job.commit) == (pid, epoch + 1, True)
    broker.write_markers()
    assert last_record(broker) == (pid, epoch + 1, NO_PRODUCER_ID, V2, S.COMPLETE_COMMIT)
    # The next transaction, and its abort, bump again.
    assert add_v2(broker, producer, T0) == ErrorCode.none
    assert end_v2(broker, producer, commit=False) == EndTxnResponse(ErrorCode.none, pid, epoch + 2)


def test_a_retried_end_txn_is_answered_as_the_first() -> None:
    broker = SimulatedBroker()
    producer = started(broker)
    old = producer.producer_epoch
    end_v2(broker, producer, commit=True)
    # While the markers are written: retriable, as Kafka.
    assert end_v2(broker, producer, True, epoch=old).error == ErrorCode.concurrent_transactions
    broker.write_markers()
    retried = end_v2(broker, producer, True, epoch=old)
    assert retried == EndTxnResponse(ErrorCode.none, producer.producer_id, old + 1)
    assert end_v2(broker, producer, False, epoch=old).error == ErrorCode.invalid_txn_state
    # Older still: a zombie.
    assert end_v2(broker, producer, True, epoch=old - 1).error == ErrorCode.producer_fenced


def test_a_late_write_of_the_ended_transaction_is_fenced() -> None:
    broker = SimulatedBroker()
    producer = started(broker)
    old = producer.producer_epoch
    end_v2(broker, producer, commit=True)
    broker.write_markers()
    zombie = Producer(producer.transactional_id, producer.producer_id, old)
    # The leader's add of the late Produce v12, and KIP-890 part 1's check of an older client.
    assert add_v2(broker, zombie, T0) == ErrorCode.producer_fenced
    assert (
        broker.coordinator.is_in_transaction(
            "txn", producer.producer_id, old, *T0, produce_version=12
        )
        == ErrorCode.invalid_producer_epoch
    )
    assert broker.state("txn") == "CompleteCommit"
    assert add_v2(broker, producer, T0) == ErrorCode.none  # the new epoch's transaction


def test_abort_of_a_transaction_that_added_nothing() -> None:
    """A version 2 client whose Produce failed before the leader added the partition cannot
    know: it aborts, and the coordinator bumps the epoch with nothing to mark."""
    broker = SimulatedBroker()
    producer = started(broker)
    end_v2(broker, producer, commit=True)
    broker.write_markers()
    epoch = producer.producer_epoch
    assert end_v2(broker, producer, commit=True).error == ErrorCode.invalid_txn_state
    answer = end_v2(broker, producer, commit=False)
    assert answer == EndTxnResponse(ErrorCode.none, producer.producer_id, epoch + 1)
    broker.write_markers()
    assert broker.state("txn") == "CompleteAbort"


def test_exhausted_epoch_moves_to_a_new_producer_id() -> None:
    broker = SimulatedBroker()
    producer = started(broker)
    old_pid = producer.producer_id
    # Kafka never hands out Short.MaxValue: MAX - 1 is the last epoch a producer gets.
    at_epoch(broker, producer, MAX_PRODUCER_EPOCH - 1)
    answer = end_v2(broker, producer, commit=True)
    assert answer.error == ErrorCode.none and answer.producer_epoch == 0
    new_pid = answer.producer_id
    assert new_pid != old_pid
    assert last_record(broker) == (old_pid, MAX_PRODUCER_EPOCH, new_pid, V2, S.PREPARE_COMMIT)
    [job] = broker.marker_queue
    assert (job.producer_id, job.producer_epoch) == (old_pid, MAX_PRODUCER_EPOCH)
    broker.write_markers()
    assert last_record(broker) == (new_pid, 0, NO_PRODUCER_ID, V2, S.COMPLETE_COMMIT)
    assert broker.coordinator.owner_of(new_pid) == "txn"
    # The retry of that EndTxn, under the old producer id, is answered with the new one.
    retried = end_v2(broker, Producer("txn", old_pid, 0), True, epoch=MAX_PRODUCER_EPOCH - 1)
    assert retried == EndTxnResponse(ErrorCode.none, new_pid, 0)
    assert add_v2(broker, producer, T1) == ErrorCode.none
    assert end_v2(broker, producer, commit=False) == EndTxnResponse(ErrorCode.none, new_pid, 1)


def test_recovery_between_end_txn_and_markers() -> None:
    """kill -9 after PrepareCommit is durable, before any marker: loading writes the markers
    with the bumped epoch and completes; the retried EndTxn is answered as the first."""
    broker = SimulatedBroker()
    producer = started(broker)
    old = producer.producer_epoch
    end_v2(broker, producer, commit=True)
    coordinator = broker.restart()
    meta = coordinator.get("txn")
    assert meta is not None
    assert (meta.state, meta.producer_epoch, meta.client_transaction_version) == (
        S.PREPARE_COMMIT,
        old + 1,
        V2,
    )
    [job] = broker.marker_queue
    assert job.producer_epoch == old + 1
    broker.write_markers()
    assert broker.state("txn") == "CompleteCommit"
    assert end_v2(broker, producer, True, epoch=old).error == ErrorCode.none
    assert add_v2(broker, producer, T0) == ErrorCode.none


def test_recovery_mid_transaction_and_mid_overflow() -> None:
    broker = SimulatedBroker()
    producer = started(broker)
    broker.restart()
    # Ongoing after the load: the version 2 transaction carries on.
    assert end_v2(broker, producer, commit=False).error == ErrorCode.none
    broker.write_markers()
    # Exhaust the epoch by a crafted record, then crash between EndTxn and the markers.
    assert add_v2(broker, producer, T0) == ErrorCode.none
    at_epoch(broker, producer, MAX_PRODUCER_EPOCH - 1)
    old_pid = producer.producer_id
    answer = end_v2(broker, producer, commit=True)
    assert answer.producer_epoch == 0 and answer.producer_id != old_pid
    coordinator = broker.restart()
    broker.write_markers()
    meta = coordinator.get("txn")
    assert meta is not None
    assert (meta.producer_id, meta.producer_epoch, meta.previous_producer_id, meta.state) == (
        answer.producer_id,
        0,
        old_pid,
        S.COMPLETE_COMMIT,
    )


def test_timeout_of_a_version_2_transaction_fences_and_bumps() -> None:
    """As Kafka: the fence's bump, then the abort's, so that the fenced producer's EndTxn
    cannot pass for a retry of an EndTxn that bumped the epoch."""
    broker = SimulatedBroker()
    producer = started(broker)
    epoch = producer.producer_epoch
    broker.clock.advance(10 * 60_000)
    for result in broker.coordinator.expire_timed_out():
        broker.write(result)
    broker.write_markers()
    meta = broker.coordinator.get("txn")
    assert meta is not None
    assert (meta.state, meta.producer_epoch) == (S.COMPLETE_ABORT, epoch + 2)
    assert end_v2(broker, producer, commit=True).error == ErrorCode.producer_fenced


def test_classic_end_txn_keeps_the_epoch() -> None:
    broker = SimulatedBroker()
    producer = broker.new_producer("classic")
    broker.add(producer, T0)
    epoch = producer.producer_epoch
    assert broker.end(producer, commit=True) == ErrorCode.none
    broker.write_markers()
    meta = broker.coordinator.get("classic")
    assert meta is not None
    assert (meta.producer_epoch, meta.client_transaction_version) == (epoch, 0)
    assert broker.add(producer, T0) == {T0: ErrorCode.none}


def test_an_old_producer_id_is_no_retry_of_a_classic_transaction() -> None:
    """The retry of an EndTxn that exhausted the epochs is recognised only in a version 2
    transaction: after a classic rotation (KIP-360) the old producer id is not the new one's."""
    broker = SimulatedBroker()
    value = TransactionLogValue(
        producer_id=7001,
        producer_epoch=0,
        txn_timeout_ms=60_000,
        state=S.COMPLETE_COMMIT,
        partitions=frozenset(),
        txn_last_update_timestamp=broker.clock(),
        txn_start_timestamp=broker.clock(),
        previous_producer_id=7000,
    )
    broker.coordinator.replay(*transaction_record("classic", value))
    old = Producer("classic", 7000, MAX_PRODUCER_EPOCH - 1)
    assert end_v2(broker, old, commit=True).error == ErrorCode.invalid_producer_id_mapping


def test_markers_carry_the_transaction_version() -> None:
    """The markers carry the transaction's version (Kafka's WriteTxnMarkers TransactionVersion),
    also when a load after kill -9 between EndTxn and the markers writes them: a partition then
    requires a version 2 marker's epoch above its batches'. A classic transaction's is 0."""
    broker = SimulatedBroker()
    producer = started(broker)
    end_v2(broker, producer, commit=True)
    [job] = broker.marker_queue
    assert job.transaction_version == V2
    broker.restart()
    [job] = broker.marker_queue
    assert (job.producer_epoch, job.transaction_version) == (producer.producer_epoch, V2)
    broker.write_markers()
    assert {j.transaction_version for _, _, j in broker.markers} == {V2}
    # The coordinator's own abort of a version 2 transaction (its timeout) too.
    assert add_v2(broker, producer, T0) == ErrorCode.none
    broker.clock.advance(10 * 60_000)
    for result in broker.coordinator.expire_timed_out():
        broker.write(result)
    [job] = broker.marker_queue
    assert (job.commit, job.transaction_version) == (False, V2)
    classic = broker.new_producer("classic")
    broker.add(classic, T0)
    assert broker.end(classic, commit=True) == ErrorCode.none
    assert [
        j.transaction_version for j in broker.marker_queue if j.transactional_id == "classic"
    ] == [0]


def test_the_brokers_marker_writer_passes_the_version_to_the_partition(tmp_path: Path) -> None:
    """The asyncio broker's marker writer (coordinators._Partitions) hands the job's version to
    the partition: a version 2 job at the epoch of the partition's open transaction is refused
    there, nothing written; the same job at version 0 is written."""
    partition = UnifiedLog.open("t", 0, tmp_path / "t-0", LogConfig(), ManualClock(1), 86_400_000)
    try:
        data = build_batch(
            [(None, b"v", (), 1)],
            producer_id=7,
            producer_epoch=3,
            base_sequence=0,
            transactional=True,
        )
        partition.append_as_leader(
            data, partition.validate(data), VerificationGuard(transactional_id="txn")
        )
        writer = _Partitions(SimpleNamespace(partition=lambda _t, _i: partition), ManualClock(1))
        job = MarkerJob("txn", 7, 3, True, 0, (("t", 0),), transaction_version=V2)
        with pytest.raises(InvalidProducerEpochError):
            writer.append_marker("t", 0, job)
        assert partition.log_end_offset == 1
        assert writer.append_marker("t", 0, dataclasses.replace(job, transaction_version=0))
        assert partition.log_end_offset == 2
    finally:
        partition.close()
