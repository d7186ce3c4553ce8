"""kafka-python transactional producers (KafkaProducer(transactional_id=...)) and its
read_committed consumer against the broker: commit, abort, atomicity over several partitions,
fencing of a zombie, the broker's transaction timeout, consume-transform-produce with
send_offsets_to_transaction (KIP-447 group metadata), and the errors for client mistakes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

import kafka.errors as errors
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from onceflow.broker.embedded import EmbeddedBroker
from tests.admin_requests import list_offsets
from tests.clients.kafka_python_consumer import subscribe
from tests.confluent import TP, create_topics, partitions_of
from tests.eos import client_transactions as shared
from tests.eos.checker import read_back, wait_settled

FENCED = (errors.ProducerFencedError, errors.InvalidProducerEpochError)


def producer_for(bootstrap: str, transactional_id: str, **conf: object) -> KafkaProducer:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=transactional_id, linger_ms=2, **conf
    )
    producer.init_transactions()
    return producer


def send_all(producer: KafkaProducer, records: list[tuple[str, int, bytes]]) -> None:
    futures = [producer.send(t, v, partition=p) for t, p, v in records]
    producer.flush(30)
    for future in futures:
        future.get(timeout=30)  # raises if the record was not acknowledged


def read_with_kafka_python(
    bootstrap: str, ends: Mapping[TP, int], isolation_level: str, timeout: float = 20
) -> dict[TP, list[bytes]]:
    """kafka-python's own consumer from offset 0 until its position reaches each end."""
    consumer = KafkaConsumer(**shared.own_consumer_conf(bootstrap, isolation_level))
    tps = shared.assign_from_start(consumer, ends, TopicPartition)
    out: dict[TP, list[bytes]] = {tp: [] for tp in ends}
    deadline = time.monotonic() + timeout
    try:
        while any(consumer.position(tp) < ends[(tp.topic, tp.partition)] for tp in tps):
            assert time.monotonic() < deadline, f"{isolation_level}: short of {ends}"
            for tp, messages in consumer.poll(100).items():
                out[(tp.topic, tp.partition)] += [
                    m.value for m in messages if m.offset < ends[(tp.topic, tp.partition)]
                ]
    finally:
        consumer.close()
    return out


def assert_commit_fenced(producer: KafkaProducer, timeout: float = 15) -> None:
    """commit_transaction of a fenced producer fails with PRODUCER_FENCED. kafka-python first
    tries a KIP-360 epoch bump after its produce got INVALID_PRODUCER_EPOCH (refusing commits
    meanwhile); the broker answers the bump PRODUCER_FENCED, which becomes its fatal error."""
    deadline = time.monotonic() + timeout
    while True:
        with pytest.raises(errors.KafkaError) as caught:
            producer.commit_transaction()
        if "BUMPING_PRODUCER_EPOCH" not in str(caught.value):
            break
        assert time.monotonic() < deadline, "kafka-python still bumping its epoch"
        time.sleep(0.05)
    error = caught.value
    assert isinstance(error, FENCED) or "ProducerFencedError" in str(error), repr(error)


def test_commit_and_abort_seen_by_both_isolation_levels(bootstrap: str, topic_name: str) -> None:
    create_topics(bootstrap, {topic_name: 2})
    tps = partitions_of({topic_name: 2})
    producer = producer_for(bootstrap, f"kp-{topic_name}")
    for prefix, commit in shared.BATCHES:
        producer.begin_transaction()
        send_all(producer, shared.over_two_partitions(topic_name, prefix, 8))
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    producer.close()
    wait_settled(bootstrap, tps)
    read = read_back(bootstrap, tps)
    lso = list_offsets(bootstrap, tps, 1)
    own_committed = read_with_kafka_python(bootstrap, lso, "read_committed")
    own_uncommitted = read_with_kafka_python(bootstrap, lso, "read_uncommitted")
    shared.check_commit_and_abort(topic_name, read, own_committed, own_uncommitted)


def test_transaction_over_two_topics_is_all_or_nothing(bootstrap: str, topic_name: str) -> None:
    topics = {f"{topic_name}-a": 2, f"{topic_name}-b": 1}
    tps = partitions_of(topics)
    create_topics(bootstrap, topics)
    producer = producer_for(bootstrap, f"kp-{topic_name}")
    records = [(t, p, f"{t[-1]}{p}-{i}".encode()) for t, p in tps for i in range(4)]
    producer.begin_transaction()
    send_all(producer, records)
    assert list_offsets(bootstrap, tps, 1) == dict.fromkeys(tps, 0)
    assert all(r.committed == [] for r in read_back(bootstrap, tps).values())
    producer.commit_transaction()
    wait_settled(bootstrap, tps)
    committed = read_with_kafka_python(bootstrap, list_offsets(bootstrap, tps, 1), "read_committed")
    for tp in tps:
        assert committed[tp] == [v for t, p, v in records if (t, p) == tp]
    producer.close()


def test_zombie_is_fenced_by_a_new_instance(bootstrap: str, topic_name: str) -> None:
    create_topics(bootstrap, {topic_name: 2})
    txn_id = f"kp-{topic_name}"
    zombie = producer_for(bootstrap, txn_id)
    zombie.begin_transaction()
    send_all(zombie, shared.over_two_partitions(topic_name, "zombie", 4))
    successor = producer_for(bootstrap, txn_id)

    late = zombie.send(topic_name, b"late", partition=0)
    with pytest.raises(FENCED):
        late.get(timeout=30)
    assert_commit_fenced(zombie)
    zombie.close(timeout=5)

    successor.begin_transaction()
    send_all(successor, shared.over_two_partitions(topic_name, "new", 4))
    successor.commit_transaction()
    successor.close()
    shared.check_successor_won(bootstrap, topic_name, shared.values("new", 4))


def test_hung_transaction_is_aborted_by_the_broker_timeout(
    timeout_broker: EmbeddedBroker, topic_name: str
) -> None:
    bootstrap, tp, txn_id = shared.hung_transaction_setup(timeout_broker, topic_name, "kp")
    hung = producer_for(bootstrap, txn_id, transaction_timeout_ms=1500)
    hung.begin_transaction()
    send_all(hung, [(topic_name, 0, v) for v in shared.values("hung", 3)])
    plain = KafkaProducer(bootstrap_servers=bootstrap)
    plain.send(topic_name, b"after", partition=0).get(timeout=30)
    plain.close()
    shared.check_hung_then_aborted(bootstrap, tp, txn_id)
    assert read_with_kafka_python(bootstrap, {tp: 5}, "read_committed") == {tp: [b"after"]}
    assert_commit_fenced(hung)
    hung.close(timeout=5)


def test_consume_transform_produce_offsets_stick_only_on_commit(
    bootstrap: str, topic_name: str
) -> None:
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topics(bootstrap, {source: 1, sink: 1})
    plain = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(10):
        plain.send(source, f"in-{i}".encode(), partition=0)
    plain.flush()
    plain.close()
    group = f"g-{topic_name}"
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    subscribe(consumer, source)  # after its metadata: kafka-python's first-join race
    inputs: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 30
    while len(inputs) < 10:
        assert time.monotonic() < deadline, inputs
        for messages in consumer.poll(200).values():
            inputs += [(m.offset, m.value) for m in messages]
    metadata = consumer.group_metadata()
    assert metadata.generation_id >= 0  # a real member: the broker checks it (KIP-447)
    producer = producer_for(bootstrap, f"kp-{topic_name}")
    source_tp = TopicPartition(source, 0)

    def transform(start: int, upto: int, commit: bool) -> None:
        producer.begin_transaction()
        send_all(producer, [(sink, 0, v.upper()) for o, v in inputs if start <= o < upto])
        producer.send_offsets_to_transaction({source_tp: OffsetAndMetadata(upto, "", -1)}, metadata)
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()

    def committed() -> int | None:
        checker = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
        try:
            return checker.committed(source_tp)
        finally:
            checker.close()

    transform(0, 4, commit=True)
    wait_settled(bootstrap, [(source, 0), (sink, 0)])
    assert committed() == 4
    transform(4, 10, commit=False)
    wait_settled(bootstrap, [(source, 0), (sink, 0)])
    assert committed() == 4
    transform(4, 10, commit=True)
    wait_settled(bootstrap, [(source, 0), (sink, 0)])
    assert committed() == 10
    consumer.close()
    producer.close()
    read = read_back(bootstrap, [(sink, 0)])[(sink, 0)]
    assert read.committed == [v.upper() for _, v in inputs]


def test_client_mistakes(bootstrap: str, topic_name: str) -> None:
    create_topics(bootstrap, {topic_name: 1})
    too_long = KafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"kp-{uuid.uuid4().hex[:8]}",
        transaction_timeout_ms=900_001,  # the broker's transaction.max.timeout.ms + 1
    )
    with pytest.raises(errors.KafkaError) as caught:
        too_long.init_transactions()
    # kafka-python wraps the broker's error code 50 in a generic KafkaError
    assert "InvalidTransactionTimeoutError" in str(caught.value), repr(caught.value)
    too_long.close(timeout=5)

    producer = producer_for(bootstrap, f"kp-{topic_name}")
    # kafka-python refuses these locally and never sends them
    for action in (producer.commit_transaction, producer.abort_transaction):
        with pytest.raises(
            errors.KafkaError, match="Invalid transition attempted from state READY"
        ):
            action()
    with pytest.raises(errors.IllegalStateError):
        producer.send(topic_name, b"outside")
    producer.begin_transaction()
    send_all(producer, [(topic_name, 0, b"inside")])
    producer.commit_transaction()
    producer.close()
    shared.check_committed(bootstrap, (topic_name, 0), [b"inside"])
