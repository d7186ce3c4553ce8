"""confluent-kafka (librdkafka) against the broker: admin, produce, consume, groups."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions

from tests.confluent import consume_all, create_topic, produce


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_consume_each_compression(
    bootstrap: str, topic_name: str, compression: str
) -> None:
    create_topic(bootstrap, topic_name, partitions=3)
    values = [f"value-{i}-".encode() * 7 for i in range(3000)]
    delivered = produce(bootstrap, topic_name, values, **{"compression.type": compression})
    assert len(delivered) == len(values)
    got = consume_all(bootstrap, topic_name, 3)
    assert len(got) == len(values)
    assert sorted(m.value() for m in got) == sorted(values)
    # Offsets within each partition are contiguous from 0 and keys come back with values.
    by_partition: dict[int, list[int]] = {}
    for m in got:
        by_partition.setdefault(m.partition(), []).append(m.offset())
        assert values[int(m.key())] == m.value()
    for offsets in by_partition.values():
        assert offsets == list(range(len(offsets)))


def test_headers_timestamps_and_null_values(bootstrap: str, topic_name: str) -> None:
    create_topic(bootstrap, topic_name)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(
        topic_name,
        value=None,
        key=b"k",
        headers=[("h1", b"v1"), ("h2", None)],
        timestamp=1_600_000_000_123,
    )
    assert producer.flush(10) == 0
    [msg] = consume_all(bootstrap, topic_name, 1)
    assert msg.value() is None and msg.key() == b"k"
    assert msg.headers() == [("h1", b"v1"), ("h2", None)]
    assert msg.timestamp() == (1, 1_600_000_000_123)


def test_admin_describe_configs_and_partitions(bootstrap: str, topic_name: str) -> None:
    create_topic(bootstrap, topic_name, partitions=2, **{"retention.ms": "3600000"})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(topic_name, timeout=10)
    assert len(metadata.topics[topic_name].partitions) == 2
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["retention.ms"].value == "3600000"
    assert configs["cleanup.policy"].value == "delete"
    admin.create_partitions([NewPartitions(topic_name, 4)])[topic_name].result(timeout=10)
    assert len(admin.list_topics(topic_name, timeout=10).topics[topic_name].partitions) == 4
    with pytest.raises(Exception, match=r"TOPIC_ALREADY_EXISTS|already exists"):
        create_topic(bootstrap, topic_name)
    admin.delete_topics([topic_name])[topic_name].result(timeout=10)
    assert topic_name not in admin.list_topics(timeout=10).topics


def test_list_offsets_by_timestamp(bootstrap: str, topic_name: str) -> None:
    create_topic(bootstrap, topic_name)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(10):
        producer.produce(topic_name, value=b"x", timestamp=1_000_000 + i * 1000)
        producer.flush(10)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g"})
    low, high = consumer.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10)
    assert (low, high) == (0, 10)
    [tp] = consumer.offsets_for_times([TopicPartition(topic_name, 0, 1_004_500)], timeout=10)
    assert tp.offset == 5
    [tp] = consumer.offsets_for_times([TopicPartition(topic_name, 0, 9_999_999)], timeout=10)
    assert tp.offset == -1
    consumer.close()


def test_a_batch_larger_than_a_segment_is_refused_with_record_list_too_large(
    bootstrap: str, topic_name: str
) -> None:
    """As Kafka: a batch never spans segments, so one over segment.bytes gets
    RECORD_LIST_TOO_LARGE (not a closed connection); smaller batches still go in."""
    create_topic(bootstrap, topic_name, 1, **{"segment.bytes": "300"})
    results: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "retries": 0})
    producer.produce(topic_name, b"x" * 400, on_delivery=lambda err, _m: results.append(err))
    producer.flush(30)
    [error] = results
    assert error is not None and error.code() == KafkaError.RECORD_LIST_TOO_LARGE, error
    assert produce(bootstrap, topic_name, [b"small"]) == [(0, 0)]
