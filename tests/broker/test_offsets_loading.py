"""A restart with a long `__consumer_offsets`: the broker answers Metadata at once, group
requests get COORDINATOR_LOAD_IN_PROGRESS until the log is replayed (as Kafka's), clients retry
and find every committed offset; a kill -9 during the load loses nothing."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.offset_fetch.v7.request import OffsetFetchRequest, OffsetFetchRequestTopic
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.protocol.client import BrokerConnection
from tests.admin_requests import init_producer_id
from tests.broker.offset_commits import commit_many
from tests.confluent import QUIET, create_topic, transactional_producer

GROUPS = 4
PARTITIONS = 4
TOPIC = "committed"
# Offset records to replay: about 3 s at the ~50,000 records/s replay rate, far more than the
# 0.5 s the broker replays before it listens.
RECORDS = 160_000
LAST = RECORDS // GROUPS // PARTITIONS - 1  # the offset committed last, every partition
DEADLINE_S = 120.0


def _connect(broker: EmbeddedBroker) -> BrokerConnection:
    return BrokerConnection.connect("127.0.0.1", broker.port, request_timeout_s=30)


def _metadata(connection: BrokerConnection, topic: str) -> None:
    response = connection.send(
        MetadataRequest(
            topics=(MetadataRequestTopic(name=TopicName(topic)),),
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
    )
    assert [t.error_code for t in response.topics] == [ErrorCode.none]


def _offset_fetch(connection: BrokerConnection, group: str, topic: str) -> tuple[ErrorCode, int]:
    response = connection.send(
        OffsetFetchRequest(
            group_id=GroupId(group),
            topics=(OffsetFetchRequestTopic(name=TopicName(topic), partition_indexes=(i32(0),)),),
            require_stable=False,
        )
    )
    if response.error_code != ErrorCode.none:
        return response.error_code, -1
    return ErrorCode.none, response.topics[0].partitions[0].committed_offset


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory whose offsets log holds RECORDS offset records (GROUPS groups x
    PARTITIONS partitions of TOPIC, the last offset LAST), left by a kill -9; tests copy it."""
    data = tmp_path_factory.mktemp("offsets") / "data"
    broker = EmbeddedBroker(data, settings={"log.cleaner.enable": "false"}).start()
    try:
        create_topic(broker.bootstrap, TOPIC, partitions=PARTITIONS)
        threads = [
            threading.Thread(
                target=commit_many,
                args=(broker.bootstrap, f"g{g}", LAST + 1, TOPIC, PARTITIONS),
            )
            for g in range(GROUPS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        broker.kill()
    return data


def _restarted(committed: Path, tmp_path: Path) -> EmbeddedBroker:
    data = tmp_path / "data"
    shutil.copytree(committed, data)
    broker = EmbeddedBroker(data, settings={"log.cleaner.enable": "false"})
    return broker.start(timeout=DEADLINE_S)


def _first_answers(broker: EmbeddedBroker, topic: str) -> list[ErrorCode]:
    """Once the broker listens: a Metadata answer, then the OffsetFetch answers until one
    succeeds (what a client retrying sees)."""
    deadline = time.monotonic() + DEADLINE_S
    with _connect(broker) as connection:
        _metadata(connection, topic)
        seen = []
        while time.monotonic() < deadline:
            error, _ = _offset_fetch(connection, "g0", topic)
            seen.append(error)
            if error == ErrorCode.none:
                return seen
            assert error == ErrorCode.coordinator_load_in_progress, seen
        raise AssertionError(f"offsets not loaded within {DEADLINE_S}s: {seen[-5:]}")


@pytest.fixture
def broker(committed: Path, tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A broker started on a copy of `committed`, answering, its offsets still loading."""
    broker = _restarted(committed, tmp_path)
    yield broker
    broker.kill()


def test_metadata_is_answered_while_the_offsets_load(broker: EmbeddedBroker) -> None:
    seen = _first_answers(broker, TOPIC)
    # Metadata was answered before the offsets were loaded: group requests said so meanwhile.
    assert seen[0] == ErrorCode.coordinator_load_in_progress, (
        f"the first OffsetFetch after the first Metadata answer got {seen[0]!r}: Metadata "
        "waited for __consumer_offsets to load"
    )
    # A client retries COORDINATOR_LOAD_IN_PROGRESS and finds every group's offsets.
    for g in range(GROUPS):
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g{g}", **QUIET})
        try:
            found = consumer.committed(
                [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=DEADLINE_S
            )
        finally:
            consumer.close()
        assert [tp.offset for tp in found] == [LAST] * PARTITIONS, (g, found)


def test_kill_9_while_the_offsets_load_loses_nothing(broker: EmbeddedBroker) -> None:
    with _connect(broker) as connection:
        assert _offset_fetch(connection, "g0", TOPIC)[0] == ErrorCode.coordinator_load_in_progress
    broker.kill()  # mid-load
    broker.start(timeout=DEADLINE_S)
    _first_answers(broker, TOPIC)
    with _connect(broker) as connection:
        for g in range(GROUPS):
            error, offset = _offset_fetch(connection, f"g{g}", TOPIC)
            assert (error, offset) == (ErrorCode.none, LAST), g


def test_end_txn_waits_for_the_offsets_load(broker: EmbeddedBroker) -> None:
    """A transactional InitProducerId (it may abort a transaction, whose markers settle
    offsets) and EndTxn are refused during the load, retriably; after it, a transaction with
    offsets commits them."""
    error, _, _ = init_producer_id(broker.bootstrap, "tx-loading")
    assert error == ErrorCode.coordinator_load_in_progress
    producer = transactional_producer(broker.bootstrap, "tx-loading")  # retried until loaded
    producer.begin_transaction()
    producer.produce(TOPIC, b"v", partition=0)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "txg", **QUIET})
    try:
        producer.send_offsets_to_transaction(
            [TopicPartition(TOPIC, 0, 42)], consumer.consumer_group_metadata(), DEADLINE_S
        )
        producer.commit_transaction(DEADLINE_S)
        found = consumer.committed([TopicPartition(TOPIC, 0)], timeout=DEADLINE_S)
    finally:
        consumer.close()
    assert found[0].offset == 42
