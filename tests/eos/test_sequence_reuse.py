"""A producer that reuses sequence numbers for other records is refused, not acknowledged.

librdkafka's abort_transaction() purges the messages waiting in its queues, those waiting to be
retried included, and numbers the next messages of the partition from the first purged one, in
the same epoch. A message that was sent, whose answer was lost, and that waits for its retry
may well be in the log already: the next transaction then sends other records with its
sequence numbers. Apache Kafka answers that batch as a duplicate, with the offsets of the purged
records, so the producer commits records that are nowhere (found by `onceflow verify`: a
committed transaction partly missing). onceflow compares the batch's CRC with the cached one's
and answers OUT_OF_ORDER_SEQUENCE_NUMBER: the transaction fails, nothing is lost.

The broker holds the first produce answer (ONCEFLOW_DELAY_AT) past librdkafka's request
timeout, so the batch is written, its answer is lost to the client, and the messages wait for
their retry when the application aborts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from onceflow.broker.embedded import EmbeddedBroker
from tests.confluent import Deliveries, create_topics, send, transactional_producer
from tests.eos.checker import read_back, wait_settled
from tests.waiting import wait_for


class _Lines(logging.Handler):
    """librdkafka's log lines, as the `logger` setting hands them over at poll()."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _produce(producer: Producer, topic: str, values: list[bytes]) -> Deliveries:
    """Produce to partition 0 without waiting for the answers."""
    deliveries = Deliveries()
    for value in values:
        producer.produce(topic, value=value, partition=0, on_delivery=deliveries)
    return deliveries


def test_records_numbered_with_purged_sequences_are_refused_not_lost(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str
) -> None:
    broker = make_broker(env={"ONCEFLOW_DELAY_AT": "produce.before-response:3000:1"})
    create_topics(broker.bootstrap, {topic_name: 1})
    lines = _Lines()
    logger = logging.getLogger(f"rdkafka.{topic_name}")
    logger.addHandler(lines)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    producer = transactional_producer(
        broker.bootstrap,
        f"tx-{topic_name}",
        **{
            "log_level": 6,
            "logger": logger,
            "socket.timeout.ms": 1000,  # caps the produce request's timeout
            "retry.backoff.ms": 5000,  # the timed-out messages wait this long in the queue
            "retry.backoff.max.ms": 5000,
        },
    )

    def request_timed_out() -> bool:
        producer.poll(0.05)
        return any("Timed out ProduceRequest" in line for line in lines.lines)

    producer.begin_transaction()
    purged = _produce(producer, topic_name, [b"A0", b"A1", b"A2"])
    wait_for(request_timed_out, 15, "the produce request times out in the client")
    producer.abort_transaction(30)
    assert {e.code() for _, e in purged.failed} == {KafkaError._PURGE_QUEUE}

    producer.begin_transaction()
    refused = _produce(producer, topic_name, [b"B0", b"B1", b"B2"])
    with pytest.raises(KafkaException) as info:
        producer.commit_transaction(30)
    assert info.value.args[0].code() == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert refused.acked == []

    # The application starts a new producer, as after any fatal error, and writes B again.
    retry = transactional_producer(broker.bootstrap, f"tx-{topic_name}")
    retry.begin_transaction()
    written = send(retry, [(topic_name, 0, f"B{i}".encode()) for i in range(3)])
    retry.commit_transaction(30)
    assert [v for *_, v in written.acked] == [b"B0", b"B1", b"B2"]

    wait_settled(broker.bootstrap, [(topic_name, 0)])  # the commit's markers are written
    (read,) = read_back(broker.bootstrap, [(topic_name, 0)]).values()
    assert read.committed == [b"B0", b"B1", b"B2"]
    # the purged records had reached the log: the premise of the reuse
    assert read.uncommitted == [b"A0", b"A1", b"A2", b"B0", b"B1", b"B2"]
