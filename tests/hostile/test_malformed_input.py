"""Hostile input over raw sockets never hurts the broker.

Each test sends something a well-behaved client never would, checks the answer Kafka gives (a
per-partition error code, or a closed connection), then checks that the broker still serves a
normal confluent-kafka client and that everything produced before reads back intact.
"""

from __future__ import annotations

import dataclasses
import datetime
import socket
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.static.primitive import Records

from onceflow.broker.dispatch import supported_versions
from onceflow.broker.embedded import EmbeddedBroker
from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.messages import parse_request
from onceflow.records.batch import CRC_START, MAGIC_OFFSET, TRANSACTIONAL_FLAG, compute_crc
from onceflow.records.control import build_marker
from tests.confluent import create_topic
from tests.hostile.ledger import Ledger
from tests.wire import (
    WAIT,
    WireClient,
    api_versions,
    api_versions_request,
    body_of,
    fetch_request,
    good_batch,
    produce_errors,
    produce_request,
    request_frame,
)

SUPPORTED = supported_versions()


# -- a broker whose log must survive everything --------------------------------------------------


@pytest.fixture(scope="module")
def hostile_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    broker = EmbeddedBroker(
        tmp_path_factory.mktemp("hostile"), settings={"group.initial.rebalance.delay.ms": "0"}
    )
    broker.start()
    yield broker
    broker.kill()


@pytest.fixture(scope="module")
def ledger(hostile_broker: EmbeddedBroker) -> Ledger:
    ledger = Ledger(hostile_broker, "ledger")
    create_topic(hostile_broker.bootstrap, ledger.topic, partitions=ledger.partitions)
    for p in range(ledger.partitions):
        ledger.produce(p, [f"p{p}-{i}".encode() * 3 for i in range(50)])
    return ledger


@pytest.fixture
def address(ledger: Ledger) -> Iterator[str]:
    yield ledger.broker.bootstrap
    ledger.assert_intact()  # after every hostile act


# -- frames ---------------------------------------------------------------------------------------

MALFORMED = {
    "shorter than a header": struct.pack(">i", 3) + b"\x00\x03\x00",
    "negative size": struct.pack(">i", -5) + b"\x00" * 8,
    "client id past the end": struct.pack(">ihhih", 10, 3, 1, 1, 500),
    "bad header tagged-field varint": request_frame(ApiKey.METADATA, 12, b"")[:-1]
    + b"\xff\xff\xff\xff\xff\xff",
    "body claims topics it lacks": request_frame(ApiKey.METADATA, 12, b"\x05"),
    "body with a negative string length": request_frame(
        ApiKey.CREATE_TOPICS, 2, struct.pack(">ih", 1, -7)
    ),
    "non-utf8 topic name": request_frame(
        ApiKey.METADATA, 1, struct.pack(">ih", 1, 2) + b"\xff\xfe"
    ),
    "trailing garbage after nothing": struct.pack(">i", 0),
    # Counts kio would reserve memory for before reading: the allocator aborts the process.
    "compact array of 2**35 elements": request_frame(ApiKey.METADATA, 12, b"\xff\xff\xff\xff\x7f"),
    "negative legacy array count": request_frame(
        ApiKey.LIST_OFFSETS, 7, struct.pack(">ibi", 1, 1, -1165587264)
    ),
    "batched coordinator keys of 2**32": request_frame(
        ApiKey.FIND_COORDINATOR, 6, b"\x00\xff\xff\xff\xff\x0f"
    ),
}


@pytest.mark.parametrize("frame", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frames_close_the_connection(address: str, frame: bytes) -> None:
    client = WireClient(address)
    client.send_raw(frame)
    assert client.closed_by_peer()
    client.close()


@pytest.mark.parametrize("api_key", [999, -1, 32767, 57, 67])
def test_unknown_api_keys_close_the_connection(address: str, api_key: int) -> None:
    client = WireClient(address)
    client.send_raw(struct.pack(">ihhih", 8, api_key, 0, 1, -1))
    assert client.closed_by_peer()
    client.close()


def test_unsupported_versions_close_the_connection(address: str) -> None:
    supported = api_versions(address)
    cases = [(3, supported[3][1] + 1), (1, supported[1][0] - 1), (0, 1), (0, 2), (11, 99)]
    for api_key, version in cases:
        client = WireClient(address)
        client.send_raw(struct.pack(">ihhih", 8, api_key, version, 1, -1))
        assert client.closed_by_peer(), (api_key, version)
        client.close()


def test_a_request_after_a_refused_one_is_never_answered(address: str) -> None:
    # Pipelined behind a request that closes the connection: nothing more is read or answered.
    client = WireClient(address)
    good = request_frame(ApiKey.API_VERSIONS, 0, b"", correlation_id=7)
    client.send_raw(struct.pack(">ihhih", 8, 999, 0, 1, -1) + good)
    assert client.closed_by_peer()
    client.close()


def test_lying_size_then_disconnect(address: str, ledger: Ledger) -> None:
    liar = WireClient(address)
    liar.send_raw(struct.pack(">i", 5000) + b"\x00\x03\x00\x0c" + b"x" * 20)
    # While the liar holds its half-frame, other connections are served normally.
    ledger.assert_intact()
    assert not liar.closed_by_peer(0.2)
    liar.close()


def test_frame_over_request_max_bytes_is_refused_unread(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = make_broker(settings={"socket.request.max.bytes": "1000"})
    # Only the size prefix is sent: the broker must close without waiting for the frame.
    for size in (1001, 0x7FFFFFFF):
        client = WireClient(broker.bootstrap)
        client.send_raw(struct.pack(">i", size))
        assert client.closed_by_peer()
        client.close()
    # A request of exactly the limit is still served.
    request = next(
        r
        for n in range(900, 1000)
        if len(request_frame(ApiKey.API_VERSIONS, 3, body_of(r := api_versions_request("n" * n))))
        == 4 + 1000
    )
    client = WireClient(broker.bootstrap)
    assert client.call(request).error_code == ErrorCode.none
    client.close()
    ledger = Ledger(broker, "after-refusal", partitions=1)
    create_topic(broker.bootstrap, ledger.topic)
    ledger.assert_intact()


# -- garbage record batches in a well-formed Produce -------------------------------------------


def with_crc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, CRC_START - 4, compute_crc(batch, 0, len(batch)))
    return bytes(batch)


def legacy_message(magic: int) -> bytes:
    """A valid message set of one v0 or v1 message (the pre-0.11 format)."""
    body = struct.pack(">bb", magic, 0)
    if magic == 1:
        body += struct.pack(">q", 1_700_000_000_000)
    body += struct.pack(">i", -1) + struct.pack(">i", 5) + b"hello"
    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(message)) + message


def bad_crc() -> bytes:
    batch = bytearray(good_batch())
    batch[-1] ^= 0xFF
    return bytes(batch)


def count_mismatch() -> bytes:
    batch = bytearray(good_batch())
    struct.pack_into(">i", batch, 57, 7)  # records count says 7, offsets say 3
    return with_crc(batch)


def client_control_batch() -> bytes:
    return build_marker(
        producer_id=5, producer_epoch=0, commit=True, coordinator_epoch=0, timestamp_ms=1
    )


def transactional_without_producer() -> bytes:
    batch = bytearray(good_batch())
    attributes = struct.unpack_from(">h", batch, 21)[0] | TRANSACTIONAL_FLAG
    struct.pack_into(">h", batch, 21, attributes)
    return with_crc(batch)


def unknown_magic() -> bytes:
    batch = bytearray(good_batch())
    batch[MAGIC_OFFSET] = 3
    return bytes(batch)


def length_below_minimum() -> bytes:
    batch = bytearray(good_batch())
    struct.pack_into(">i", batch, 8, 5)
    return bytes(batch)


GARBAGE = [
    pytest.param(bad_crc(), ErrorCode.corrupt_message, id="bad CRC"),
    pytest.param(unknown_magic(), ErrorCode.corrupt_message, id="magic 3"),
    pytest.param(length_below_minimum(), ErrorCode.corrupt_message, id="batch length below 14"),
    # Kafka's ProduceRequest.validateRecords: v3+ carries magic 2 only -> INVALID_RECORD.
    pytest.param(
        legacy_message(0),
        ErrorCode.invalid_record,
        id="magic v0",
    ),
    pytest.param(
        legacy_message(1),
        ErrorCode.invalid_record,
        id="magic v1",
    ),
    # Kafka finds no complete batch in a truncated one: "must have at least one record batch".
    pytest.param(
        good_batch()[:-5],
        ErrorCode.invalid_record,
        id="truncated",
    ),
    pytest.param(b"", ErrorCode.invalid_record, id="no batch"),
    pytest.param(good_batch() + good_batch(), ErrorCode.invalid_record, id="two batches"),
    pytest.param(count_mismatch(), ErrorCode.invalid_record, id="record count mismatch"),
    pytest.param(client_control_batch(), ErrorCode.invalid_record, id="control batch"),
    # onceflow's own rule (records/validation.py), where Kafka has no explicit check.
    pytest.param(
        transactional_without_producer(), ErrorCode.invalid_record, id="txn without producer id"
    ),
]


@pytest.mark.parametrize(("records", "expected"), GARBAGE)
def test_garbage_batches_get_kafkas_error_and_leave_the_log_alone(
    address: str, ledger: Ledger, records: bytes, expected: ErrorCode
) -> None:
    if len(records) > 22 and records[22] & TRANSACTIONAL_FLAG:  # the attributes' low byte
        # Transactional records (control batches are) without a transactional id are refused
        # before any validation, as KafkaApis does; with one, validation answers.
        refused = produce_errors(address, ledger.topic, {0: records})
        assert refused == {0: ErrorCode.transactional_id_authorization_failed}
        request = dataclasses.replace(
            produce_request(ledger.topic, {0: records}), transactional_id="hostile-txn"
        )
        with WireClient(address) as client:
            [answer] = client.call(request).responses
        errors = {p.index: p.error_code for p in answer.partition_responses}
    else:
        errors = produce_errors(address, ledger.topic, {0: records})
    assert errors == {0: expected}


def test_one_bad_partition_does_not_spoil_the_others(address: str, ledger: Ledger) -> None:
    values = [b"good-1", b"good-2"]
    errors = produce_errors(address, ledger.topic, {0: bad_crc(), 1: good_batch(values)})
    assert errors == {0: ErrorCode.corrupt_message, 1: ErrorCode.none}
    ledger.expected[1].extend(values)


def test_produce_to_unknown_topics_and_partitions(address: str, ledger: Ledger) -> None:
    errors = produce_errors(address, ledger.topic, {7: good_batch(), -1: good_batch()})
    assert errors == {
        7: ErrorCode.unknown_topic_or_partition,
        -1: ErrorCode.unknown_topic_or_partition,
    }
    errors = produce_errors(address, "no-such-topic-here", {0: good_batch()})
    assert errors == {0: ErrorCode.unknown_topic_or_partition}


def test_hostile_topic_names_are_refused(address: str, hostile_broker: EmbeddedBroker) -> None:
    client = WireClient(address)
    names = ["..", "../escape", "a/b", "x" * 300, "", "."]
    response = client.call(
        MetadataRequest(
            topics=tuple(MetadataRequestTopic(topic_id=None, name=n) for n in names),
            allow_auto_topic_creation=True,
            include_topic_authorized_operations=False,
        )
    )
    client.close()
    assert {t.name: t.error_code for t in response.topics} == dict.fromkeys(
        names, ErrorCode.invalid_topic_exception
    )
    data_dir = Path(hostile_broker.data_dir)
    assert not (data_dir.parent / "escape-0").exists()
    assert not any("escape" in p.name for p in data_dir.rglob("*"))


def test_absurd_topic_creations_are_refused_with_kafkas_codes(address: str) -> None:
    from kio.schema.create_topics.v7.request import (
        CreatableReplicaAssignment,
        CreatableTopic,
        CreatableTopicConfig,
        CreateTopicsRequest,
    )

    def topic(
        name: str, partitions: int = -1, replication: int = -1, assign: Any = (), **conf: str
    ) -> CreatableTopic:
        return CreatableTopic(
            name=name,
            num_partitions=partitions,
            replication_factor=replication,
            assignments=tuple(
                CreatableReplicaAssignment(partition_index=i, broker_ids=ids) for i, ids in assign
            ),
            configs=tuple(CreatableTopicConfig(name=k, value=v) for k, v in conf.items()),
        )

    cases = {
        topic("x-huge", 2**31 - 1): ErrorCode.invalid_partitions,
        topic("x-zero", 0): ErrorCode.invalid_partitions,
        topic("x-negative", -5): ErrorCode.invalid_partitions,
        topic("x-rf-zero", 1, 0): ErrorCode.invalid_replication_factor,
        topic("x-rf-negative", 1, -7): ErrorCode.invalid_replication_factor,
        topic("x-rf-three", 1, 3): ErrorCode.invalid_replication_factor,
        topic("x-bad-value", **{"retention.ms": "soon"}): ErrorCode.invalid_config,
        topic("x-unknown-config", **{"no.such.config": "1"}): ErrorCode.invalid_config,
        topic("x-gap", assign=[(5, (0,))]): ErrorCode.invalid_replica_assignment,
        topic("x-no-replicas", assign=[(0, ())]): ErrorCode.invalid_replica_assignment,
        topic("x-other-broker", assign=[(0, (7,))]): ErrorCode.invalid_replica_assignment,
        topic("x-both", 1, assign=[(0, (0,))]): ErrorCode.invalid_partitions,
        topic("..", 1): ErrorCode.invalid_topic_exception,
        topic("a/b", 1): ErrorCode.invalid_topic_exception,
    }
    request = CreateTopicsRequest(
        topics=tuple(cases), timeout=datetime.timedelta(seconds=WAIT), validate_only=False
    )
    client = WireClient(address)
    response = client.call(request)
    client.close()
    assert {t.name: t.error_code for t in response.topics} == {
        t.name: code for t, code in cases.items()
    }
    assert not set(api_topics(address)) & {t.name for t in cases}


def api_topics(address: str) -> list[str]:
    client = WireClient(address)
    response = client.call(
        MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
    )
    client.close()
    return [t.name for t in response.topics]


def test_metadata_by_topic_id_before_v12_is_an_invalid_request(address: str) -> None:
    from kio.schema.metadata.v11.request import MetadataRequest as MetadataRequestV11
    from kio.schema.metadata.v11.request import MetadataRequestTopic as TopicV11

    client = WireClient(address)
    response = client.call(
        MetadataRequestV11(
            topics=(TopicV11(topic_id=None, name=None), TopicV11(topic_id=None, name="ledger")),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
    )
    client.close()
    # As Kafka: names are not nullable before v12, so the whole request is refused.
    assert [(t.name, t.error_code) for t in response.topics] == [
        ("", ErrorCode.invalid_request),
        ("ledger", ErrorCode.invalid_request),
    ]


def test_fetch_of_a_topic_without_partitions_is_answered(address: str) -> None:
    client = WireClient(address)
    response = client.call(fetch_request("ledger", {}))
    client.close()
    assert all(t.topic == "ledger" for t in response.responses)


# -- clients that vanish --------------------------------------------------------------------------


def test_client_vanishes_mid_request(address: str, ledger: Ledger) -> None:
    whole = request_frame(
        ApiKey.PRODUCE, 9, body_of(produce_request(ledger.topic, {0: good_batch([b"never"])}))
    )
    for cut in (4, 12, len(whole) // 2, len(whole) - 1):
        client = WireClient(address)
        client.send_raw(whole[:cut])
        client.close()  # nothing of a frame cut short may be applied: `expected` is unchanged


def test_client_vanishes_before_reading_answers(address: str, ledger: Ledger) -> None:
    # A whole Produce is applied even if nobody reads the answer, as Kafka does.
    values = [b"orphan-1", b"orphan-2"]
    client = WireClient(address)
    client.send(produce_request(ledger.topic, {1: good_batch(values)}))
    for _ in range(20):  # pipelined requests whose answers are never read
        client.send(api_versions_request())
    # parked in a long poll when we vanish: from the end of partition 0, nothing to read yet
    client.send(fetch_request(ledger.topic, {0: len(ledger.expected[0])}, max_wait=3.0))
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # a reset, not a polite close
    ledger.expected[1].extend(values)


# -- random bytes ---------------------------------------------------------------------------------

RANDOM_EXAMPLES = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _request_schema(api_key: int, version: int) -> type | None:
    try:
        return load_request_schema(api_key, version)
    except (UnknownAPIKey, UnknownEntity):
        return None  # advertised but refused unparsed (Produce v0-2)


def _errors_logged(broker: EmbeddedBroker) -> set[str]:
    return {line for line in broker.output if " ERROR " in line}


def _still_answers(address: str) -> None:
    client = WireClient(address, timeout=5)
    response = client.call(api_versions_request())
    client.close()
    assert response.error_code == ErrorCode.none


@RANDOM_EXAMPLES
@given(data=st.binary(min_size=1, max_size=600))
def test_random_bytes(address: str, data: bytes) -> None:
    client = WireClient(address)
    client.send_raw(data)
    client.close()
    _still_answers(address)


@RANDOM_EXAMPLES
@given(
    api_key=st.sampled_from(sorted(SUPPORTED)),
    version=st.integers(min_value=0, max_value=17),
    body=st.binary(max_size=400),
)
def test_random_bodies_behind_valid_headers(
    address: str, hostile_broker: EmbeddedBroker, api_key: int, version: int, body: bytes
) -> None:
    if _request_schema(api_key, version) is not None:
        frame = request_frame(api_key, version, body)
    else:  # a version kio has no schema for: a plain v1 header
        frame = struct.pack(">ihhih", 10 + len(body), api_key, version, 1, -1) + body
    before = _errors_logged(hostile_broker)
    client = WireClient(address)
    client.send_raw(frame)
    client.closed_by_peer(0.05)  # an answer or a close, whichever; neither may hurt
    client.close()
    _still_answers(address)
    assert _errors_logged(hostile_broker) == before, "the broker logged an error"


# Well-formed requests of every advertised API and version, with absurd values in every field
# (negative partitions, huge offsets, odd strings): answered or refused, never a handler crash.
# CreateTopics and CreatePartitions are left out: each example may ask for 10,000 partitions.
SIDE_EFFECTS_TOO_HEAVY = frozenset({19, 37})
st.register_type_strategy(Records, st.binary(max_size=200))


def _absurd_requests(excluded: frozenset[int] = frozenset()) -> st.SearchStrategy[Any]:
    schemas = [
        cls
        for key, (low, high) in sorted(SUPPORTED.items())
        if key not in excluded
        for version in range(low, high + 1)
        if (cls := _request_schema(key, version)) is not None
    ]
    return st.sampled_from(schemas).flatmap(st.from_type)


def _fetch_topic_without_partitions(request: Any) -> bool:
    # Known, in fetch.py (owned elsewhere): pinned by test_fetch_of_a_topic_without_partitions.
    return request.__api_key__ == 1 and any(not t.partitions for t in request.topics)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=_absurd_requests(SIDE_EFFECTS_TOO_HEAVY))
def test_absurd_values_in_well_formed_requests(
    address: str, hostile_broker: EmbeddedBroker, request: Any
) -> None:
    assume(not _fetch_topic_without_partitions(request))
    before = _errors_logged(hostile_broker)
    client = WireClient(address)
    client.send(request)
    client.closed_by_peer(0.02)  # an answer or a close, whichever comes
    client.close()
    _still_answers(address)
    assert _errors_logged(hostile_broker) == before, "the broker logged an error"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=_absurd_requests())
def test_the_length_check_lets_every_well_formed_request_through(request: Any) -> None:
    # The guard that stops absurd counts must never refuse what a real client can send.
    frame = request_frame(request.__api_key__, request.__version__, body_of(request))
    parsed = parse_request(frame[4:], SUPPORTED)
    assert parsed.body == request
