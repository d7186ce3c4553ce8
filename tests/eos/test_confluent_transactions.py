"""confluent-kafka (librdkafka) transactional producers and read_committed consumers against
the broker: commit, abort, atomicity over several partitions, isolation levels, fencing of a
zombie, the broker's transaction timeout, consume-transform-produce with
send_offsets_to_transaction, the last stable offset, and the errors for client mistakes."""

from __future__ import annotations

import importlib
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.types import ProducerId, TopicName, TransactionalId
from kio.static.primitive import i16, i32

from onceflow.broker.embedded import EmbeddedBroker
from tests.admin_requests import (
    call,
    describe_transactions,
    end_txn,
    fetch_committed_offset,
    init_producer_id,
    list_offsets,
    list_transactions,
    produce_batch,
)
from tests.confluent import QUIET, TP, create_topics, partitions_of, send, transactional_producer
from tests.eos.checker import read_back, wait_settled
from tests.waiting import wait_for

OK = ErrorCode.none
READ_COMMITTED = 1
UNSTABLE = ErrorCode.unstable_offset_commit
FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def fenced(error: KafkaError) -> bool:
    return error.code() in FENCED


def test_commit_and_abort_under_both_isolation_levels(bootstrap: str, topic_name: str) -> None:
    create_topics(bootstrap, {topic_name: 2})
    producer = transactional_producer(bootstrap, f"tx-{topic_name}")
    batches = [("c1", True), ("a1", False), ("c2", True), ("a2", False)]
    for prefix, commit in batches:
        producer.begin_transaction()
        send(producer, [(topic_name, i % 2, v) for i, v in enumerate(values(prefix, 10))])
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    wait_settled(bootstrap, partitions_of({topic_name: 2}))
    read = read_back(bootstrap, partitions_of({topic_name: 2}))
    for p in range(2):
        per = {prefix: values(prefix, 10)[p::2] for prefix, _ in batches}
        r = read[(topic_name, p)]
        assert r.committed == per["c1"] + per["c2"]
        assert r.uncommitted == per["c1"] + per["a1"] + per["c2"] + per["a2"]
        # One marker per transaction and partition takes an offset; none is ever delivered.
        assert r.high_watermark == len(r.uncommitted) + len(batches)
        assert r.last_stable_offset == r.high_watermark
    listed = {t.transactional_id: t.state for t in list_transactions(bootstrap, ["CompleteAbort"])}
    assert listed[f"tx-{topic_name}"] == "CompleteAbort"  # the shared broker lists others too


def test_transaction_over_two_topics_is_all_or_nothing(bootstrap: str, topic_name: str) -> None:
    topics = {f"{topic_name}-a": 2, f"{topic_name}-b": 1}
    tps = partitions_of(topics)
    create_topics(bootstrap, topics)
    producer = transactional_producer(bootstrap, f"tx-{topic_name}")

    def records(prefix: str) -> list[tuple[str, int, bytes]]:
        return [(t, p, f"{prefix}-{t[-1]}{p}-{i}".encode()) for t, p in tps for i in range(5)]

    def expected(prefix: str, tp: TP) -> list[bytes]:
        return [v for t, p, v in records(prefix) if (t, p) == tp]

    producer.begin_transaction()
    send(producer, records("one"))
    # Every record is in the log, and none is visible to read_committed while it is open.
    read = read_back(bootstrap, tps)
    for tp in tps:
        assert read[tp].uncommitted == expected("one", tp)
        assert read[tp].committed == []
        assert read[tp].last_stable_offset == 0
    ongoing = {t.transactional_id for t in list_transactions(bootstrap, ["Ongoing"])}
    assert f"tx-{topic_name}" in ongoing
    described = describe_transactions(bootstrap, [f"tx-{topic_name}"])[f"tx-{topic_name}"]
    assert described.transaction_state == "Ongoing"
    assert described.partitions == set(tps)
    producer.commit_transaction(30)

    producer.begin_transaction()
    send(producer, records("two"))
    producer.abort_transaction(30)
    wait_settled(bootstrap, tps)
    read = read_back(bootstrap, tps)
    for tp in tps:
        assert read[tp].committed == expected("one", tp)
        assert read[tp].uncommitted == expected("one", tp) + expected("two", tp)


def test_interleaved_transactions_on_one_partition(bootstrap: str, topic_name: str) -> None:
    """Two producers' transactions interleaved in one partition, one aborted, one committed,
    with plain records between: read_committed drops exactly the aborted producer's records,
    also when it starts reading in the middle of the aborted transaction."""
    create_topics(bootstrap, {topic_name: 1})
    tp = (topic_name, 0)
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **QUIET})
    aborting = transactional_producer(bootstrap, f"tx-a-{topic_name}")
    committing = transactional_producer(bootstrap, f"tx-c-{topic_name}")
    aborting.begin_transaction()
    committing.begin_transaction()
    offsets: dict[bytes, int] = {}
    for round_ in range(3):
        for producer, name in ((aborting, "a"), (committing, "c"), (plain, "p")):
            value = f"{name}{round_}".encode()
            [(_, _, offset, _)] = send(producer, [(topic_name, 0, value)]).acked
            offsets[value] = offset
    aborting.abort_transaction(30)
    committing.commit_transaction(30)
    wait_settled(bootstrap, [tp])

    read = read_back(bootstrap, [tp])[tp]
    assert read.uncommitted == [b"a0", b"c0", b"p0", b"a1", b"c1", b"p1", b"a2", b"c2", b"p2"]
    assert read.committed == [b"c0", b"p0", b"c1", b"p1", b"c2", b"p2"]
    # Start inside the aborted transaction, past its first record.
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"r-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            **QUIET,
        }
    )
    reader.assign([TopicPartition(topic_name, 0, offsets[b"a1"])])
    seen: list[bytes] = []
    deadline = time.monotonic() + 15
    while seen[-1:] != [b"p2"]:
        assert time.monotonic() < deadline, seen
        seen += [m.value() for m in reader.consume(100, 0.1) if m.error() is None]
    reader.close()
    assert seen == [b"c1", b"p1", b"c2", b"p2"]


def test_zombie_is_fenced_by_a_new_instance(bootstrap: str, topic_name: str) -> None:
    create_topics(bootstrap, {topic_name: 2})
    tps = partitions_of({topic_name: 2})
    txn_id = f"tx-{topic_name}"
    zombie = transactional_producer(bootstrap, txn_id)
    zombie.begin_transaction()
    send(zombie, [(topic_name, i % 2, v) for i, v in enumerate(values("zombie", 6))])

    successor = transactional_producer(bootstrap, txn_id)  # fences the zombie, aborts its txn
    successor.begin_transaction()
    send(successor, [(topic_name, i % 2, v) for i, v in enumerate(values("new", 6))])

    # The zombie's next produce fails as fenced (a fatal error, which flush raises), and so
    # does its commit.
    zombie.produce(topic_name, b"late", partition=0)
    with pytest.raises(KafkaException) as caught:
        zombie.flush(30)
    assert fenced(caught.value.args[0]), caught.value
    assert caught.value.args[0].fatal()
    with pytest.raises(KafkaException) as caught:
        zombie.commit_transaction(30)
    assert fenced(caught.value.args[0]), caught.value
    assert caught.value.args[0].fatal()

    successor.commit_transaction(30)
    wait_settled(bootstrap, tps)
    read = read_back(bootstrap, tps)
    for p in range(2):
        assert read[(topic_name, p)].committed == values("new", 6)[p::2]
        assert (
            read[(topic_name, p)].uncommitted == values("zombie", 6)[p::2] + values("new", 6)[p::2]
        )
    state = describe_transactions(bootstrap, [txn_id])[txn_id]
    assert state.transaction_state == "CompleteCommit"


def test_hung_transaction_is_aborted_by_the_broker_timeout(
    timeout_broker: EmbeddedBroker, topic_name: str
) -> None:
    bootstrap = timeout_broker.bootstrap
    create_topics(bootstrap, {topic_name: 2})
    tps = partitions_of({topic_name: 2})
    plain = Producer({"bootstrap.servers": bootstrap, **QUIET})
    txn_id = f"tx-{topic_name}"
    hung = transactional_producer(bootstrap, txn_id, **{"transaction.timeout.ms": 1500})
    hung.begin_transaction()
    send(hung, [(topic_name, i % 2, v) for i, v in enumerate(values("hung", 4))])
    send(plain, [(topic_name, p, f"after-{p}".encode()) for p in range(2)])
    assert list_offsets(bootstrap, tps, 1) == dict.fromkeys(tps, 0)  # held back by the open txn
    started = time.monotonic()
    wait_settled(bootstrap, tps, timeout=15)  # the broker aborts it: the LSO moves on
    assert time.monotonic() - started < 10
    read = read_back(bootstrap, tps)
    for p in range(2):
        assert read[(topic_name, p)].committed == [f"after-{p}".encode()]
    state = describe_transactions(bootstrap, [txn_id])[txn_id]
    assert state.transaction_state == "CompleteAbort"
    # The old producer's epoch was bumped: it is fenced.
    with pytest.raises(KafkaException) as caught:
        hung.commit_transaction(30)
    assert fenced(caught.value.args[0]), caught.value


def test_consume_transform_produce_offsets_stick_only_on_commit(
    bootstrap: str, topic_name: str
) -> None:
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topics(bootstrap, {source: 2, sink: 1})
    plain = Producer({"bootstrap.servers": bootstrap, **QUIET})
    send(plain, [(source, p, f"in-{p}-{i}".encode()) for p in range(2) for i in range(10)])
    group = f"g-{topic_name}"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            **QUIET,
        }
    )
    consumer.subscribe([source])
    inputs: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    deadline = time.monotonic() + 30
    while sum(map(len, inputs.values())) < 20:
        assert time.monotonic() < deadline, inputs
        msg = consumer.poll(0.2)
        if msg is not None:
            assert msg.error() is None, msg.error()
            inputs[msg.partition()].append((msg.offset(), msg.value()))
    producer = transactional_producer(bootstrap, f"tx-{topic_name}")

    def committed() -> list[int]:
        checker = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **QUIET})
        try:
            found = checker.committed([TopicPartition(source, p) for p in range(2)], timeout=15)
        finally:
            checker.close()
        return [tp.offset for tp in found]

    def transform(upto: int, start: int, commit: bool) -> None:
        """Copy offsets [start, upto) of each input partition, upper-cased, with offsets."""
        producer.begin_transaction()
        out = [(sink, 0, v.upper()) for p in range(2) for o, v in inputs[p] if start <= o < upto]
        send(producer, out)
        offsets = [TopicPartition(source, p, upto) for p in range(2)]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
        # While pending: UNSTABLE_OFFSET_COMMIT to RequireStable, the old offset otherwise.
        before = start or -1
        assert fetch_committed_offset(bootstrap, group, (source, 0), True)[0] == UNSTABLE
        assert fetch_committed_offset(bootstrap, group, (source, 0), False) == (OK, before)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    transform(5, 0, commit=True)
    assert committed() == [5, 5]
    transform(10, 5, commit=False)
    assert committed() == [5, 5]  # the aborted transaction's offsets never became visible
    transform(10, 5, commit=True)
    assert committed() == [10, 10]
    consumer.close()

    read = read_back(bootstrap, [(sink, 0)])[(sink, 0)]
    expected = sorted(v.upper() for p in range(2) for _, v in inputs[p])
    assert sorted(read.committed) == expected
    assert len(read.uncommitted) == len(expected) + 10  # the aborted copy of the second half


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_open_transaction_holds_back_read_committed_readers(
    bootstrap: str, topic_name: str, commit: bool
) -> None:
    create_topics(bootstrap, {topic_name: 1})
    tp = (topic_name, 0)
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **QUIET})
    send(plain, [(topic_name, 0, v) for v in values("before", 5)])
    producer = transactional_producer(bootstrap, f"tx-{topic_name}")
    producer.begin_transaction()
    send(producer, [(topic_name, 0, v) for v in values("txn", 3)])
    send(plain, [(topic_name, 0, v) for v in values("after", 5)])

    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"r-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 20,
            **QUIET,
        }
    )
    reader.assign([TopicPartition(topic_name, 0, 0)])
    seen: list[bytes] = []

    def poll_until(n: int) -> None:
        deadline = time.monotonic() + 15
        while len(seen) < n:
            assert time.monotonic() < deadline, seen
            for msg in reader.consume(100, 0.1):
                assert msg.error() is None, msg.error()
                seen.append(msg.value())

    poll_until(5)
    assert seen == values("before", 5)
    # The reader keeps fetching for a while: nothing at or after the open transaction arrives.
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        assert reader.consume(100, 0.05) == []
    assert list_offsets(bootstrap, [tp], 1) == {tp: 5}
    assert list_offsets(bootstrap, [tp], 0) == {tp: 13}

    if commit:
        producer.commit_transaction(30)
        poll_until(13)
        assert seen == values("before", 5) + values("txn", 3) + values("after", 5)
    else:
        producer.abort_transaction(30)
        poll_until(10)
        assert seen == values("before", 5) + values("after", 5)
    reader.close()
    wait_settled(bootstrap, [tp])


def test_timeout_above_transaction_max_timeout_is_refused(bootstrap: str) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": 900_001,  # the broker's transaction.max.timeout.ms + 1
            **QUIET,
        }
    )
    with pytest.raises(KafkaException) as caught:
        producer.init_transactions(30)
    assert caught.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT


def test_state_errors_the_client_catches_itself(bootstrap: str, topic_name: str) -> None:
    """librdkafka refuses commit/abort without begin and produce outside a transaction
    locally; the broker is left with no transaction open for the id."""
    create_topics(bootstrap, {topic_name: 1})
    txn_id = f"tx-{topic_name}"
    producer = transactional_producer(bootstrap, txn_id)
    for action in (producer.commit_transaction, producer.abort_transaction):
        with pytest.raises(KafkaException) as caught:
            action(10)
        assert caught.value.args[0].code() == KafkaError._STATE
    with pytest.raises(KafkaException) as caught:
        producer.produce(topic_name, b"outside")
    assert caught.value.args[0].code() == KafkaError._STATE
    assert describe_transactions(bootstrap, [txn_id])[txn_id].transaction_state == "Empty"
    producer.begin_transaction()
    send(producer, [(topic_name, 0, b"inside")])
    producer.commit_transaction(30)
    wait_for(
        lambda: read_back(bootstrap, [(topic_name, 0)])[(topic_name, 0)].committed == [b"inside"],
        10,
        "committed record visible",
    )


# -- what no client here lets you send: the same mistakes as raw requests ----------------------


def add_partitions(
    bootstrap: str, version: int, txn_id: str, pid: int, epoch: int, tp: TP
) -> ErrorCode:
    module = importlib.import_module(f"kio.schema.add_partitions_to_txn.v{version}.request")
    request = module.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=TransactionalId(txn_id),
        v3_and_below_producer_id=ProducerId(pid),
        v3_and_below_producer_epoch=i16(epoch),
        v3_and_below_topics=(
            module.AddPartitionsToTxnTopic(name=TopicName(tp[0]), partitions=(i32(tp[1]),)),
        ),
    )
    response = call(bootstrap, request)
    [topic] = response.results_by_topic_v3_and_below
    [partition] = topic.results_by_partition
    return partition.partition_error_code


def end_txn_settled(bootstrap: str, txn_id: str, pid: int, epoch: int, commit: bool) -> ErrorCode:
    """EndTxn, asked again while the broker answers CONCURRENT_TRANSACTIONS (markers still
    being written), as clients do."""
    deadline = time.monotonic() + 10
    while (error := end_txn(bootstrap, txn_id, pid, epoch, commit)) == (
        ErrorCode.concurrent_transactions
    ):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return error


def test_raw_mistakes_get_kafkas_errors(bootstrap: str, topic_name: str) -> None:
    create_topics(bootstrap, {topic_name: 2})
    p0, p1 = (topic_name, 0), (topic_name, 1)
    txn_id = f"raw-{topic_name}"
    error, pid, epoch = init_producer_id(bootstrap, txn_id)
    assert error == ErrorCode.none

    # EndTxn with nothing begun.
    assert end_txn(bootstrap, txn_id, pid, epoch, commit=True) == ErrorCode.invalid_txn_state
    assert end_txn(bootstrap, txn_id, pid, epoch, commit=False) == ErrorCode.invalid_txn_state
    # Unknown producer id for this transactional id.
    assert add_partitions(bootstrap, 1, txn_id, pid + 1000, epoch, p0) == (
        ErrorCode.invalid_producer_id_mapping
    )
    assert add_partitions(bootstrap, 1, txn_id, pid, epoch, p0) == ErrorCode.none
    # KIP-890: a transactional batch for a partition not in the transaction is refused.
    error, _ = produce_batch(bootstrap, p1, pid, epoch, 0, [b"sneaky"], transactional_id=txn_id)
    assert error == ErrorCode.invalid_txn_state
    assert produce_batch(bootstrap, p0, pid, epoch, 0, [b"in-txn"], txn_id) == (ErrorCode.none, 0)
    # A non-transactional batch from a producer with an open transaction.
    error, _ = produce_batch(bootstrap, p0, pid, epoch, 1, [b"plain"])
    assert error == ErrorCode.invalid_txn_state

    assert end_txn(bootstrap, txn_id, pid, epoch, commit=True) == ErrorCode.none
    # A retried EndTxn once complete is answered NONE; the other result is refused.
    assert end_txn_settled(bootstrap, txn_id, pid, epoch, commit=True) == ErrorCode.none
    assert end_txn(bootstrap, txn_id, pid, epoch, commit=False) == ErrorCode.invalid_txn_state

    # A new instance bumps the epoch: every request of the old one is fenced, under the code
    # each version knows (PRODUCER_FENCED from v2 of AddPartitionsToTxn/EndTxn, else
    # INVALID_PRODUCER_EPOCH), and so is its produce.
    error, new_pid, new_epoch = init_producer_id(bootstrap, txn_id)
    assert (error, new_pid, new_epoch) == (ErrorCode.none, pid, epoch + 1)
    assert add_partitions(bootstrap, 1, txn_id, pid, epoch, p0) == ErrorCode.invalid_producer_epoch
    assert add_partitions(bootstrap, 3, txn_id, pid, epoch, p0) == ErrorCode.producer_fenced
    assert end_txn(bootstrap, txn_id, pid, epoch, commit=True) == ErrorCode.invalid_producer_epoch
    error, _ = produce_batch(bootstrap, p0, pid, epoch, 1, [b"zombie"], transactional_id=txn_id)
    assert error == ErrorCode.invalid_producer_epoch

    wait_settled(bootstrap, [p0, p1])
    read = read_back(bootstrap, [p0, p1])
    assert read[p0].committed == read[p0].uncommitted == [b"in-txn"]
    assert read[p1].uncommitted == []
    state = describe_transactions(bootstrap, [txn_id])[txn_id]
    assert (state.transaction_state, state.producer_epoch) == ("Empty", epoch + 1)


def test_end_txn_is_answered_at_the_decision_and_the_next_transaction_waits_for_markers(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str
) -> None:
    """As Kafka, EndTxn is answered once PrepareCommit is durable, before the markers. Where
    Kafka answers the next transaction's AddPartitionsToTxn with CONCURRENT_TRANSACTIONS until
    they are written, onceflow holds that request until they are, then answers it."""
    # The markers start 3 s after the decision, so the state in between can be looked at.
    broker = make_broker(env={"ONCEFLOW_DELAY_AT": "txn.before-markers:3000"})
    bootstrap = broker.bootstrap
    create_topics(bootstrap, {topic_name: 1})
    tp = (topic_name, 0)
    txn_id = f"early-{topic_name}"
    error, pid, epoch = init_producer_id(bootstrap, txn_id)
    assert error == OK
    assert add_partitions(bootstrap, 3, txn_id, pid, epoch, tp) == OK
    assert produce_batch(bootstrap, tp, pid, epoch, 0, [b"first"], txn_id) == (OK, 0)

    assert end_txn(bootstrap, txn_id, pid, epoch, commit=True) == OK
    # Answered while decided but not complete: no marker yet, the record still unstable.
    assert describe_transactions(bootstrap, [txn_id])[txn_id].transaction_state == "PrepareCommit"
    assert list_offsets(bootstrap, [tp], READ_COMMITTED) == {tp: 0}

    # The next transaction's first request is held until the markers are written, then added.
    assert add_partitions(bootstrap, 3, txn_id, pid, epoch, tp) == OK
    assert describe_transactions(bootstrap, [txn_id])[txn_id].transaction_state == "Ongoing"
    assert list_offsets(bootstrap, [tp], READ_COMMITTED) == {tp: 2}  # the record, its marker
    assert produce_batch(bootstrap, tp, pid, epoch, 1, [b"second"], txn_id) == (OK, 2)
    assert end_txn(bootstrap, txn_id, pid, epoch, commit=True) == OK
    wait_settled(bootstrap, [tp])
    assert read_back(bootstrap, [tp])[tp].committed == [b"first", b"second"]
