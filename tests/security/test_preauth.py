"""Before authentication a SASL connection may send only small frames, one at a time
(Kafka's SaslServerAuthenticator): a frame over `sasl.server.max.receive.size` closes it, and
unauthenticated or authenticated connections that announce huge frames and trickle them do not
keep anyone else waiting (issue 19, item 1). A client may pipeline its first request behind
its login (item 7)."""

from __future__ import annotations

import datetime
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.create_topics.v7.request import (
    CreatableTopic,
    CreatableTopicConfig,
    CreateTopicsRequest,
)
from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.protocol.api_key import ApiKey
from tests.hostile.victims import (
    ROUND_TRIP_TIMEOUT,
    Trickler,
    Victims,
    size_prefix,
    trickle_while_served,
)
from tests.security.brokers import broker_with_users
from tests.security.certs import Certs
from tests.security.conftest import ALL_LISTENERS, USERS, secure_settings
from tests.waiting import wait_for_line
from tests.wire import WireClient, api_versions_request, body_of, request_entity, request_frame

MiB = 1 << 20
SASL_SERVER_MAX_RECEIVE_SIZE = 524288  # Kafka's default
PASSWORD = USERS["alice"][0]


@pytest.fixture
def broker(tmp_path: Path, certs: Certs) -> Iterator[EmbeddedBroker]:
    """A broker of its own: the attacks below would freeze a shared one."""
    with broker_with_users(
        tmp_path / "data", USERS, listeners=ALL_LISTENERS, settings=secure_settings(certs)
    ) as started:
        yield started


def _connect(
    broker: EmbeddedBroker, certs: Certs, listener: str, timeout: float = ROUND_TRIP_TIMEOUT
) -> WireClient:
    tls = ssl.create_default_context(cafile=str(certs.ca)) if "SSL" in listener else None
    return WireClient(broker.bootstrap_for(listener), timeout=timeout, tls=tls)


# Metadata v12 of no topic: the request the tests pipeline behind a login.
METADATA_FIELDS = {
    "topics": (),
    "allow_auto_topic_creation": False,
    "include_topic_authorized_operations": False,
}


def _metadata(wire: WireClient) -> None:
    assert wire.request(ApiKey.METADATA, 12, **METADATA_FIELDS).brokers


def _login(wire: WireClient) -> None:
    assert wire.request(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN").error_code == 0
    answer = wire.request(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=f"\0alice\0{PASSWORD}".encode())
    assert answer.error_code == ErrorCode.none, answer


def _frame(api_key: int, version: int, correlation_id: int, **fields: object) -> bytes:
    body = body_of(request_entity(api_key, version, **fields))
    return request_frame(api_key, version, body, correlation_id)


# -- sasl.server.max.receive.size --------------------------------------------------------------


@pytest.mark.parametrize("listener", ["SASL_PLAINTEXT", "SASL_SSL"])
@pytest.mark.parametrize("after_api_versions", [False, True])
def test_a_frame_over_the_pre_authentication_cap_closes_the_connection(
    broker: EmbeddedBroker, certs: Certs, listener: str, after_api_versions: bool
) -> None:
    with _connect(broker, certs, listener) as wire:
        if after_api_versions:
            assert wire.call(api_versions_request()).error_code == ErrorCode.none
        # The size prefix alone is enough: nothing of the body is waited for.
        wire.send_raw(struct.pack(">i", SASL_SERVER_MAX_RECEIVE_SIZE + 1))
        assert wire.closed_by_peer()
    wait_for_line(
        broker,
        "sasl.server.max.receive.size",
        10,
        "the broker to log why it closed the connection",
    )


def test_the_cap_is_lifted_once_authenticated(broker: EmbeddedBroker, certs: Certs) -> None:
    with _connect(broker, certs, "SASL_PLAINTEXT") as wire:
        _login(wire)
        # A frame beyond the pre-authentication cap is an ordinary request now: a
        # CreateTopics whose body is padded out by one long (and invalid) topic config value.
        topic = CreatableTopic(
            name="big-request",
            num_partitions=1,
            replication_factor=-1,
            assignments=(),
            configs=(CreatableTopicConfig(name="cleanup.policy", value="x" * MiB),),
        )
        answer = wire.call(
            CreateTopicsRequest(
                topics=(topic,), timeout=datetime.timedelta(seconds=10), validate_only=True
            )
        )
        assert answer.topics[0].error_code == ErrorCode.invalid_config
        _metadata(wire)


# -- the TLS handshake: what OpenSSL bounds before any frame is read ---------------------------

TLS_HANDSHAKE_RECORD = b"\x16\x03\x01"  # record type handshake, TLS 1.0 framing (ClientHello)


@pytest.mark.parametrize(
    ("what", "data"),
    [
        # a record longer than TLS allows (2^14 + 2048): refused on its header
        ("record too long", TLS_HANDSHAKE_RECORD + struct.pack(">H", 0xFFFF)),
        # a full record whose ClientHello announces 16 MiB: refused on the message header
        (
            "ClientHello of 16 MiB",
            TLS_HANDSHAKE_RECORD
            + struct.pack(">H", 1 << 14)
            + b"\x01\xff\xff\xff"
            + bytes((1 << 14) - 4),
        ),
    ],
)
def test_a_tls_handshake_announcing_too_much_is_refused_at_once(
    broker: EmbeddedBroker, what: str, data: bytes
) -> None:
    with WireClient(broker.bootstrap_for("SSL")) as raw:  # TCP only: the bytes are ours
        raw.send_raw(data)
        assert raw.closed_by_peer(), what


# -- slow loris: huge frames announced, then trickled ------------------------------------------


def _victims(broker: EmbeddedBroker, certs: Certs, admin: WireClient) -> Victims:
    """An authenticated admin, a new SASL login and a PLAINTEXT Metadata, over and over."""

    def new_login() -> None:
        with _connect(broker, certs, "SASL_PLAINTEXT") as wire:
            _login(wire)
            _metadata(wire)

    def plaintext_metadata() -> None:
        with _connect(broker, certs, "PLAINTEXT") as wire:
            _metadata(wire)

    return Victims(
        {
            "authenticated admin": lambda: _metadata(admin),
            "new SASL login": new_login,
            "PLAINTEXT Metadata": plaintext_metadata,
        }
    )


def test_unauthenticated_tricklers_do_not_freeze_the_broker(
    broker: EmbeddedBroker, certs: Certs
) -> None:
    """The issue's recipe: three unauthenticated connections announce about 100 MiB each and
    trickle a byte at a time; others are served within 1 s throughout."""
    admin = _connect(broker, certs, "SASL_PLAINTEXT")
    _login(admin)
    with _victims(broker, certs, admin) as victims:
        victims.wait_rounds(2)
        attack = Trickler(
            [
                _connect(broker, certs, "SASL_PLAINTEXT"),
                _connect(broker, certs, "SASL_PLAINTEXT"),
                _connect(broker, certs, "SASL_SSL"),
            ],
            size_prefix(100 * MiB),
        )
        # and frames under the cap, trickled too: they may stay, but hold nothing shared
        under_cap = Trickler(
            [_connect(broker, certs, "SASL_PLAINTEXT") for _ in range(3)],
            size_prefix(SASL_SERVER_MAX_RECEIVE_SIZE),
        )
        # and TLS handshakes trickled, a full-size record a byte at a time (TCP only)
        handshakes = Trickler(
            [WireClient(broker.bootstrap_for("SSL")) for _ in range(3)],
            TLS_HANDSHAKE_RECORD + struct.pack(">H", 1 << 14),
        )
        try:
            started = victims.rounds
            victims.wait_rounds(started + 10)
            for client in attack.clients:  # refused at once, whatever the listener
                assert client.closed_by_peer(1.0)
        finally:
            attack.stop()
            under_cap.stop()
            handshakes.stop()
    admin.close()
    print(victims.report())
    victims.assert_served_within(1.0)


def test_authenticated_tricklers_do_not_freeze_the_broker(
    broker: EmbeddedBroker, certs: Certs
) -> None:
    """Logged-in connections may announce frames up to socket.request.max.bytes (100 MiB):
    four of them trickling theirs hold nothing of the request memory pool that others need."""
    admin = _connect(broker, certs, "SASL_PLAINTEXT")
    _login(admin)
    attackers = []
    for listener in ["SASL_PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "PLAINTEXT"]:
        client = _connect(broker, certs, listener)
        if listener != "PLAINTEXT":
            _login(client)
        attackers.append(client)
    with _victims(broker, certs, admin) as victims:
        trickle_while_served(victims, attackers, size_prefix(100 * MiB - 1))
    admin.close()
    print(victims.report())
    victims.assert_served_within(1.0)


# -- item 7: a request pipelined behind the login ----------------------------------------------


def test_a_request_sent_with_the_login_in_one_write_is_served(
    broker: EmbeddedBroker, certs: Certs
) -> None:
    with _connect(broker, certs, "SASL_PLAINTEXT") as wire:
        wire.send_raw(
            _frame(ApiKey.SASL_HANDSHAKE, 1, 1, mechanism="PLAIN")
            + _frame(ApiKey.SASL_AUTHENTICATE, 2, 2, auth_bytes=f"\0alice\0{PASSWORD}".encode())
            + _frame(ApiKey.METADATA, 12, 3, **METADATA_FIELDS)
        )
        handshake = wire.receive(request_entity(ApiKey.SASL_HANDSHAKE, 1, mechanism=""), 1)
        assert handshake.error_code == ErrorCode.none
        authenticate = wire.receive(request_entity(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=b""), 2)
        assert authenticate.error_code == ErrorCode.none
        metadata = wire.receive(
            request_entity(ApiKey.METADATA, 12, **METADATA_FIELDS),
            3,
        )
        assert metadata.brokers[0].port == broker.listener_ports["SASL_PLAINTEXT"]


def test_a_request_sent_with_bare_v0_tokens_in_one_write_is_served(
    broker: EmbeddedBroker, certs: Certs
) -> None:
    token = f"\0alice\0{PASSWORD}".encode()
    with _connect(broker, certs, "SASL_SSL") as wire:
        wire.send_raw(
            _frame(ApiKey.API_VERSIONS, 3, 1, client_software_name="t", client_software_version="1")
            + _frame(ApiKey.SASL_HANDSHAKE, 0, 2, mechanism="PLAIN")
            + struct.pack(">i", len(token))
            + token
            + _frame(ApiKey.METADATA, 12, 3, **METADATA_FIELDS)
        )
        assert wire.receive(api_versions_request(), 1).error_code == ErrorCode.none
        handshake = wire.receive(request_entity(ApiKey.SASL_HANDSHAKE, 0, mechanism=""), 2)
        assert handshake.error_code == ErrorCode.none
        assert wire.receive_frame() == b""  # PLAIN's empty final token, bare
        metadata = wire.receive(
            request_entity(ApiKey.METADATA, 12, **METADATA_FIELDS),
            3,
        )
        assert metadata.brokers[0].port == broker.listener_ports["SASL_SSL"]


def test_a_request_pipelined_behind_a_failed_login_is_not_served(
    broker: EmbeddedBroker, certs: Certs
) -> None:
    with _connect(broker, certs, "SASL_PLAINTEXT") as wire:
        wire.send_raw(
            _frame(ApiKey.SASL_HANDSHAKE, 1, 1, mechanism="PLAIN")
            + _frame(ApiKey.SASL_AUTHENTICATE, 2, 2, auth_bytes=b"\0alice\0wrong")
            + _frame(ApiKey.METADATA, 12, 3, **METADATA_FIELDS)
        )
        assert wire.receive(request_entity(ApiKey.SASL_HANDSHAKE, 1, mechanism=""), 1)
        failed = wire.receive(request_entity(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=b""), 2)
        assert failed.error_code == ErrorCode.sasl_authentication_failed
        assert wire.receive_frame() is None  # closed: the Metadata is never answered
