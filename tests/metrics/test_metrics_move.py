"""The metrics move as the broker works: produce N records and the counter moves by N; an open
transaction shows in the per-state gauge; consumer lag falls to 0 once a consumer catches up,
and counts only committed records (read_committed)."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from onceflow.broker.embedded import EmbeddedBroker
from tests.metrics.scrape import scrape, value
from tests.waiting import wait_for
from tests.wire import WireClient


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    started = EmbeddedBroker(
        tmp_path_factory.mktemp("metrics-broker"),
        settings={"metrics.listen": "127.0.0.1:0", "group.initial.rebalance.delay.ms": "0"},
    )
    started.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def topic() -> str:
    return f"m-{uuid.uuid4().hex[:10]}"


def _metric(broker: EmbeddedBroker, name: str, **labels: str) -> float | None:
    assert broker.metrics_port is not None
    return value(scrape(broker.metrics_port), name, **labels)


def _produce(bootstrap: str, topic: str, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        producer.produce(topic, f"v{i}".encode())
    assert producer.flush(30) == 0


def test_produce_moves_messages_in_by_n(broker: EmbeddedBroker, topic: str) -> None:
    _produce(broker.bootstrap, topic, 1)  # the topic exists: its counter starts
    name = "kafka_server_brokertopicmetrics_messagesin_total"
    before = wait_for(lambda: _metric(broker, name, topic=topic), what=f"{name} of {topic}")
    bytes_before = _metric(broker, "kafka_server_brokertopicmetrics_bytesin_total", topic=topic)
    produce_before = _metric(
        broker, "kafka_network_requestmetrics_totaltimems_count", request="Produce"
    )

    _produce(broker.bootstrap, topic, 250)

    wait_for(
        lambda: _metric(broker, name, topic=topic) == before + 250,
        what=lambda: f"{name} = {before} + 250, is {_metric(broker, name, topic=topic)}",
    )
    assert _metric(broker, "kafka_server_brokertopicmetrics_bytesin_total", topic=topic) > (
        bytes_before or 0
    )
    after = _metric(broker, "kafka_network_requestmetrics_totaltimems_count", request="Produce")
    assert after is not None and after > (produce_before or 0)
    assert _metric(broker, "kafka_log_log_logendoffset", topic=topic, partition="0") == 251


def test_open_transaction_shows_in_the_per_state_gauge(broker: EmbeddedBroker, topic: str) -> None:
    name = "kafka_server_transaction_coordinator_metrics_transaction_count"
    ongoing = _metric(broker, name, state="Ongoing") or 0
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"inside")
    producer.flush(30)
    wait_for(
        lambda: _metric(broker, name, state="Ongoing") == ongoing + 1,
        what=lambda: f"Ongoing = {ongoing} + 1, is {_metric(broker, name, state='Ongoing')}",
    )
    producer.commit_transaction(30)
    wait_for(
        lambda: _metric(broker, name, state="Ongoing") == ongoing,
        what="the transaction to leave Ongoing",
    )
    assert (_metric(broker, name, state="CompleteCommit") or 0) >= 1


def test_lag_falls_to_zero_and_counts_only_committed_records(
    broker: EmbeddedBroker, topic: str
) -> None:
    _produce(broker.bootstrap, topic, 10)
    group = f"g-{topic}"
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        lag = {"topic": topic, "partition": "0", "consumergroup": group}
        wait_for(
            lambda: _metric(broker, "kafka_consumergroup_lag", **lag) == 10,
            what=lambda: f"lag 10, is {_metric(broker, 'kafka_consumergroup_lag', **lag)}",
        )
        _catch_up(consumer, topic, expected=10)
        wait_for(
            lambda: _metric(broker, "kafka_consumergroup_lag", **lag) == 0,
            what=lambda: f"lag 0, is {_metric(broker, 'kafka_consumergroup_lag', **lag)}",
        )
        # Fetch v13+ names topics by id: the bytes out are still the topic's.
        out = _metric(broker, "kafka_server_brokertopicmetrics_bytesout_total", topic=topic)
        assert out is not None and out > 0

        # Five records of a transaction still open: the high watermark moves, the lag does not.
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{topic}"}
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, f"t{i}".encode())
        producer.flush(30)
        current = {"topic": topic, "partition": "0"}
        wait_for(
            lambda: _metric(broker, "kafka_topic_partition_current_offset", **current) == 15,
            what="the high watermark at 15",
        )
        assert _metric(broker, "kafka_consumergroup_lag", **lag) == 0

        producer.commit_transaction(30)  # 5 records and the marker: 6 offsets behind
        wait_for(
            lambda: _metric(broker, "kafka_consumergroup_lag", **lag) == 6,
            what=lambda: f"lag 6, is {_metric(broker, 'kafka_consumergroup_lag', **lag)}",
        )
        _catch_up(consumer, topic, expected=5)
        wait_for(
            lambda: _metric(broker, "kafka_consumergroup_lag", **lag) == 0,
            what=lambda: f"lag 0 again, is {_metric(broker, 'kafka_consumergroup_lag', **lag)}",
        )
    finally:
        consumer.close()


def _catch_up(consumer: Consumer, topic: str, expected: int) -> None:
    """Read `expected` records, then commit the consumer's position."""
    got = 0

    def read() -> bool:
        nonlocal got
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got += 1
        return got >= expected

    wait_for(read, what=lambda: f"{expected} records of {topic}, got {got}", interval=0)
    position = wait_for(
        lambda: _end_position(consumer, topic), what="the consumer's position past the records"
    )
    consumer.commit(offsets=[TopicPartition(topic, 0, position)], asynchronous=False)


def _end_position(consumer: Consumer, topic: str) -> int | None:
    consumer.poll(0.1)  # reads on past a commit marker, which moves the position
    position = consumer.position([TopicPartition(topic, 0)])[0].offset
    _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), cached=False)
    return position if position == high else None


def test_the_endpoint_is_off_unless_set(session_broker: EmbeddedBroker) -> None:
    assert session_broker.metrics_port is None  # no "onceflow metrics on ..." line was printed
    assert not any(line.startswith("onceflow metrics on") for line in session_broker.output)


def test_connections_closed_by_a_limit_are_counted_by_its_name(broker: EmbeddedBroker) -> None:
    name = "onceflow_server_connections_refused_total"
    limit = "socket.request.max.bytes"
    before = _metric(broker, name, limit=limit) or 0
    with WireClient(broker.bootstrap) as client:
        client.send_raw(struct.pack(">i", 200 << 20))  # a 200 MiB frame announced
        assert client.closed_by_peer()
    wait_for(
        lambda: _metric(broker, name, limit=limit) == before + 1,
        what=lambda: f"{name}{{limit={limit}}} = {before} + 1",
    )
