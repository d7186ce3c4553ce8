"""confluent-kafka (librdkafka) helpers of the tests: topics, producers, reading back."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TP = tuple[str, int]
# librdkafka logs every refused connection while a broker is down; the tests check outcomes.
QUIET: dict[str, object] = {"log_level": 0}


def create_topics(bootstrap: str, topics: Mapping[str, int], **configs: str) -> None:
    """Create each topic (name: partitions) with `configs`; every creation must succeed."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    futures = admin.create_topics(
        [NewTopic(name, n, 1, config=configs) for name, n in topics.items()]
    )
    for future in futures.values():
        future.result(timeout=15)


def create_topic(bootstrap: str, name: str, partitions: int = 1, **configs: str) -> None:
    create_topics(bootstrap, {name: partitions}, **configs)


def partitions_of(topics: Mapping[str, int]) -> list[TP]:
    return [(name, p) for name, n in topics.items() for p in range(n)]


def transactional_producer(bootstrap: str, transactional_id: str, **conf: object) -> Producer:
    """A confluent-kafka transactional producer, initialised (InitProducerId done)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "linger.ms": 2,
            **QUIET,
            **conf,
        }
    )
    producer.init_transactions(30)
    return producer


class Deliveries:
    """Delivery reports of one producer: what was acknowledged where, and what failed."""

    def __init__(self) -> None:
        self.acked: list[tuple[str, int, int, bytes]] = []  # topic, partition, offset, value
        self.failed: list[tuple[bytes, KafkaError]] = []

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failed.append((msg.value(), err))
        else:
            self.acked.append((msg.topic(), msg.partition(), msg.offset(), msg.value()))


def send(producer: Producer, records: Iterable[tuple[str, int, bytes]]) -> Deliveries:
    """Produce (topic, partition, value) records and flush; every one must be acknowledged."""
    deliveries = Deliveries()
    for topic, partition, value in records:
        producer.produce(topic, value=value, partition=partition, on_delivery=deliveries)
    assert producer.flush(30) == 0, "records still queued after 30 s"
    assert deliveries.failed == []
    return deliveries


def produce(
    bootstrap: str, topic: str, values: list[bytes], **conf: object
) -> list[tuple[int, int]]:
    """Produce and return (partition, offset) of each delivered record, failing on any error."""
    deliveries = Deliveries()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", **conf})
    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=str(i).encode(), on_delivery=deliveries)
    assert producer.flush(30) == 0
    assert deliveries.failed == []
    return [(partition, offset) for _, partition, offset, _ in deliveries.acked]


def consume_all(
    bootstrap: str, topic: str, partitions: int, timeout: float = 30, **conf: object
) -> list[object]:
    """Every record below the high watermarks as they are when called, in partition order."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False, **conf}
    )
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
        for p in range(partitions)
    }
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[object] = []
    position = dict.fromkeys(range(partitions), 0)
    deadline = time.monotonic() + timeout
    while any(position[p] < ends[p] for p in ends):
        assert time.monotonic() < deadline, f"read up to {position}, wanted {ends}"
        for msg in consumer.consume(1000, timeout=0.5):
            assert msg.error() is None, msg.error()
            out.append(msg)
            position[msg.partition()] = msg.offset() + 1
    consumer.close()
    return out
