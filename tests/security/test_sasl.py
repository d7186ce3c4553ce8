"""SASL listeners: each mechanism with each client library, failures as Kafka answers them
(SASL_AUTHENTICATION_FAILED after the delay, then closed; nothing served before
authentication), bare v0 tokens, and the exactly-once path over SASL_SSL."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.protocol.api_key import ApiKey
from tests.security.certs import Certs
from tests.security.conftest import USERS, confluent_config
from tests.security.roundtrip import (
    RECORDS,
    aiokafka_round_trip,
    confluent_round_trip,
    kafka_python_round_trip,
)
from tests.waiting import wait_for
from tests.wire import WireClient, request_entity


@pytest.mark.parametrize(
    ("mechanism", "user"),
    [("PLAIN", "alice"), ("SCRAM-SHA-256", "alice"), ("SCRAM-SHA-512", "bob")],
)
def test_confluent_over_sasl_ssl(
    secure_broker: EmbeddedBroker, certs: Certs, mechanism: str, user: str
) -> None:
    config = confluent_config(secure_broker, certs, "SASL_SSL", mechanism, user)
    assert confluent_round_trip(config) == RECORDS


def test_confluent_over_sasl_plaintext(secure_broker: EmbeddedBroker, certs: Certs) -> None:
    config = confluent_config(secure_broker, certs, "SASL_PLAINTEXT", "SCRAM-SHA-256")
    assert confluent_round_trip(config) == RECORDS


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_kafka_python_over_sasl_ssl(
    secure_broker: EmbeddedBroker, certs: Certs, mechanism: str
) -> None:
    got = kafka_python_round_trip(
        secure_broker.bootstrap_for("SASL_SSL"),
        security_protocol="SASL_SSL",
        ssl_cafile=str(certs.ca),
        sasl_mechanism=mechanism,
        sasl_plain_username="bob",
        sasl_plain_password=USERS["bob"][0],
    )
    assert got == RECORDS


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_aiokafka_over_sasl_ssl(
    secure_broker: EmbeddedBroker, certs: Certs, mechanism: str
) -> None:
    got = aiokafka_round_trip(
        secure_broker.bootstrap_for("SASL_SSL"),
        certs.ca,
        security_protocol="SASL_SSL",
        sasl_mechanism=mechanism,
        sasl_plain_username="alice",
        sasl_plain_password=USERS["alice"][0],
    )
    assert got == RECORDS


@pytest.mark.parametrize(
    ("mechanism", "user", "password", "reason"),
    [
        ("SCRAM-SHA-256", "alice", "not-her-password", "invalid proof"),
        ("SCRAM-SHA-512", "mallory", "whatever-pw", "no SCRAM-SHA-512 credential"),
        ("PLAIN", "alice", "not-her-password", "wrong password"),
        ("PLAIN", "mallory", "whatever-pw", "unknown user"),
        ("SCRAM-SHA-256", "bob", USERS["bob"][0], "no SCRAM-SHA-256 credential"),
    ],
)
def test_bad_credentials_get_an_authentication_error_and_no_data(
    secure_broker: EmbeddedBroker,
    certs: Certs,
    mechanism: str,
    user: str,
    password: str,
    reason: str,
) -> None:
    errors: list[KafkaError] = []
    config = confluent_config(
        secure_broker, certs, "SASL_SSL", mechanism, user, password, error_cb=errors.append
    )
    consumer = Consumer({**config, "group.id": f"g-{uuid.uuid4().hex[:8]}"})
    consumer.subscribe(["anything"])
    try:
        # The client reports an authentication error (not a lost connection) and gets nothing.
        wait_for(
            lambda: any(e.code() == KafkaError._AUTHENTICATION for e in errors),
            30,
            lambda: f"errors so far: {errors}",
            poll=lambda: consumer.poll(0.2),
        )
    finally:
        consumer.close()
    assert any("Authentication failed" in e.str() for e in errors)
    # Logged with the principal and the address, never the password.
    log = "\n".join(secure_broker.output)
    assert f"failed authentication of 'User:{user}' from 127.0.0.1:" in log
    assert reason in log
    assert password not in log


def _connect(broker: EmbeddedBroker, listener: str = "SASL_PLAINTEXT") -> WireClient:
    return WireClient(f"127.0.0.1:{broker.listener_ports[listener]}")


def _handshake(wire: WireClient, mechanism: str, version: int = 1) -> object:
    return wire.request(ApiKey.SASL_HANDSHAKE, version, mechanism=mechanism)


def _metadata(wire: WireClient) -> object:
    return wire.request(
        ApiKey.METADATA,
        12,
        topics=(),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def test_failed_authentication_is_answered_after_the_delay_then_closed(
    secure_broker: EmbeddedBroker,
) -> None:
    with _connect(secure_broker) as wire:
        handshake = _handshake(wire, "PLAIN")
        assert handshake.error_code == ErrorCode.none
        assert set(handshake.mechanisms) == {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
        started = time.monotonic()
        answer = wire.request(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=b"\x00alice\x00wrong")
        waited = time.monotonic() - started
        assert answer.error_code == ErrorCode.sasl_authentication_failed
        assert answer.error_message == "Authentication failed: Invalid username or password"
        assert waited >= 0.1  # connection.failed.authentication.delay.ms, a lower bound
        assert wire.closed_by_peer()


@pytest.mark.parametrize("api_key", [ApiKey.METADATA, ApiKey.SASL_AUTHENTICATE])
def test_nothing_but_sasl_is_served_before_authentication(
    secure_broker: EmbeddedBroker, api_key: int
) -> None:
    with _connect(secure_broker) as wire:
        assert wire.request(
            ApiKey.API_VERSIONS, 3, client_software_name="t", client_software_version="1"
        )
        if api_key == ApiKey.METADATA:
            request = request_entity(
                ApiKey.METADATA,
                12,
                topics=None,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        else:  # before SaslHandshake
            request = request_entity(
                ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=b"\x00alice\x00alice-secret"
            )
        wire.send(request)
        assert wire.closed_by_peer()


def test_an_unsupported_mechanism_is_refused_with_the_enabled_ones(
    secure_broker: EmbeddedBroker,
) -> None:
    with _connect(secure_broker) as wire:
        answer = _handshake(wire, "GSSAPI")
        assert answer.error_code == ErrorCode.unsupported_sasl_mechanism
        assert "SCRAM-SHA-256" in answer.mechanisms
        assert wire.closed_by_peer()


def test_sasl_on_a_plaintext_listener_is_an_illegal_state(secure_broker: EmbeddedBroker) -> None:
    with _connect(secure_broker, "PLAINTEXT") as wire:
        assert _handshake(wire, "PLAIN").error_code == ErrorCode.illegal_sasl_state
        answer = wire.request(ApiKey.SASL_AUTHENTICATE, 1, auth_bytes=b"\x00a\x00b")
        assert answer.error_code == ErrorCode.illegal_sasl_state
        assert _metadata(wire)  # and the connection goes on serving


def test_handshake_v0_takes_bare_tokens(secure_broker: EmbeddedBroker) -> None:
    """KIP-43: after SaslHandshake v0 the tokens travel size-framed without a header."""
    with _connect(secure_broker) as wire:
        assert _handshake(wire, "PLAIN", version=0).error_code == ErrorCode.none
        wire.send_frame(b"\x00alice\x00" + USERS["alice"][0].encode())
        assert wire.receive_frame() == b""  # PLAIN's empty final token
        metadata = _metadata(wire)
        assert metadata.brokers[0].port == secure_broker.listener_ports["SASL_PLAINTEXT"]
    with _connect(secure_broker) as wire:
        assert _handshake(wire, "PLAIN", version=0).error_code == ErrorCode.none
        wire.send_frame(b"\x00alice\x00wrong")
        assert wire.receive_frame() is None  # no answer: closed after the delay


def test_transactions_and_read_committed_over_sasl_ssl(
    secure_broker: EmbeddedBroker, certs: Certs
) -> None:
    config = confluent_config(secure_broker, certs, "SASL_SSL", "SCRAM-SHA-512", "bob")
    topic = f"sec-txn-{uuid.uuid4().hex[:8]}"
    producer = Producer({**config, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    producer.abort_transaction(30)
    producer.begin_transaction()
    for value in RECORDS:
        producer.produce(topic, value)
    producer.commit_transaction(30)
    consumer = Consumer(
        {
            **config,
            "group.id": topic,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    try:
        wait_for(
            lambda: len(got) >= len(RECORDS),
            30,
            lambda: f"read {got}",
            poll=lambda: _collect(consumer, got),
        )
    finally:
        consumer.close()
    assert got == RECORDS


def _collect(consumer: Consumer, into: list[bytes]) -> None:
    message = consumer.poll(0.2)
    if message is not None and message.error() is None:
        into.append(message.value())
