"""The transaction coordinator: the state table, and every rule and error of KAFKA_EOS_NOTES."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode
from tests.txn.coordinator_harness import TIMEOUT_MS, Producer, SimulatedBroker

from onceflow.protocol.api_key import ApiKey
from onceflow.txn.coordinator import (
    OFFSETS_TOPIC_PARTITION,
    error_for_version,
)
from onceflow.txn.coordinator_errors import (
    IllegalTransitionError,
    TransactionLogReplayError,
)
from onceflow.txn.transaction_log import TransactionLogValue, decode_value, transaction_record
from onceflow.txn.transaction_metadata import TransactionMetadata
from onceflow.txn.transaction_state import (
    VALID_PREVIOUS_STATES,
    TransactionState,
    unknown_state_filters,
)

S = TransactionState
T0 = ("topic", 0)
T1 = ("topic", 1)
OTHER = ("other", 3)


@pytest.fixture
def broker() -> SimulatedBroker:
    return SimulatedBroker()


def load(broker: SimulatedBroker, transactional_id: str, **fields: object) -> TransactionMetadata:
    """Put a transactional id in a given durable state by replaying a crafted record."""
    values: dict[str, object] = {
        "producer_id": 7000,
        "producer_epoch": 5,
        "txn_timeout_ms": TIMEOUT_MS,
        "state": S.EMPTY,
        "partitions": frozenset(),
        "txn_last_update_timestamp": broker.clock(),
        "txn_start_timestamp": -1,
    }
    values.update(fields)
    record = transaction_record(transactional_id, TransactionLogValue(**values))  # type: ignore[arg-type]
    broker.log.append(record)
    broker.coordinator.replay(*record)
    meta = broker.coordinator.get(transactional_id)
    assert meta is not None
    return meta


def ongoing(broker: SimulatedBroker, txn_id: str = "txn") -> Producer:
    producer = broker.new_producer(txn_id)
    assert broker.add(producer, T0, T1) == {T0: ErrorCode.none, T1: ErrorCode.none}
    return producer


def last_value(broker: SimulatedBroker) -> TransactionLogValue:
    value = broker.log[-1][1]
    assert value is not None
    return decode_value(value)


# -- the state table ------------------------------------------------------------------------


def test_valid_previous_states_table_is_kafkas() -> None:
    kafka_table = {
        S.EMPTY: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.ONGOING: {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.PREPARE_COMMIT: {S.ONGOING},
        # Kafka 4: a transactions version 2 client may abort what it does not know was begun.
        S.PREPARE_ABORT: {
            S.ONGOING,
            S.PREPARE_EPOCH_FENCE,
            S.EMPTY,
            S.COMPLETE_COMMIT,
            S.COMPLETE_ABORT,
        },
        S.COMPLETE_COMMIT: {S.PREPARE_COMMIT},
        S.COMPLETE_ABORT: {S.PREPARE_ABORT},
        S.DEAD: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.PREPARE_EPOCH_FENCE: {S.ONGOING},
    }
    assert kafka_table == VALID_PREVIOUS_STATES
    assert [int(s) for s in S] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert S.PREPARE_EPOCH_FENCE.kafka_name == "PrepareEpochFence"
    assert all(S.from_name(s.kafka_name) is s for s in S)
    assert unknown_state_filters(["Ongoing", "Nope"]) == ["Nope"]


def _meta(state: TransactionState) -> TransactionMetadata:
    return TransactionMetadata(
        transactional_id="t",
        producer_id=1,
        producer_epoch=3,
        txn_timeout_ms=TIMEOUT_MS,
        state=state,
        partitions=frozenset({T0}) if state not in (S.EMPTY, S.DEAD) else frozenset(),
        txn_start_timestamp=10,
        txn_last_update_timestamp=10,
        last_producer_epoch=2,
    )


TRANSITIONS = {
    # prepare method -> the state it targets from `current`
    "increment_epoch": (
        lambda m: m.prepare_increment_producer_epoch(TIMEOUT_MS, None, 20),
        lambda _s: S.EMPTY,
    ),
    "rotate_producer_id": (
        lambda m: m.prepare_producer_id_rotation(99, TIMEOUT_MS, 20, True),
        lambda _s: S.EMPTY,
    ),
    "add_partitions": (lambda m: m.prepare_add_partitions([T1], 20), lambda _s: S.ONGOING),
    "commit": (lambda m: m.prepare_abort_or_commit(True, 20), lambda _s: S.PREPARE_COMMIT),
    "abort": (lambda m: m.prepare_abort_or_commit(False, 20), lambda _s: S.PREPARE_ABORT),
    "complete": (
        lambda m: m.prepare_complete(20),
        lambda s: S.COMPLETE_COMMIT if s is S.PREPARE_COMMIT else S.COMPLETE_ABORT,
    ),
    "dead": (lambda m: m.prepare_dead(), lambda _s: S.DEAD),
    "fence": (lambda m: m.prepare_fence_producer_epoch(), lambda _s: S.PREPARE_EPOCH_FENCE),
}


@pytest.mark.parametrize("current", list(S), ids=lambda s: s.kafka_name)
@pytest.mark.parametrize("transition", list(TRANSITIONS))
def test_every_prepared_transition_follows_the_table(
    current: TransactionState, transition: str
) -> None:
    prepare, target_of = TRANSITIONS[transition]
    target = target_of(current)
    if current in VALID_PREVIOUS_STATES[target]:
        result = prepare(_meta(current))
        assert isinstance(result, TransactionMetadata)
        assert result.state is target
    else:
        with pytest.raises(IllegalTransitionError):
            prepare(_meta(current))


@pytest.mark.parametrize("current", [s for s in S if s is not S.DEAD], ids=lambda s: s.kafka_name)
@pytest.mark.parametrize("target", [s for s in S if s is not S.DEAD], ids=lambda s: s.kafka_name)
def test_every_replayed_transition_follows_the_table(
    broker: SimulatedBroker, current: TransactionState, target: TransactionState
) -> None:
    load(broker, "t", state=current, partitions=frozenset({T0}) if current is not S.EMPTY else ())
    record = transaction_record(
        "t",
        TransactionLogValue(
            producer_id=7000,
            producer_epoch=5,
            txn_timeout_ms=TIMEOUT_MS,
            state=target,
            partitions=frozenset({T0}) if target is not S.EMPTY else frozenset(),
            txn_last_update_timestamp=broker.clock(),
            txn_start_timestamp=1,
        ),
    )
    if current in VALID_PREVIOUS_STATES[target]:
        broker.coordinator.replay(*record)
        meta = broker.coordinator.get("t")
        assert meta is not None and meta.state is target
    else:
        with pytest.raises(TransactionLogReplayError):
            broker.coordinator.replay(*record)
        meta = broker.coordinator.get("t")
        assert meta is not None and meta.state is current


def test_replay_refuses_a_lower_epoch_and_a_foreign_producer_id(broker: SimulatedBroker) -> None:
    load(broker, "t", producer_epoch=5)
    lower = TransactionLogValue(7000, 4, TIMEOUT_MS, S.EMPTY, frozenset(), 0, -1)
    with pytest.raises(TransactionLogReplayError):
        broker.coordinator.replay(*transaction_record("t", lower))
    foreign = TransactionLogValue(8000, 3, TIMEOUT_MS, S.EMPTY, frozenset(), 0, -1)
    with pytest.raises(TransactionLogReplayError):
        broker.coordinator.replay(*transaction_record("t", foreign))
    rotated = TransactionLogValue(8000, 0, TIMEOUT_MS, S.EMPTY, frozenset(), 0, -1)
    broker.coordinator.replay(*transaction_record("t", rotated))
    assert broker.coordinator.get("t").producer_id == 8000  # type: ignore[union-attr]


def test_replay_of_anything_but_the_pending_transition_is_refused(broker: SimulatedBroker) -> None:
    producer = broker.new_producer("t")
    result = broker.coordinator.add_partitions("t", producer.producer_id, 0, [T0])
    other = TransactionLogValue(
        producer.producer_id, 0, TIMEOUT_MS, S.ONGOING, frozenset({T1}), 0, 0
    )
    with pytest.raises(TransactionLogReplayError):
        broker.coordinator.replay(*transaction_record("t", other))
    assert broker.state("t") == "Empty"
    assert result.records  # the genuine record was never replayed


# -- InitProducerId -------------------------------------------------------------------------


def test_null_transactional_id_gets_fresh_producer_ids_with_epoch_0(
    broker: SimulatedBroker,
) -> None:
    ids = set()
    for _ in range(5):
        response = broker.write(broker.coordinator.init_producer_id(None, TIMEOUT_MS))
        assert response.error == ErrorCode.none and response.producer_epoch == 0
        ids.add(response.producer_id)
    assert len(ids) == 5


def test_first_block_record_is_written_before_an_id_is_answered(broker: SimulatedBroker) -> None:
    first = broker.coordinator.init_producer_id(None, TIMEOUT_MS)
    assert len(first.records) == 1  # the block reservation
    # Not yet durable: the next id from the same block carries the reservation too.
    second = broker.coordinator.init_producer_id(None, TIMEOUT_MS)
    assert second.records == first.records
    broker.write(second)
    third = broker.coordinator.init_producer_id(None, TIMEOUT_MS)
    assert third.records == []  # block durable: answer at once
    assert (
        len({first.response.producer_id, second.response.producer_id, third.response.producer_id})
        == 3
    )


@pytest.mark.parametrize(
    ("txn_id", "timeout", "pid", "epoch", "error"),
    [
        ("", TIMEOUT_MS, -1, -1, ErrorCode.invalid_request),
        ("t", TIMEOUT_MS, 5, -1, ErrorCode.invalid_request),
        ("t", TIMEOUT_MS, -1, 5, ErrorCode.invalid_request),
        ("t", 900_001, -1, -1, ErrorCode.invalid_transaction_timeout),
        ("t", 0, -1, -1, ErrorCode.invalid_transaction_timeout),
        ("t", -5, -1, -1, ErrorCode.invalid_transaction_timeout),
    ],
)
def test_init_producer_id_request_errors(
    broker: SimulatedBroker, txn_id: str, timeout: int, pid: int, epoch: int, error: ErrorCode
) -> None:
    result = broker.coordinator.init_producer_id(txn_id, timeout, pid, epoch)
    assert result.records == []
    assert result.response.error == error
    assert (result.response.producer_id, result.response.producer_epoch) == (-1, -1)
    assert broker.coordinator.transactions() == {}


def test_timeout_limit_is_configurable_and_inclusive() -> None:
    broker = SimulatedBroker(config={"transaction_max_timeout_ms": 1000})
    assert broker.init(Producer("a"), 1000).error == ErrorCode.none
    assert broker.init(Producer("b"), 1001).error == ErrorCode.invalid_transaction_timeout


def test_new_transactional_id_gets_epoch_0_then_each_init_bumps(broker: SimulatedBroker) -> None:
    producer = broker.new_producer("t")
    assert producer.producer_epoch == 0
    pid = producer.producer_id
    assert broker.init(Producer("t")).producer_epoch == 1
    # From CompleteCommit and CompleteAbort too.
    for commit in (True, False):
        p = broker.new_producer("t")
        broker.add(p, T0)
        assert broker.end(p, commit) == ErrorCode.none
        broker.write_markers()
        assert broker.state("t") == ("CompleteCommit" if commit else "CompleteAbort")
        response = broker.init(Producer("t"))
        assert response.error == ErrorCode.none and response.producer_id == pid
        assert response.producer_epoch == p.producer_epoch + 1
        assert broker.state("t") == "Empty"


def test_init_updates_the_transaction_timeout(broker: SimulatedBroker) -> None:
    broker.new_producer("t", timeout_ms=1000)
    broker.new_producer("t", timeout_ms=2000)
    assert broker.coordinator.get("t").txn_timeout_ms == 2000  # type: ignore[union-attr]


@pytest.mark.parametrize("commit", [True, False])
def test_init_while_prepare_is_concurrent_transactions(
    broker: SimulatedBroker, commit: bool
) -> None:
    producer = ongoing(broker)
    broker.end(producer, commit)
    result = broker.coordinator.init_producer_id("txn", TIMEOUT_MS)
    assert result.response.error == ErrorCode.concurrent_transactions and result.records == []
    broker.write_markers()
    assert broker.init(Producer("txn")).producer_epoch == producer.producer_epoch + 1


def test_init_while_ongoing_fences_and_aborts_the_open_transaction(
    broker: SimulatedBroker,
) -> None:
    old = ongoing(broker)
    new = Producer("txn")
    result = broker.coordinator.init_producer_id("txn", TIMEOUT_MS)
    assert result.response.error == ErrorCode.concurrent_transactions
    assert result.markers is not None
    assert result.markers.commit is False
    assert result.markers.producer_epoch == old.producer_epoch + 1
    assert result.markers.partitions == (T0, T1)
    broker.write(result)
    value = last_value(broker)
    assert value.state is S.PREPARE_ABORT and value.producer_epoch == old.producer_epoch + 1
    assert value.last_producer_epoch == -1
    # The old instance is fenced everywhere.
    assert broker.add(old, OTHER) == {OTHER: ErrorCode.producer_fenced}
    assert broker.end(old, True) == ErrorCode.producer_fenced
    # Until the abort completes, the new instance is told to retry.
    assert broker.init(new).error == ErrorCode.concurrent_transactions
    broker.write_markers()
    assert broker.state("txn") == "CompleteAbort"
    response = broker.init(new)
    assert response.error == ErrorCode.none
    assert response.producer_epoch == old.producer_epoch + 2
    # A KIP-360 retry by the fenced instance is fenced too.
    assert broker.init(old, kip360=True).error == ErrorCode.producer_fenced


def test_kip360_retry_with_the_previous_epoch_returns_the_current_one(
    broker: SimulatedBroker,
) -> None:
    producer = broker.new_producer("t")
    pid = producer.producer_id
    first = broker.write(broker.coordinator.init_producer_id("t", TIMEOUT_MS, pid, 0))
    assert (first.error, first.producer_id, first.producer_epoch) == (ErrorCode.none, pid, 1)
    assert broker.coordinator.get("t").last_producer_epoch == 0  # type: ignore[union-attr]
    # The answer was lost: the producer retries with epoch 0 and gets epoch 1 again.
    retry = broker.write(broker.coordinator.init_producer_id("t", TIMEOUT_MS, pid, 0))
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (ErrorCode.none, pid, 1)
    # With the current epoch it bumps again.
    bump = broker.write(broker.coordinator.init_producer_id("t", TIMEOUT_MS, pid, 1))
    assert bump.producer_epoch == 2


@pytest.mark.parametrize(
    ("pid_delta", "epoch"),
    [(0, 3), (0, 9), (1, 5), (-1, 5)],
    ids=["stale-epoch", "future-epoch", "other-producer-id", "older-producer-id"],
)
def test_kip360_other_mismatches_are_producer_fenced(
    broker: SimulatedBroker, pid_delta: int, epoch: int
) -> None:
    meta = load(broker, "t", producer_epoch=5, last_producer_epoch=4)
    result = broker.coordinator.init_producer_id(
        "t", TIMEOUT_MS, meta.producer_id + pid_delta, epoch
    )
    assert result.response.error == ErrorCode.producer_fenced
    assert result.records == []


def test_kip360_retry_fails_after_another_instance_initialised(broker: SimulatedBroker) -> None:
    a = broker.new_producer("t")
    b = broker.new_producer("t")
    assert b.producer_epoch == a.producer_epoch + 1
    assert broker.init(a, kip360=True).error == ErrorCode.producer_fenced
    assert broker.coordinator.get("t").producer_epoch == b.producer_epoch  # type: ignore[union-attr]


def test_kip360_for_an_unknown_transactional_id_starts_it(broker: SimulatedBroker) -> None:
    response = broker.write(broker.coordinator.init_producer_id("fresh", TIMEOUT_MS, 123, 4))
    assert response.error == ErrorCode.none and response.producer_epoch == 0
    assert response.producer_id != 123


def test_epoch_exhaustion_rotates_the_producer_id(broker: SimulatedBroker) -> None:
    meta = load(broker, "t", producer_epoch=32766)
    response = broker.init(Producer("t"))
    assert response.error == ErrorCode.none
    assert response.producer_id != meta.producer_id and response.producer_epoch == 0
    rotated = broker.coordinator.get("t")
    assert rotated is not None and rotated.previous_producer_id == meta.producer_id
    assert rotated.last_producer_epoch == -1


def test_epoch_exhaustion_with_kip360_and_its_retry(broker: SimulatedBroker) -> None:
    meta = load(broker, "t", producer_epoch=32766)
    old = (meta.producer_id, 32766)
    first = broker.write(broker.coordinator.init_producer_id("t", TIMEOUT_MS, *old))
    assert first.error == ErrorCode.none and first.producer_epoch == 0
    assert first.producer_id != meta.producer_id
    # Lost answer: the retry with the old producer id and exhausted epoch gets the same result.
    retry = broker.write(broker.coordinator.init_producer_id("t", TIMEOUT_MS, *old))
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (
        ErrorCode.none,
        first.producer_id,
        0,
    )
    # An older epoch of the old producer id is fenced.
    stale = broker.coordinator.init_producer_id("t", TIMEOUT_MS, meta.producer_id, 32765)
    assert stale.response.error == ErrorCode.producer_fenced


def test_exhausted_epoch_with_a_stale_expected_epoch_is_fenced(broker: SimulatedBroker) -> None:
    meta = load(broker, "t", producer_epoch=32766, last_producer_epoch=-1)
    result = broker.coordinator.init_producer_id("t", TIMEOUT_MS, meta.producer_id, 100)
    assert result.response.error == ErrorCode.producer_fenced


def test_fencing_at_the_last_epoch_then_rotating(broker: SimulatedBroker) -> None:
    meta = load(
        broker,
        "t",
        producer_epoch=32766,
        state=S.ONGOING,
        partitions=frozenset({T0}),
        txn_start_timestamp=broker.clock(),
    )
    result = broker.coordinator.init_producer_id("t", TIMEOUT_MS)
    assert result.response.error == ErrorCode.concurrent_transactions
    assert result.markers is not None and result.markers.producer_epoch == 32767
    broker.write(result)
    broker.write_markers()
    response = broker.init(Producer("t"))
    assert response.error == ErrorCode.none
    assert response.producer_id != meta.producer_id and response.producer_epoch == 0


# -- AddPartitionsToTxn / AddOffsetsToTxn ---------------------------------------------------


def test_add_partitions_starts_and_extends_the_transaction(broker: SimulatedBroker) -> None:
    producer = broker.new_producer("t")
    start = broker.clock()
    assert broker.add(producer, T0) == {T0: ErrorCode.none}
    broker.clock.advance(50)
    assert broker.add(producer, T0, T1) == {T0: ErrorCode.none, T1: ErrorCode.none}
    meta = broker.coordinator.get("t")
    assert meta is not None and meta.state is S.ONGOING
    assert meta.partitions == {T0, T1}
    assert meta.txn_start_timestamp == start
    assert meta.txn_last_update_timestamp == start + 50


def test_add_partitions_already_in_the_transaction_writes_nothing(broker: SimulatedBroker) -> None:
    producer = ongoing(broker, "t")
    result = broker.coordinator.add_partitions("t", producer.producer_id, 0, [T1, T0, T0])
    assert result.records == [] and result.transactional_id is None
    assert result.response == {T0: ErrorCode.none, T1: ErrorCode.none}
    assert not broker.coordinator.has_pending("t")


def test_add_partitions_errors(broker: SimulatedBroker) -> None:
    producer = broker.new_producer("t")
    pid = producer.producer_id
    c = broker.coordinator
    assert c.add_partitions("nope", pid, 0, [T0]).response == {
        T0: ErrorCode.invalid_producer_id_mapping
    }
    assert c.add_partitions("t", pid + 1, 0, [T0]).response == {
        T0: ErrorCode.invalid_producer_id_mapping
    }
    assert c.add_partitions("t", pid, 1, [T0]).response == {T0: ErrorCode.producer_fenced}
    assert c.add_partitions("", pid, 0, [T0]).response == {T0: ErrorCode.invalid_request}
    assert c.add_offsets("nope", pid, 0, "g").response == ErrorCode.invalid_producer_id_mapping
    assert c.add_offsets("t", pid, 7, "g").response == ErrorCode.producer_fenced
    assert broker.state("t") == "Empty"


@pytest.mark.parametrize("commit", [True, False])
def test_add_while_prepare_is_concurrent_transactions(
    broker: SimulatedBroker, commit: bool
) -> None:
    producer = ongoing(broker, "t")
    broker.end(producer, commit)
    assert broker.add(producer, OTHER) == {OTHER: ErrorCode.concurrent_transactions}
    assert broker.add_offsets(producer) == ErrorCode.concurrent_transactions
    broker.write_markers()
    assert broker.add(producer, OTHER) == {OTHER: ErrorCode.none}  # a new transaction


def test_add_offsets_adds_the_offsets_partition(broker: SimulatedBroker) -> None:
    producer = broker.new_producer("t")
    assert broker.add_offsets(producer, "my-group") == ErrorCode.none
    meta = broker.coordinator.get("t")
    assert meta is not None and meta.state is S.ONGOING
    assert meta.partitions == {OFFSETS_TOPIC_PARTITION} == {("__consumer_offsets", 0)}
    # Idempotent while open.
    assert broker.coordinator.add_offsets("t", producer.producer_id, 0, "my-group").records == []
    broker.add(producer, T0)
    broker.end(producer, True)
    (job,) = broker.marker_queue
    assert job.partitions == (("__consumer_offsets", 0), T0)


# -- EndTxn ---------------------------------------------------------------------------------


@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_prepares_answers_and_completes_after_markers(
    broker: SimulatedBroker, commit: bool
) -> None:
    producer = ongoing(broker, "t")
    result = broker.coordinator.end_txn("t", producer.producer_id, 0, commit)
    assert result.response == ErrorCode.none
    assert result.markers is not None
    assert result.markers.commit is commit
    assert result.markers.partitions == (T0, T1)
    assert (result.markers.producer_id, result.markers.producer_epoch) == (producer.producer_id, 0)
    assert result.markers.coordinator_epoch == 0
    broker.write(result)
    assert broker.state("t") == ("PrepareCommit" if commit else "PrepareAbort")
    assert [j.transactional_id for j in broker.coordinator.in_doubt()] == ["t"]
    broker.write_markers()
    meta = broker.coordinator.get("t")
    assert meta is not None
    assert meta.state is (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
    assert meta.partitions == frozenset()
    assert meta.producer_epoch == 0  # transaction version 1: EndTxn keeps the epoch
    assert broker.coordinator.in_doubt() == []


@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_without_begin_is_invalid_txn_state(broker: SimulatedBroker, commit: bool) -> None:
    producer = broker.new_producer("t")
    result = broker.coordinator.end_txn("t", producer.producer_id, 0, commit)
    assert result.response == ErrorCode.invalid_txn_state and result.records == []


@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_retries_and_wrong_results(broker: SimulatedBroker, commit: bool) -> None:
    producer = ongoing(broker, "t")
    assert broker.end(producer, commit) == ErrorCode.none
    # Retried while Prepare*: retry later. The other result: invalid.
    assert broker.end(producer, commit) == ErrorCode.concurrent_transactions
    assert broker.end(producer, not commit) == ErrorCode.invalid_txn_state
    broker.write_markers()
    # Retried after completion: success, nothing written. The other result: invalid.
    log_size = len(broker.log)
    assert broker.end(producer, commit) == ErrorCode.none
    assert broker.end(producer, not commit) == ErrorCode.invalid_txn_state
    assert len(broker.log) == log_size
    assert broker.coordinator.get("t").state is (  # type: ignore[union-attr]
        S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
    )


def test_end_txn_identity_errors(broker: SimulatedBroker) -> None:
    producer = ongoing(broker, "t")
    pid = producer.producer_id
    c = broker.coordinator
    assert c.end_txn("nope", pid, 0, True).response == ErrorCode.invalid_producer_id_mapping
    assert c.end_txn("t", pid + 1, 0, True).response == ErrorCode.invalid_producer_id_mapping
    assert c.end_txn("t", pid, 1, True).response == ErrorCode.producer_fenced
    assert c.end_txn("t", pid, -1, True).response == ErrorCode.producer_fenced
    assert c.end_txn("", pid, 0, True).response == ErrorCode.invalid_request
    assert broker.state("t") == "Ongoing"


def test_markers_written_errors(broker: SimulatedBroker) -> None:
    producer = ongoing(broker, "t")
    c = broker.coordinator
    assert c.markers_written("nope", 0).response == ErrorCode.transactional_id_not_found
    assert c.markers_written("t", 0).response == ErrorCode.invalid_txn_state  # still Ongoing
    broker.end(producer, True)
    assert c.markers_written("t", 1).response == ErrorCode.producer_fenced
    pending = c.markers_written("t", 0)
    assert c.markers_written("t", 0).response == ErrorCode.concurrent_transactions
    broker.write(pending)
    assert broker.state("t") == "CompleteCommit"


# -- pending transitions ----------------------------------------------------------------------


def test_pending_transition_makes_everything_else_concurrent(broker: SimulatedBroker) -> None:
    producer = ongoing(broker, "t")
    pid = producer.producer_id
    c = broker.coordinator
    pending = c.end_txn("t", pid, 0, True)
    assert c.has_pending("t") and pending.transactional_id == "t"
    assert c.init_producer_id("t", TIMEOUT_MS).response.error == ErrorCode.concurrent_transactions
    assert c.add_partitions("t", pid, 0, [OTHER]).response == {
        OTHER: ErrorCode.concurrent_transactions
    }
    assert c.add_offsets("t", pid, 0, "g").response == ErrorCode.concurrent_transactions
    assert c.end_txn("t", pid, 0, True).response == ErrorCode.concurrent_transactions
    assert c.end_txn("t", pid, 0, False).response == ErrorCode.concurrent_transactions
    broker.clock.advance(TIMEOUT_MS * 2)
    assert c.expire_timed_out() == []
    # Identity errors still come first, as in Kafka.
    assert c.end_txn("t", pid, 3, True).response == ErrorCode.producer_fenced
    # The state did not move: it moves only when the record is replayed.
    assert broker.state("t") == "Ongoing"
    broker.write(pending)
    assert broker.state("t") == "PrepareCommit"


def test_failed_write_leaves_the_state_unchanged_and_the_retry_works(
    broker: SimulatedBroker,
) -> None:
    producer = ongoing(broker, "t")
    before = broker.coordinator.get("t")
    failed = broker.coordinator.end_txn("t", producer.producer_id, 0, True)
    assert broker.fail(failed) == ErrorCode.coordinator_not_available
    assert broker.coordinator.get("t") == before
    assert not broker.coordinator.has_pending("t")
    assert broker.end(producer, True) == ErrorCode.none
    assert broker.state("t") == "PrepareCommit"


def test_failed_write_of_a_new_transactional_id_forgets_it(broker: SimulatedBroker) -> None:
    failed = broker.coordinator.init_producer_id("t", TIMEOUT_MS)
    assert failed.response.error == ErrorCode.none
    broker.fail(failed)
    assert broker.coordinator.get("t") is None
    assert broker.coordinator.describe(["t"])[0].error == ErrorCode.transactional_id_not_found
    retry = broker.init(Producer("t"))
    assert retry.error == ErrorCode.none and retry.producer_epoch == 0
    assert retry.producer_id != failed.response.producer_id  # ids are never reused


def test_failed_fence_does_not_bump_twice(broker: SimulatedBroker) -> None:
    old = ongoing(broker, "t")
    broker.fail(broker.coordinator.init_producer_id("t", TIMEOUT_MS))
    # Nothing was written: the old producer may still finish its transaction ...
    assert broker.coordinator.get("t").producer_epoch == old.producer_epoch  # type: ignore[union-attr]
    result = broker.coordinator.init_producer_id("t", TIMEOUT_MS)
    # ... and the next fence bumps by exactly one.
    assert result.markers is not None and result.markers.producer_epoch == old.producer_epoch + 1


# -- KIP-890 verification and version mapping -----------------------------------------------


def test_is_in_transaction(broker: SimulatedBroker) -> None:
    producer = ongoing(broker, "t")
    pid = producer.producer_id
    c = broker.coordinator
    assert c.is_in_transaction("t", pid, 0, *T0) == ErrorCode.none
    assert c.is_in_transaction("t", pid, 0, *OTHER) == ErrorCode.invalid_txn_state
    assert c.is_in_transaction("t", pid, 0, *OTHER, produce_version=11) == (
        ErrorCode.transaction_abortable
    )
    assert c.is_in_transaction("t", pid, 1, *T0) == ErrorCode.invalid_producer_epoch
    assert c.is_in_transaction("t", pid + 1, 0, *T0) == ErrorCode.invalid_producer_id_mapping
    assert c.is_in_transaction("nope", pid, 0, *T0) == ErrorCode.invalid_producer_id_mapping
    broker.end(producer, True)
    # Completing: retriable for every client.
    assert c.is_in_transaction("t", pid, 0, *T0) == ErrorCode.not_enough_replicas
    broker.write_markers()
    assert c.is_in_transaction("t", pid, 0, *T0) == ErrorCode.invalid_txn_state
    # The coordinator's own answers, as AddPartitionsToTxn v4+ verify-only gives them.
    broker.add(producer, T1)
    verify = c.add_partitions("t", pid, 0, [T0, T1], verify_only=True)
    assert verify.records == []
    assert verify.response == {T0: ErrorCode.transaction_abortable, T1: ErrorCode.none}
    assert c.add_partitions("t", pid, 1, [T1], verify_only=True).response == {
        T1: ErrorCode.producer_fenced
    }


def test_is_in_transaction_after_fencing(broker: SimulatedBroker) -> None:
    old = ongoing(broker, "t")
    broker.write(broker.coordinator.init_producer_id("t", TIMEOUT_MS))
    assert broker.coordinator.is_in_transaction("t", old.producer_id, 0, *T0) == (
        ErrorCode.invalid_producer_epoch
    )


@pytest.mark.parametrize(
    ("api_key", "first_new_version"),
    [
        (ApiKey.INIT_PRODUCER_ID, 4),
        (ApiKey.ADD_PARTITIONS_TO_TXN, 2),
        (ApiKey.ADD_OFFSETS_TO_TXN, 2),
        (ApiKey.END_TXN, 2),
    ],
)
def test_producer_fenced_for_old_versions(api_key: int, first_new_version: int) -> None:
    for version in range(first_new_version):
        assert error_for_version(ErrorCode.producer_fenced, api_key, version) == (
            ErrorCode.invalid_producer_epoch
        )
    for version in range(first_new_version, 6):
        assert error_for_version(ErrorCode.producer_fenced, api_key, version) == (
            ErrorCode.producer_fenced
        )
    assert error_for_version(ErrorCode.concurrent_transactions, api_key, 0) == (
        ErrorCode.concurrent_transactions
    )
    assert error_for_version(ErrorCode.producer_fenced, 0, 0) == ErrorCode.producer_fenced


# -- timeouts ---------------------------------------------------------------------------------


def test_timed_out_transaction_is_fenced_and_aborted(broker: SimulatedBroker) -> None:
    old = broker.new_producer("t", timeout_ms=1000)
    broker.add(old, T0)
    broker.clock.advance(1000)
    assert broker.coordinator.expire_timed_out() == []  # start + timeout is not yet past
    broker.clock.advance(1)
    (result,) = broker.coordinator.expire_timed_out()
    assert result.transactional_id == "t" and result.response == ErrorCode.none
    assert result.markers is not None and result.markers.commit is False
    assert result.markers.producer_epoch == old.producer_epoch + 1
    assert result.markers.partitions == (T0,)
    broker.write(result)
    assert broker.state("t") == "PrepareAbort"
    # The old producer is fenced: it cannot add, commit, or pass for a KIP-360 retry.
    assert broker.end(old, True) == ErrorCode.producer_fenced
    assert broker.add(old, T1) == {T1: ErrorCode.producer_fenced}
    broker.write_markers()
    assert broker.state("t") == "CompleteAbort"
    assert broker.end(old, True) == ErrorCode.producer_fenced
    assert broker.init(old, kip360=True).error == ErrorCode.producer_fenced
    assert broker.new_producer("t").producer_epoch == old.producer_epoch + 2
    assert broker.coordinator.expire_timed_out() == []


def test_only_ongoing_transactions_time_out(broker: SimulatedBroker) -> None:
    broker.new_producer("empty", timeout_ms=1000)
    done = broker.new_producer("prepared", timeout_ms=1000)
    broker.add(done, T0)
    broker.end(done, True)
    live = broker.new_producer("live", timeout_ms=5000)
    broker.add(live, T0)
    broker.clock.advance(2000)
    assert broker.coordinator.expire_timed_out() == []


def test_timeout_counts_from_the_first_partition(broker: SimulatedBroker) -> None:
    producer = broker.new_producer("t", timeout_ms=1000)
    broker.clock.advance(5000)  # idle Empty: no transaction to time out
    broker.add(producer, T0)
    broker.clock.advance(900)
    broker.add(producer, T1)
    broker.clock.advance(101)
    assert [r.transactional_id for r in broker.coordinator.expire_timed_out()] == ["t"]


# -- expiration, admin ------------------------------------------------------------------


def test_expire_transactional_ids() -> None:
    broker = SimulatedBroker(config={"transactional_id_expiration_ms": 10_000})
    idle = broker.new_producer("idle")
    busy = broker.new_producer("busy")
    broker.add(busy, T0)
    broker.clock.advance(9_999)
    assert broker.coordinator.expire_transactional_ids() == []
    broker.clock.advance(1)
    (result,) = broker.coordinator.expire_transactional_ids()
    assert result.transactional_id == "idle"
    assert result.records[0][1] is None  # a tombstone
    assert broker.coordinator.expire_transactional_ids() == []  # pending already
    broker.write(result)
    assert broker.coordinator.get("idle") is None
    assert broker.coordinator.describe(["idle"])[0].error == ErrorCode.transactional_id_not_found
    assert broker.add(idle, T0) == {T0: ErrorCode.invalid_producer_id_mapping}
    again = broker.new_producer("idle")
    assert again.producer_id != idle.producer_id and again.producer_epoch == 0
    # The busy one expires only once it is complete and idle (as the new "idle" does).
    broker.end(busy, True)
    broker.write_markers()
    broker.clock.advance(10_000)
    expired = {r.transactional_id for r in broker.coordinator.expire_transactional_ids()}
    assert expired == {"busy", "idle"}


def test_describe(broker: SimulatedBroker) -> None:
    producer = broker.new_producer("t", timeout_ms=5000)
    start = broker.clock()
    broker.add(producer, ("b", 2), ("a", 1), ("b", 0))
    described = broker.coordinator.describe(["t", "nope", ""])
    assert [d.error for d in described] == [
        ErrorCode.none,
        ErrorCode.transactional_id_not_found,
        ErrorCode.invalid_request,
    ]
    d = described[0]
    assert (d.transactional_id, d.state, d.producer_id, d.producer_epoch) == (
        "t",
        "Ongoing",
        producer.producer_id,
        0,
    )
    assert (d.transaction_timeout_ms, d.transaction_start_time_ms) == (5000, start)
    assert d.topics == (("a", (1,)), ("b", (0, 2)))


def test_list(broker: SimulatedBroker) -> None:
    a = broker.new_producer("a")
    b = broker.new_producer("b")
    broker.add(b, T0)
    broker.clock.advance(1000)
    c = broker.new_producer("c")
    broker.add(c, T0)
    coord = broker.coordinator
    assert [x.transactional_id for x in coord.list([], [])] == ["a", "b", "c"]
    assert [x.transactional_id for x in coord.list(["Ongoing"], [])] == ["b", "c"]
    assert [x.state for x in coord.list(["Empty"], [])] == ["Empty"]
    assert coord.list(["NoSuchState"], []) == []
    assert [x.transactional_id for x in coord.list([], [a.producer_id])] == ["a"]
    assert [
        x.transactional_id for x in coord.list(["Ongoing"], [a.producer_id, c.producer_id])
    ] == ["c"]
    # Running for more than 500 ms: b only (a has no transaction: start -1, as Kafka).
    assert [x.transactional_id for x in coord.list(["Ongoing"], [], 500)] == ["b"]
    assert coord.list(["Ongoing"], [], 5000) == []
