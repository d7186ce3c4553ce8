"""The proxy's address rewriting (Metadata, FindCoordinator, flexible or not) and its faults
against a live broker with a confluent-kafka client."""

from __future__ import annotations

import datetime
import io
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v1 import response as find_v1
from kio.schema.find_coordinator.v4 import response as find_v4
from kio.schema.metadata.v1 import response as metadata_v1
from kio.schema.metadata.v12 import response as metadata_v12
from kio.schema.types import BrokerId
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.protocol.api_key import ApiKey
from onceflow.verify.proxy import (
    KafkaProxy,
    response_addresses,
    rewrite_addresses,
)

UPSTREAM = ("10.1.2.3", 9092)
LISTENER = ("127.0.0.1", 40001)


def payload(body: Any, flexible_header: bool) -> bytes:
    """A response without its size prefix: correlation id, header tags, body."""
    out = io.BytesIO()
    out.write(struct.pack(">i", 42))
    if flexible_header:
        out.write(b"\x00")
    entity_writer(type(body))(out, body)
    return out.getvalue()


def decode(data: bytes, cls: type, flexible_header: bool) -> Any:
    assert struct.unpack_from(">i", data)[0] == 42
    return entity_reader(cls)(data, 5 if flexible_header else 4)[0]


def test_metadata_v1_and_v12_brokers_are_rewritten() -> None:
    old = metadata_v1.MetadataResponse(
        brokers=(
            metadata_v1.MetadataResponseBroker(
                node_id=BrokerId(1), host=UPSTREAM[0], port=i32(UPSTREAM[1]), rack=None
            ),
        ),
        controller_id=BrokerId(1),
        topics=(),
    )
    data = payload(old, flexible_header=False)
    assert response_addresses(data, ApiKey.METADATA, 1) == [UPSTREAM]
    new = decode(
        rewrite_addresses(data, ApiKey.METADATA, 1, {UPSTREAM: LISTENER}), type(old), False
    )
    assert (new.brokers[0].host, new.brokers[0].port) == LISTENER
    assert new.brokers[0].node_id == 1 and new.controller_id == 1

    flexible = metadata_v12.MetadataResponse(
        throttle_time=datetime.timedelta(0),
        brokers=(
            metadata_v12.MetadataResponseBroker(
                node_id=BrokerId(3), host=UPSTREAM[0], port=i32(UPSTREAM[1]), rack="r1"
            ),
        ),
        cluster_id="cluster",
        controller_id=BrokerId(3),
        topics=(),
    )
    data = payload(flexible, flexible_header=True)
    rewritten = rewrite_addresses(data, ApiKey.METADATA, 12, {UPSTREAM: LISTENER})
    new = decode(rewritten, type(flexible), True)
    assert (new.brokers[0].host, new.brokers[0].port, new.brokers[0].rack) == (*LISTENER, "r1")
    assert new.cluster_id == "cluster"


def test_find_coordinator_single_and_batched_are_rewritten() -> None:
    single = find_v1.FindCoordinatorResponse(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        error_message=None,
        node_id=BrokerId(0),
        host=UPSTREAM[0],
        port=i32(UPSTREAM[1]),
    )
    data = payload(single, flexible_header=False)
    new = decode(
        rewrite_addresses(data, ApiKey.FIND_COORDINATOR, 1, {UPSTREAM: LISTENER}),
        type(single),
        False,
    )
    assert (new.host, new.port) == LISTENER

    batched = find_v4.FindCoordinatorResponse(
        throttle_time=datetime.timedelta(0),
        coordinators=(
            find_v4.Coordinator(
                key="txn-a",
                node_id=BrokerId(0),
                host=UPSTREAM[0],
                port=i32(UPSTREAM[1]),
                error_code=ErrorCode.none,
                error_message=None,
            ),
            find_v4.Coordinator(  # not available: no address to rewrite
                key="txn-b",
                node_id=BrokerId(-1),
                host="",
                port=i32(-1),
                error_code=ErrorCode.coordinator_not_available,
                error_message=None,
            ),
        ),
    )
    data = payload(batched, flexible_header=True)
    assert response_addresses(data, ApiKey.FIND_COORDINATOR, 4) == [UPSTREAM]
    new = decode(
        rewrite_addresses(data, ApiKey.FIND_COORDINATOR, 4, {UPSTREAM: LISTENER}),
        type(batched),
        True,
    )
    assert [(c.key, c.host, c.port) for c in new.coordinators] == [
        ("txn-a", *LISTENER),
        ("txn-b", "", -1),
    ]


@pytest.fixture
def proxy() -> Any:
    proxy = KafkaProxy().start()
    yield proxy
    proxy.close()


def test_a_client_behind_the_proxy_stays_behind_it_and_is_cut_off(
    make_broker: Callable[..., EmbeddedBroker], proxy: KafkaProxy
) -> None:
    broker = make_broker()
    bootstrap = proxy.bootstrap_for("producer0", broker.bootstrap)
    assert bootstrap != broker.bootstrap
    acked: list[int] = []

    def new_producer() -> Producer:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": "proxied",
                "log_level": 0,
                "socket.timeout.ms": 3000,
                "transaction.timeout.ms": 5000,
            }
        )
        producer.init_transactions(15)
        return producer

    def delivered(error: object, message: Any) -> None:
        if error is None:
            acked.append(message.offset())

    def one(producer: Producer, value: bytes) -> None:
        producer.begin_transaction()
        producer.produce("proxied", value=value, on_delivery=delivered)
        producer.commit_transaction(10)

    producer = new_producer()
    one(producer, b"first")
    assert proxy.stats.rewritten >= 1  # Metadata and FindCoordinator answers went through it
    # Every connection the client opened was to the proxy: its listener for the broker.
    assert set(proxy.modes()) == {"producer0"}

    proxy.cut(["producer0"])
    with pytest.raises(KafkaException):
        one(producer, b"cut off")
    assert proxy.stats.reset + proxy.stats.refused >= 1
    proxy.heal()
    producer = new_producer()  # fences the one that was cut off mid-transaction
    one(producer, b"after")
    assert len(acked) == 2 and acked[-1] > acked[0]

    proxy.delay(["producer0"], 0.3)
    started = time.monotonic()
    one(producer, b"late")
    assert time.monotonic() - started >= 0.3  # at least one round trip, delayed
    proxy.heal()
