"""DeleteRecords (kafka-delete-records, AdminClient.deleteRecords) as Kafka answers it: the
log start offset moves (earliest offsets, reads below it refused), it survives kill -9, the
segments wholly below it are deleted at the next retention check, and the refusals carry
Kafka's codes (OFFSET_OUT_OF_RANGE past the high watermark, POLICY_VIOLATION on a compacted
topic, INVALID_TOPIC_EXCEPTION on an internal one)."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.delete_records.v2.request import (
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
)
from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.static.primitive import i32, i32Timedelta, i64

from onceflow.broker.embedded import EmbeddedBroker
from tests.admin_requests import call, list_offsets
from tests.confluent import QUIET, create_topic, send, transactional_producer
from tests.waiting import wait_for

READ_COMMITTED = 1


def delete_records(bootstrap: str, topic: str, partition: int, offset: int) -> int:
    """The low watermark DeleteRecords answers (KafkaException on the partition's error)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    futures = admin.delete_records([TopicPartition(topic, partition, offset)])
    (future,) = futures.values()
    return future.result(timeout=30).low_watermark


def refused(bootstrap: str, topic: str, partition: int, offset: int) -> int:
    with pytest.raises(KafkaException) as raised:
        delete_records(bootstrap, topic, partition, offset)
    return raised.value.args[0].code()


def earliest(bootstrap: str, topic: str, partition: int = 0) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", **QUIET})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[0]
    finally:
        consumer.close()


def fill(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **QUIET})
    for i in range(count):
        producer.produce(topic, value=b"record-%03d" % i, partition=0)
        producer.flush(10)  # one batch each: the small segments roll between them
    assert producer.flush(30) == 0


def first_offset_read(bootstrap: str, topic: str) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "auto.offset.reset": "earliest",
            **QUIET,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])  # below the log start offset
        msg = wait_for(lambda: consumer.poll(0.5), 30, "a record")
        assert msg.error() is None, msg.error()
        return msg.offset()
    finally:
        consumer.close()


def test_delete_records_moves_the_log_start_offset_durably(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path, topic_name: str
) -> None:
    data_dir = tmp_path / "data"
    broker = make_broker(data_dir, settings={"log.retention.check.interval.ms": "200"})
    create_topic(broker.bootstrap, topic_name, **{"segment.bytes": "200"})
    fill(broker.bootstrap, topic_name, 10)
    directory = data_dir / f"{topic_name}-0"
    before = sorted(directory.glob("*.log"))
    assert len(before) >= 4, before

    assert delete_records(broker.bootstrap, topic_name, 0, 6) == 6
    assert earliest(broker.bootstrap, topic_name) == 6
    # A consumer placed below it is out of range and resets to it (auto.offset.reset).
    assert first_offset_read(broker.bootstrap, topic_name) == 6
    # Not backwards: a lower offset answers the current low watermark.
    assert delete_records(broker.bootstrap, topic_name, 0, 2) == 6

    # The segments wholly below it go at the next retention check: the one holding 6 is first.
    holding = max(int(p.stem) for p in before if int(p.stem) <= 6)

    def first_base() -> int:
        return min(int(p.stem) for p in directory.glob("*.log"))

    wait_for(lambda: first_base() == holding, 30, lambda: f"first segment {first_base()}")

    broker.kill()
    broker.start()
    assert earliest(broker.bootstrap, topic_name) == 6
    # -1 is the high watermark.
    assert delete_records(broker.bootstrap, topic_name, 0, -1) == 10
    broker.kill()
    broker.start()
    assert earliest(broker.bootstrap, topic_name) == 10


def test_delete_records_refusals(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str
) -> None:
    broker = make_broker()
    create_topic(broker.bootstrap, topic_name)
    fill(broker.bootstrap, topic_name, 3)
    b = broker.bootstrap
    assert refused(b, topic_name, 0, 4) == KafkaError.OFFSET_OUT_OF_RANGE
    compacted = f"{topic_name}-compact"
    create_topic(b, compacted, **{"cleanup.policy": "compact"})
    assert refused(b, compacted, 0, 0) == KafkaError.POLICY_VIOLATION
    # (librdkafka waits for an internal topic's metadata: the request is sent by hand)
    answer = call(
        b,
        DeleteRecordsRequest(
            topics=(
                DeleteRecordsTopic(
                    name=TopicName("__consumer_offsets"),
                    partitions=(DeleteRecordsPartition(partition_index=i32(0), offset=i64(0)),),
                ),
            ),
            timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        ),
    )
    (internal,) = answer.topics[0].partitions
    assert (internal.error_code, internal.low_watermark) == (ErrorCode.invalid_topic_exception, -1)
    assert earliest(b, topic_name) == 0


def test_a_transaction_open_across_the_log_start_offset_holds_the_lso_at_its_start(
    bootstrap: str, topic_name: str
) -> None:
    """As Apache Kafka 4.4 answers (the conformance suite's DeleteRecords scenario): the last
    stable offset stays at the open transaction's first offset, below the new log start
    offset, until the transaction ends."""
    create_topic(bootstrap, topic_name)
    producer = transactional_producer(bootstrap, f"{topic_name}-txn")
    producer.begin_transaction()
    send(producer, [(topic_name, 0, b"open-0"), (topic_name, 0, b"open-1")])
    tp = (topic_name, 0)
    assert list_offsets(bootstrap, [tp], READ_COMMITTED) == {tp: 0}
    assert delete_records(bootstrap, topic_name, 0, 1) == 1
    assert list_offsets(bootstrap, [tp], READ_COMMITTED) == {tp: 0}
    producer.commit_transaction(30)
    # The markers are written after EndTxn is answered, as in Kafka: past the marker soon.
    wait_for(
        lambda: list_offsets(bootstrap, [tp], READ_COMMITTED) == {tp: 3},
        30,
        lambda: f"LSO 3, not {list_offsets(bootstrap, [tp], READ_COMMITTED)}",
    )
