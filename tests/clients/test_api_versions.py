"""Which API versions each client really negotiates, seen from outside on the wire.

A recording TCP proxy sits between client and broker and forwards every byte unchanged; it only
reads the request headers (api key, version). The broker listens on 127.0.0.1:P and advertises
127.0.0.2:P, where the proxy listens, so every connection a client opens after bootstrapping
(metadata, coordinator) also goes through the proxy without rewriting a thing.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.protocol.api_key import ApiKey
from tests.clients.kafka_python_consumer import subscribe
from tests.waiting import wait_for
from tests.wire import WireClient, api_versions, request_frame

PROXY_HOST = "127.0.0.2"
TOPIC_PARTITIONS = 2
RECORDS = 20

# What a client's normal paths use: admin, an idempotent producer, a group consumer that commits
# and leaves.
NORMAL_PATHS = {
    "ApiVersions": 18,
    "Metadata": 3,
    "CreateTopics": 19,
    "DeleteTopics": 20,
    "DescribeConfigs": 32,
    "InitProducerId": 22,
    "Produce": 0,
    "ListOffsets": 2,
    "Fetch": 1,
    "FindCoordinator": 10,
    "JoinGroup": 11,
    "SyncGroup": 14,
    "Heartbeat": 12,
    "OffsetCommit": 8,
    "OffsetFetch": 9,
    "LeaveGroup": 13,
}
API_NAMES = {key: name for name, key in NORMAL_PATHS.items()}


class RecordingProxy:
    """Forwards bytes both ways untouched; records (api key, version) of each request."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.server = socket.create_server(listen)
        self.requests: list[tuple[int, int]] = []
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def forget(self) -> None:
        with self._lock:
            self.requests.clear()

    def seen(self, api_key: int) -> bool:
        with self._lock:
            return any(k == api_key for k, _ in self.requests)

    def versions(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        with self._lock:
            for key, version in self.requests:
                out.setdefault(key, set()).add(version)
        return out

    def close(self) -> None:
        self.server.close()
        with self._lock:
            for s in self._sockets:
                s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.upstream)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass  # either side went away: close both
        finally:
            src.close()
            dst.close()

    def _requests(self, src: socket.socket, dst: socket.socket) -> None:
        pending = bytearray()
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                pending += data
                while len(pending) >= 8:
                    size = struct.unpack_from(">i", pending)[0]
                    if len(pending) < 4 + size:
                        break
                    with self._lock:
                        self.requests.append(struct.unpack_from(">hh", pending, 4))
                    del pending[: 4 + size]
        except OSError:
            pass  # either side went away: close both
        finally:
            src.close()
            dst.close()


@dataclass
class Proxied:
    broker: EmbeddedBroker
    proxy: RecordingProxy

    @property
    def bootstrap(self) -> str:
        return f"{PROXY_HOST}:{self.broker.port}"


@pytest.fixture(scope="module")
def proxied_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    broker = EmbeddedBroker(
        tmp_path_factory.mktemp("proxied"),
        settings={"group.initial.rebalance.delay.ms": "0", "advertised.host": PROXY_HOST},
    )
    broker.start()
    proxy = RecordingProxy((PROXY_HOST, broker.port), ("127.0.0.1", broker.port))
    yield Proxied(broker, proxy)
    proxy.close()
    broker.kill()


@pytest.fixture
def proxied(proxied_broker: Proxied) -> Proxied:
    proxied_broker.proxy.forget()
    return proxied_broker


# -- one normal session per client ------------------------------------------------------------


def confluent_session(p: Proxied, topic: str) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    admin = AdminClient({"bootstrap.servers": p.bootstrap})
    admin.create_topics([NewTopic(topic, TOPIC_PARTITIONS, 1)])[topic].result(10)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    assert admin.describe_configs([resource])[resource].result(10)["cleanup.policy"].value
    producer = Producer({"bootstrap.servers": p.bootstrap, "enable.idempotence": True})
    for i in range(RECORDS):
        producer.produce(topic, value=b"%d" % i, key=b"%d" % i)
    assert producer.flush(10) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": p.bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "heartbeat.interval.ms": 100,
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    wait_for(
        lambda: len(got) == RECORDS and p.proxy.seen(ApiKey.HEARTBEAT),
        poll=lambda: got.extend(m.value() for m in consumer.consume(100, 0.1) if m.error() is None),
    )
    consumer.commit(asynchronous=False)
    assert sum(tp.offset for tp in consumer.committed(consumer.assignment(), 10)) == RECORDS
    consumer.close()
    admin.delete_topics([topic])[topic].result(10)


def kafka_python_session(p: Proxied, topic: str) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import ConfigResource, ConfigResourceType, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=p.bootstrap)
    admin.create_topics([NewTopic(topic, TOPIC_PARTITIONS, 1)])
    admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    producer = KafkaProducer(bootstrap_servers=p.bootstrap)  # idempotent by default
    for i in range(RECORDS):
        producer.send(topic, value=b"%d" % i, key=b"%d" % i)
    producer.flush(10)
    producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=p.bootstrap,
        group_id=f"g-{topic}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        heartbeat_interval_ms=100,
    )
    subscribe(consumer, topic)
    got: list[bytes] = []
    wait_for(
        lambda: len(got) == RECORDS and p.proxy.seen(ApiKey.HEARTBEAT),
        poll=lambda: [got.extend(m.value for m in ms) for ms in consumer.poll(100).values()],
    )
    consumer.commit()
    assert sum(consumer.committed(tp) or 0 for tp in consumer.assignment()) == RECORDS
    consumer.close()
    admin.delete_topics([topic])
    admin.close()


def aiokafka_session(p: Proxied, topic: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    async def session() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=p.bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic(topic, TOPIC_PARTITIONS, 1)])
        await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        producer = AIOKafkaProducer(bootstrap_servers=p.bootstrap, enable_idempotence=True)
        await producer.start()
        for i in range(RECORDS):
            await producer.send(topic, value=b"%d" % i, key=b"%d" % i)
        await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=p.bootstrap,
            group_id=f"g-{topic}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            heartbeat_interval_ms=100,
        )
        await consumer.start()
        got: list[bytes] = []
        async with asyncio.timeout(30):
            while len(got) < RECORDS or not p.proxy.seen(ApiKey.HEARTBEAT):
                for msgs in (await consumer.getmany(timeout_ms=100)).values():
                    got.extend(m.value for m in msgs)
        await consumer.commit()
        committed = [await consumer.committed(tp) for tp in consumer.assignment()]
        assert sum(c or 0 for c in committed) == RECORDS
        await consumer.stop()
        await admin.delete_topics([topic])
        await admin.close()

    asyncio.run(session())


SESSIONS = {
    "confluent-kafka": confluent_session,
    "kafka-python": kafka_python_session,
    "aiokafka": aiokafka_session,
}


@pytest.mark.parametrize("client", SESSIONS)
def test_negotiated_versions_are_advertised_and_cover_the_normal_paths(
    proxied: Proxied, client: str
) -> None:
    advertised = api_versions(proxied.broker.bootstrap)
    SESSIONS[client](proxied, f"v-{uuid.uuid4().hex[:8]}")
    used = proxied.proxy.versions()
    print(
        f"\n{client}: "
        + ", ".join(f"{API_NAMES.get(k, k)} v{sorted(v)}" for k, v in sorted(used.items()))
    )
    missing = {name for name, key in NORMAL_PATHS.items() if key not in used}
    assert not missing, f"{client} never sent {sorted(missing)}"
    for key, versions in used.items():
        assert key in advertised, f"{client} sent API {key}, which is not advertised"
        low, high = advertised[key]
        if key == 18:
            # A client may open with a newer ApiVersions (KIP-511) and fall back; never older.
            assert min(versions) >= low
            assert any(low <= v <= high for v in versions)
        else:
            assert all(low <= v <= high for v in versions), (key, versions, (low, high))


def test_api_versions_of_a_future_version_is_answered_v0_with_the_key_list(
    proxied: Proxied,
) -> None:
    advertised = api_versions(proxied.broker.bootstrap)
    client = WireClient(proxied.broker.bootstrap)
    # A v99 request with a flexible (v2) header and a body nobody can parse yet.
    frame = bytearray(
        request_frame(ApiKey.API_VERSIONS, 3, b"\x05hello\x041.0\x00\x00", correlation_id=41)
    )
    struct.pack_into(">h", frame, 6, 99)
    client.send_raw(bytes(frame))
    size = struct.unpack(">i", client._read(4))[0]
    data = client._read(size)
    # Header v0 (just the correlation id), then an ApiVersions v0 body.
    assert struct.unpack_from(">i", data)[0] == 41
    body, read = entity_reader(ApiVersionsResponse)(data, 4)
    assert 4 + read == len(data)
    assert body.error_code == ErrorCode.unsupported_version
    assert {k.api_key: (k.min_version, k.max_version) for k in body.api_keys} == advertised
    # The connection stays usable for the retry at a version the broker knows.
    assert advertised == {
        k.api_key: (k.min_version, k.max_version) for k in client.call(_api_versions_v3()).api_keys
    }
    client.close()


def _api_versions_v3() -> object:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    return ApiVersionsRequest(client_software_name="t", client_software_version="1")
