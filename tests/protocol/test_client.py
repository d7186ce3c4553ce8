"""The blocking protocol client against the running broker (and against fake brokers for the
failure paths): version negotiation, typed responses, routing, WriteTxnMarkers, typed errors."""

from __future__ import annotations

import datetime
import io
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.serial import entity_writer

from onceflow.broker.dispatch import supported_versions
from onceflow.cli.transactions import describe_producers, describe_transactions
from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.client import (
    BrokerConnection,
    BrokerConnectionError,
    KafkaClient,
    KafkaResponseError,
    MalformedResponseError,
    RequestTimeoutError,
    UnsupportedApiError,
    kio_versions,
)
from onceflow.protocol.entities import build, sibling
from onceflow.protocol.messages import encode_response, parse_request
from tests.admin_requests import init_producer_id
from tests.cli.open_transactions import QUIET, dead_address, last_stable_offset, open_transaction
from tests.confluent import create_topic
from tests.waiting import wait_for

API_VERSIONS, METADATA = ApiKey.API_VERSIONS, ApiKey.METADATA

READ_COMMITTED = 1
LATEST = -1

# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def client(bootstrap: str) -> Iterator[KafkaClient]:
    with KafkaClient(bootstrap) as connected:
        yield connected


# --- negotiation --------------------------------------------------------------------------------


def test_negotiates_the_highest_version_both_sides_support(client: KafkaClient) -> None:
    connection = client.any_connection()
    advertised = supported_versions()
    assert connection.api_versions == advertised
    for api_key in (
        METADATA,
        ApiKey.FIND_COORDINATOR,
        API_VERSIONS,
        ApiKey.LIST_OFFSETS,
        ApiKey.WRITE_TXN_MARKERS,
        ApiKey.DESCRIBE_PRODUCERS,
        ApiKey.DESCRIBE_TRANSACTIONS,
        ApiKey.LIST_TRANSACTIONS,
    ):
        broker_max = advertised[api_key][1]
        assert connection.version_for(api_key) == min(broker_max, kio_versions(api_key)[1])
    assert connection.version_for(ApiKey.WRITE_TXN_MARKERS) == 2
    # The caller may cap the version; the request class follows the negotiated one.
    assert connection.version_for(ApiKey.METADATA, max_version=5) == 5
    assert connection.request_class(ApiKey.METADATA, max_version=5).__version__ == 5
    # A floor above what the broker offers is refused, naming both ranges.
    with pytest.raises(UnsupportedApiError, match=r"\(v0-v1\) and this client \(v2-v2\)"):
        connection.version_for(ApiKey.LIST_TRANSACTIONS, min_version=2)


def test_apis_or_versions_the_broker_lacks_are_refused_before_sending(
    client: KafkaClient,
) -> None:
    connection = client.any_connection()
    missing = next(key for key in sorted(api_key_map) if key not in connection.api_versions)
    with pytest.raises(UnsupportedApiError, match=f"API {missing}"):
        connection.version_for(missing)
    too_new = connection.api_versions[ApiKey.METADATA][1] + 1
    if too_new <= kio_versions(ApiKey.METADATA)[1]:
        request = build(
            load_request_schema(ApiKey.METADATA, too_new),
            topics=None,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        with pytest.raises(UnsupportedApiError, match=f"v{too_new}"):
            connection.send(request)
    # The connection is still usable afterwards.
    assert client.metadata() is not None


# --- typed responses and routing ----------------------------------------------------------------


def test_metadata_leaders_and_coordinator(
    client: KafkaClient, bootstrap: str, topic_name: str
) -> None:
    create_topic(bootstrap, topic_name, partitions=3)
    response = client.metadata([topic_name])
    assert type(response).__name__ == "MetadataResponse"
    assert [t.name for t in response.topics] == [topic_name]
    assert client.partitions(topic_name) == [0, 1, 2]
    (node_id,) = client.brokers
    assert client.leader(topic_name, 2) == node_id
    assert client.brokers[node_id].address == bootstrap
    assert topic_name in client.topics()
    coordinator = client.find_coordinator(f"txn-{uuid.uuid4().hex[:8]}")
    assert (coordinator.node_id, coordinator.address) == (node_id, bootstrap)
    with pytest.raises(KafkaResponseError) as missing:
        client.partitions(f"missing-{uuid.uuid4().hex[:8]}")
    assert missing.value.error_code == ErrorCode.unknown_topic_or_partition
    with pytest.raises(KafkaResponseError):
        client.leader(topic_name, 3)


def active_producers(client: KafkaClient, topic: str, partition: int) -> tuple[Any, ...]:
    """DescribeProducers of one partition, sent to its leader: the active producers' states."""
    response = client.call_leader(
        topic,
        partition,
        ApiKey.DESCRIBE_PRODUCERS,
        lambda cls: build(
            cls,
            topics=(
                build(sibling(cls, "TopicRequest"), name=topic, partition_indexes=(partition,)),
            ),
        ),
    )
    return response.topics[0].partitions[0].active_producers


def test_transaction_admin_apis_answer_typed_entities(
    client: KafkaClient, bootstrap: str, topic_name: str
) -> None:
    create_topic(bootstrap, topic_name, partitions=2)
    txn_id = f"txn-{uuid.uuid4().hex[:8]}"
    idle_id = f"idle-{uuid.uuid4().hex[:8]}"
    assert init_producer_id(bootstrap, idle_id)[0] == ErrorCode.none  # Empty: no transaction
    producer = open_transaction(bootstrap, txn_id, topic_name, {0: [b"a", b"b"], 1: [b"c"]})
    try:
        described = client.call_coordinator(
            txn_id,
            ApiKey.DESCRIBE_TRANSACTIONS,
            lambda cls: build(cls, transactional_ids=(txn_id, "no-such-id", idle_id)),
        )
        ours, unknown, idle = described.transaction_states
        assert ours.error_code == ErrorCode.none
        assert ours.transaction_state == "Ongoing"
        assert ours.transaction_timeout.total_seconds() == 300
        assert 0 < ours.transaction_start_time <= time.time() * 1000 + 1000
        assert {(t.topic, p) for t in ours.topics for p in t.partitions} == {
            (topic_name, 0),
            (topic_name, 1),
        }
        # Kafka sends -1 as the start time of an id without a transaction; kio cannot read
        # that as a timestamp, so the client reads it as an int. An unknown id's entry has the
        # schema's defaults, 0 (Kafka 4.4: tests/apache_kafka/conformance/).
        assert (idle.transaction_state, idle.transaction_start_time) == ("Empty", -1)
        assert unknown.error_code == ErrorCode.transactional_id_not_found
        assert (unknown.transaction_start_time, unknown.producer_id) == (0, 0)

        listed = client.call_each_broker(
            ApiKey.LIST_TRANSACTIONS,
            lambda cls: build(
                cls,
                state_filters=("Ongoing",),
                producer_id_filters=(ours.producer_id,),
                duration_filter=-1,
            ),
        )
        assert listed.failures == []
        states = [s for _, r in listed.responses for s in r.transaction_states]
        assert [(s.transactional_id, s.transaction_state) for s in states] == [(txn_id, "Ongoing")]

        (state,) = active_producers(client, topic_name, 0)
        assert (state.producer_id, state.producer_epoch) == (ours.producer_id, ours.producer_epoch)
        assert state.current_txn_start_offset == 0
        assert state.last_sequence == 1
    finally:
        producer.abort_transaction(30)


def write_txn_markers(
    client: KafkaClient,
    topic: str,
    partitions: tuple[int, ...],
    producer_id: int,
    producer_epoch: int,
    commit: bool = False,
) -> dict[int, ErrorCode]:
    def make(cls: type) -> Any:
        return build(
            cls,
            markers=(
                build(
                    sibling(cls, "WritableTxnMarker"),
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    transaction_result=commit,
                    topics=(
                        build(
                            sibling(cls, "WritableTxnMarkerTopic"),
                            name=topic,
                            partition_indexes=partitions,
                        ),
                    ),
                    coordinator_epoch=0,
                ),
            ),
        )

    response = client.call_leader(topic, partitions[0], ApiKey.WRITE_TXN_MARKERS, make)
    (marker,) = response.markers
    assert marker.producer_id == producer_id
    return {p.partition_index: p.error_code for t in marker.topics for p in t.partitions}


def test_write_txn_markers_aborts_an_open_transaction_and_moves_the_lso(
    client: KafkaClient, bootstrap: str, topic_name: str
) -> None:
    create_topic(bootstrap, topic_name, partitions=2)
    txn_id = f"txn-{uuid.uuid4().hex[:8]}"
    # A first instance takes epoch 0, so the open transaction below runs at epoch 1.
    first = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "logger": QUIET})
    first.init_transactions(30)
    first.close()
    producer = open_transaction(bootstrap, txn_id, topic_name, {0: [b"x"] * 3})
    try:
        wait_for(lambda: last_stable_offset(client, topic_name, 0) == 0, what="LSO pinned at 0")
        (description,) = client.call_coordinator(
            txn_id,
            ApiKey.DESCRIBE_TRANSACTIONS,
            lambda cls: build(cls, transactional_ids=(txn_id,)),
        ).transaction_states
        pid, epoch = description.producer_id, description.producer_epoch

        # An older epoch is refused and writes nothing; an unknown partition is reported.
        assert epoch == 1
        stale = write_txn_markers(client, topic_name, (0,), pid, epoch - 1)
        assert stale == {0: ErrorCode.invalid_producer_epoch}
        assert last_stable_offset(client, topic_name, 0) == 0
        errors = write_txn_markers(client, topic_name, (0, 7), pid, epoch)
        assert errors == {0: ErrorCode.none, 7: ErrorCode.unknown_topic_or_partition}
        # The marker is durable before the answer: three records and the marker are stable.
        assert last_stable_offset(client, topic_name, 0) == 4
        (state,) = active_producers(client, topic_name, 0)
        assert state.current_txn_start_offset == -1
    finally:
        producer.abort_transaction(30)


# --- failures -----------------------------------------------------------------------------------


def test_a_dead_address_fails_fast_with_a_connection_error() -> None:
    address = dead_address()
    host, port = address.split(":")
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError, match=address):
        BrokerConnection.connect(host, int(port), connect_timeout_s=2)
    with pytest.raises(BrokerConnectionError, match="cannot reach any bootstrap broker") as both:
        KafkaClient(f"{address},{dead_address()}", connect_timeout_s=2).connect()
    assert both.value.reason.count("Connection refused") == 2
    assert time.monotonic() - started < 4


Answer = Callable[[bytes], "bytes | None"]


def header_of(frame: bytes) -> tuple[int, int, int]:
    """(api key, version, correlation id) of a request frame."""
    api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
    return api_key, version, correlation_id


class FakeBroker:
    """Accepts connections on a thread and answers each request frame with `answer(frame)`:
    bytes to send back (without the size), or None to stay silent, or b"" to hang up."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.requests: list[tuple[int, int]] = []
        self._open: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            self._open.append(sock)
            threading.Thread(target=self._talk, args=(sock,), daemon=True).start()

    def _talk(self, sock: socket.socket) -> None:
        with sock:
            while True:
                try:
                    size_bytes = sock.recv(4, socket.MSG_WAITALL)
                    if len(size_bytes) < 4:
                        return
                    frame = sock.recv(struct.unpack(">i", size_bytes)[0], socket.MSG_WAITALL)
                except OSError:
                    return
                self.requests.append(header_of(frame)[:2])
                reply = self.answer(frame)
                if reply is None:
                    continue
                if reply == b"":
                    return
                sock.sendall(struct.pack(">i", len(reply)) + reply)

    def close(self) -> None:
        self.server.close()
        for sock in self._open:
            sock.close()


@pytest.fixture
def fake_broker() -> Iterator[Callable[[Answer], FakeBroker]]:
    started: list[FakeBroker] = []

    def start(answer: Answer) -> FakeBroker:
        started.append(FakeBroker(answer))
        return started[-1]

    yield start
    for fake in started:
        fake.close()


def api_versions_reply(correlation_id: int, version: int, error: ErrorCode, keys: Any) -> bytes:
    """An ApiVersions response: always header v0 (no tagged fields), as Kafka sends it."""
    cls = load_response_schema(ApiKey.API_VERSIONS, version)
    key_cls = sibling(cls, "ApiVersion")
    body = build(
        cls,
        error_code=error,
        api_keys=tuple(key_cls(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in keys),
        throttle_time=datetime.timedelta(0),
        supported_features=(),
        finalized_features_epoch=-1,
        finalized_features=(),
        zk_migration_ready=False,
    )
    buf = io.BytesIO()
    buf.write(struct.pack(">i", correlation_id))
    entity_writer(cls)(buf, body)
    return buf.getvalue()


def test_api_versions_falls_back_to_the_brokers_version(fake_broker: Any) -> None:
    """KIP-511: a broker that does not know our ApiVersions version answers v0 with
    UNSUPPORTED_VERSION and its range; the client asks again at that version."""
    keys = [(API_VERSIONS, 0, 2), (METADATA, 1, 5), (ApiKey.DESCRIBE_PRODUCERS, 0, 0)]

    def answer(frame: bytes) -> bytes:
        api_key, version, correlation_id = header_of(frame)
        assert api_key == API_VERSIONS
        if version > 2:
            return api_versions_reply(correlation_id, 0, ErrorCode.unsupported_version, keys[:1])
        return api_versions_reply(correlation_id, version, ErrorCode.none, keys)

    fake = fake_broker(answer)
    with BrokerConnection.connect("127.0.0.1", fake.port) as connection:
        assert fake.requests == [(API_VERSIONS, kio_versions(API_VERSIONS)[1]), (API_VERSIONS, 2)]
        assert connection.api_versions == {key: (lo, hi) for key, lo, hi in keys}
        assert connection.version_for(METADATA) == 5
        with pytest.raises(UnsupportedApiError, match="DescribeTransactions"):
            connection.version_for(ApiKey.DESCRIBE_TRANSACTIONS)


def test_a_silent_broker_times_out(fake_broker: Any) -> None:
    fake = fake_broker(lambda _frame: None)
    started = time.monotonic()
    with pytest.raises(RequestTimeoutError, match="ApiVersions"):
        BrokerConnection.connect("127.0.0.1", fake.port, request_timeout_s=0.5)
    assert time.monotonic() - started < 3


def test_a_broker_that_hangs_up_is_a_connection_error(fake_broker: Any) -> None:
    fake = fake_broker(lambda _frame: b"")
    with pytest.raises(BrokerConnectionError, match="closed the connection"):
        BrokerConnection.connect("127.0.0.1", fake.port)


def test_an_answer_to_another_request_is_malformed(fake_broker: Any) -> None:
    keys = [(API_VERSIONS, 0, 4)]
    fake = fake_broker(
        lambda frame: api_versions_reply(
            header_of(frame)[2] + 1, header_of(frame)[1], ErrorCode.none, keys
        )
    )
    with pytest.raises(MalformedResponseError, match="correlation id"):
        BrokerConnection.connect("127.0.0.1", fake.port)


def test_garbage_is_malformed(fake_broker: Any) -> None:
    fake = fake_broker(lambda frame: struct.pack(">ih", header_of(frame)[2], 0))
    with pytest.raises(MalformedResponseError, match="does not parse"):
        BrokerConnection.connect("127.0.0.1", fake.port)


# --- routing in a (fake) two-broker cluster -----------------------------------------------------


class FakeCluster:
    """Two fake brokers (node ids 1 and 2) answering with kio entities: partition 0 of topic
    "t" is led by node 1, partition 1 by node 2 (after a leader move Metadata has not caught up
    with yet), and node 2 coordinates every transactional id."""

    TOPIC = "t"
    SUPPORTED = {
        API_VERSIONS: (0, 3),
        METADATA: (1, 12),
        ApiKey.FIND_COORDINATOR: (0, 6),
        ApiKey.DESCRIBE_PRODUCERS: (0, 0),
        ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
        ApiKey.LIST_TRANSACTIONS: (0, 1),
    }

    def __init__(self, start: Callable[[Answer], FakeBroker]) -> None:
        self.seen: list[tuple[int, int, Any]] = []  # (node id, api key, request body)
        # Partition 1 is led by node 2, but Metadata says node 1 until node 1 has refused it.
        self.actual_leaders = {0: 1, 1: 2}
        self.leaders = {0: 1, 1: 1}
        self.nodes = {node_id: start(self._answerer(node_id)) for node_id in (1, 2)}
        self._answers: dict[int, Callable[[int, Any], Any]] = {
            ApiKey.API_VERSIONS: self._api_versions,
            ApiKey.METADATA: self._metadata,
            ApiKey.FIND_COORDINATOR: self._find_coordinator,
            ApiKey.DESCRIBE_PRODUCERS: self._describe_producers,
            ApiKey.DESCRIBE_TRANSACTIONS: self._describe_transactions,
            ApiKey.LIST_TRANSACTIONS: self._list_transactions,
        }

    def _answerer(self, node_id: int) -> Answer:
        def answer(frame: bytes) -> bytes:
            request = parse_request(frame, self.SUPPORTED)
            self.seen.append((node_id, request.api_key, request.body))
            body = self._answers[request.api_key](node_id, request)
            return encode_response(request, body)[4:]

        return answer

    def _api_versions(self, node_id: int, request: Any) -> Any:
        cls = load_response_schema(ApiKey.API_VERSIONS, request.api_version)
        key_cls = sibling(cls, "ApiVersion")
        return build(
            cls,
            error_code=ErrorCode.none,
            api_keys=tuple(
                key_cls(api_key=k, min_version=lo, max_version=hi)
                for k, (lo, hi) in self.SUPPORTED.items()
            ),
            throttle_time=datetime.timedelta(0),
            supported_features=(),
            finalized_features_epoch=-1,
            finalized_features=(),
            zk_migration_ready=False,
        )

    def _metadata(self, node_id: int, request: Any) -> Any:
        cls = load_response_schema(ApiKey.METADATA, request.api_version)
        broker_cls = sibling(cls, "MetadataResponseBroker")
        topic_cls = sibling(cls, "MetadataResponseTopic")
        part_cls = sibling(cls, "MetadataResponsePartition")
        partitions = tuple(
            build(
                part_cls,
                error_code=ErrorCode.none,
                partition_index=p,
                leader_id=leader,
                leader_epoch=0,
                replica_nodes=(leader,),
                isr_nodes=(leader,),
                offline_replicas=(),
            )
            for p, leader in sorted(self.leaders.items())
        )
        return build(
            cls,
            throttle_time=datetime.timedelta(0),
            brokers=tuple(
                build(broker_cls, node_id=n, host="127.0.0.1", port=fake.port, rack=None)
                for n, fake in self.nodes.items()
            ),
            cluster_id="fake",
            controller_id=1,
            topics=(
                build(
                    topic_cls,
                    error_code=ErrorCode.none,
                    name=self.TOPIC,
                    topic_id=uuid.uuid4(),
                    is_internal=False,
                    partitions=partitions,
                    topic_authorized_operations=-2147483648,
                ),
            ),
            cluster_authorized_operations=-2147483648,
        )

    def _find_coordinator(self, node_id: int, request: Any) -> Any:
        cls = load_response_schema(ApiKey.FIND_COORDINATOR, request.api_version)
        coordinator = build(
            sibling(cls, "Coordinator"),
            key=request.body.coordinator_keys[0],
            node_id=2,
            host="127.0.0.1",
            port=self.nodes[2].port,
            error_code=ErrorCode.none,
            error_message=None,
        )
        return build(cls, throttle_time=datetime.timedelta(0), coordinators=(coordinator,))

    def _describe_producers(self, node_id: int, request: Any) -> Any:
        cls = load_response_schema(ApiKey.DESCRIBE_PRODUCERS, request.api_version)
        topic_cls = sibling(cls, "TopicResponse")
        part_cls = sibling(cls, "PartitionResponse")
        parts = []
        for index in request.body.topics[0].partition_indexes:
            error = ErrorCode.none
            if self.actual_leaders[index] != node_id:
                error = ErrorCode.not_leader_or_follower
                self.leaders[index] = self.actual_leaders[index]
            parts.append(
                build(
                    part_cls,
                    partition_index=index,
                    error_code=error,
                    error_message=None,
                    active_producers=(),
                )
            )
        return build(
            cls,
            throttle_time=datetime.timedelta(0),
            topics=(build(topic_cls, name=self.TOPIC, partitions=tuple(parts)),),
        )

    def _describe_transactions(self, node_id: int, request: Any) -> Any:
        cls = load_response_schema(ApiKey.DESCRIBE_TRANSACTIONS, request.api_version)
        state_cls = sibling(cls, "TransactionState")
        return build(
            cls,
            throttle_time=datetime.timedelta(0),
            transaction_states=tuple(
                build(
                    state_cls,
                    error_code=ErrorCode.transactional_id_not_found,
                    transactional_id=txn_id,
                    transaction_state="",
                    transaction_timeout=datetime.timedelta(0),
                    transaction_start_time=datetime.datetime.fromtimestamp(-0.001, datetime.UTC),
                    producer_id=-1,
                    producer_epoch=-1,
                    topics=(),
                )
                for txn_id in request.body.transactional_ids
            ),
        )

    def _list_transactions(self, node_id: int, request: Any) -> Any:
        cls = load_response_schema(ApiKey.LIST_TRANSACTIONS, request.api_version)
        state_cls = sibling(cls, "TransactionState")
        return build(
            cls,
            throttle_time=datetime.timedelta(0),
            error_code=ErrorCode.none,
            unknown_state_filters=(),
            transaction_states=(
                build(
                    state_cls,
                    transactional_id=f"id-on-{node_id}",
                    producer_id=node_id,
                    transaction_state="Ongoing",
                ),
            ),
        )


@pytest.fixture
def fake_cluster(fake_broker: Callable[[Answer], FakeBroker]) -> FakeCluster:
    return FakeCluster(fake_broker)


def test_requests_go_to_the_leader_the_coordinator_and_every_broker(
    fake_cluster: FakeCluster,
) -> None:
    node1 = fake_cluster.nodes[1]
    with KafkaClient(f"127.0.0.1:{node1.port}") as client:
        assert sorted(client.brokers) == [1, 2]
        assert client.leader(FakeCluster.TOPIC, 0) == 1

        # Partition 1 moved to node 2: node 1 refuses it, the client refreshes and asks node 2.
        producers = describe_producers(client, [(FakeCluster.TOPIC, 0), (FakeCluster.TOPIC, 1)])
        assert producers == {(FakeCluster.TOPIC, 0): [], (FakeCluster.TOPIC, 1): []}
        asked = [
            (node, tuple(body.topics[0].partition_indexes))
            for node, key, body in fake_cluster.seen
            if key == ApiKey.DESCRIBE_PRODUCERS
        ]
        assert asked == [(1, (0, 1)), (2, (1,))]

        assert client.find_coordinator("some-id").node_id == 2
        assert describe_transactions(client, ["some-id"]) == {"some-id": None}
        assert [n for n, key, _ in fake_cluster.seen if key == ApiKey.DESCRIBE_TRANSACTIONS] == [2]

        listed = client.call_each_broker(
            ApiKey.LIST_TRANSACTIONS,
            lambda cls: build(cls, state_filters=(), producer_id_filters=(), duration_filter=-1),
        )
        assert [
            (node.node_id, r.transaction_states[0].transactional_id) for node, r in listed.responses
        ] == [(1, "id-on-1"), (2, "id-on-2")]
