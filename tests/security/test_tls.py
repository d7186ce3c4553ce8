"""TLS listeners: every client library over SSL, mutual TLS, and what is refused (a PLAINTEXT
client on a TLS port, an untrusted or expired client certificate) gets no data."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from onceflow.broker.config import BrokerConfig
from onceflow.broker.embedded import EmbeddedBroker
from onceflow.broker.server import Broker
from tests.security.certs import Certs, broker_tls_settings
from tests.security.conftest import confluent_config
from tests.security.roundtrip import (
    RECORDS,
    aiokafka_round_trip,
    confluent_round_trip,
    kafka_python_round_trip,
)
from tests.wire import WireClient, api_versions_request

T = TypeVar("T")


def test_confluent_over_ssl(secure_broker: EmbeddedBroker, certs: Certs) -> None:
    assert confluent_round_trip(confluent_config(secure_broker, certs, "SSL")) == RECORDS


def test_confluent_over_mutual_tls(secure_broker: EmbeddedBroker, certs: Certs) -> None:
    config = confluent_config(
        secure_broker, certs, "SSL", client_cert=(certs.client_cert, certs.client_key)
    )
    assert confluent_round_trip(config) == RECORDS


def test_kafka_python_over_ssl(secure_broker: EmbeddedBroker, certs: Certs) -> None:
    got = kafka_python_round_trip(
        secure_broker.bootstrap_for("SSL"),
        security_protocol="SSL",
        ssl_cafile=str(certs.ca),
        ssl_certfile=str(certs.client_cert),
        ssl_keyfile=str(certs.client_key),
    )
    assert got == RECORDS


def test_aiokafka_over_ssl(secure_broker: EmbeddedBroker, certs: Certs) -> None:
    got = aiokafka_round_trip(secure_broker.bootstrap_for("SSL"), certs.ca, security_protocol="SSL")
    assert got == RECORDS


@pytest.mark.parametrize("listener", ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"])
def test_metadata_advertises_the_listener_connected_to(
    secure_broker: EmbeddedBroker, certs: Certs, listener: str
) -> None:
    mechanism = "SCRAM-SHA-256" if listener.startswith("SASL") else None
    admin = AdminClient(confluent_config(secure_broker, certs, listener, mechanism))
    brokers = admin.list_topics(timeout=30).brokers
    assert [(b.host, b.port) for b in brokers.values()] == [
        ("127.0.0.1", secure_broker.listener_ports[listener])
    ]


def test_a_plaintext_client_on_a_tls_port_gets_nothing(
    secure_broker: EmbeddedBroker, certs: Certs
) -> None:
    with WireClient(f"127.0.0.1:{secure_broker.listener_ports['SSL']}") as wire:
        wire.send(api_versions_request())
        answer = wire.receive_frame()
        # At most a TLS alert (not a Kafka frame), then the connection is closed.
        assert answer is None or not answer.startswith(b"\x00\x00\x00\x01")
        assert wire.closed_by_peer()


def _client_context(
    certs: Certs, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


@pytest.mark.parametrize("which", ["untrusted", "expired"])
def test_a_bad_client_certificate_fails_even_where_only_requested(
    secure_broker: EmbeddedBroker, certs: Certs, which: str
) -> None:
    cert, key = (
        (certs.untrusted_cert, certs.untrusted_key)
        if which == "untrusted"
        else (certs.expired_cert, certs.expired_key)
    )
    errors: list[object] = []
    producer = Producer(
        confluent_config(
            secure_broker, certs, "SSL", client_cert=(cert, key), error_cb=errors.append
        )
    )
    producer.produce("never-written", b"x")
    # TLS 1.3 checks the client certificate after the client's side of the handshake: the
    # failure reaches the client on its first read, as a closed connection.
    assert producer.flush(5) == 1
    context = _client_context(certs, cert, key)
    try:
        wire = WireClient(f"127.0.0.1:{secure_broker.listener_ports['SSL']}", tls=context)
    except (ssl.SSLError, ConnectionError):
        return  # refused within the handshake
    with wire:
        wire.send(api_versions_request())
        assert wire.receive_frame() is None


# -- in process: the principal each connection gets ----------------------------------------


async def _principals(
    config: BrokerConfig, attempts: list[tuple[str, ssl.SSLContext | None]]
) -> list[str]:
    broker = Broker(config)
    await broker.start()
    try:
        out = []
        for listener, context in attempts:
            port = broker.bound_ports[listener]
            try:
                _, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1" if context else None
                )
            except (ssl.SSLError, ConnectionError):
                out.append("refused")
                continue
            sessions = await _until(
                lambda: [c.session for c in broker._connections if c.session is not None]
            )
            out.append(str(sessions[0].principal))
            writer.close()
            await _until(lambda: not broker._connections)
        return out
    finally:
        await broker.stop()


async def _until(condition: Callable[[], T], timeout: float = 10.0) -> T:
    """`condition()` once truthy, checked on the broker's own loop (with a deadline)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (result := condition()):
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
    return result


def _tls_config(tmp_path: Path, certs: Certs, client_auth: str) -> BrokerConfig:
    return BrokerConfig(data_dir=tmp_path / "data", fsync=False).with_settings(
        {
            "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
            **broker_tls_settings(certs, client_auth),
        }
    )


def test_principals_follow_kafkas_default_mapping(tmp_path: Path, certs: Certs) -> None:
    principals = asyncio.run(
        _principals(
            _tls_config(tmp_path, certs, "requested"),
            [
                ("PLAINTEXT", None),
                ("SSL", _client_context(certs)),
                ("SSL", _client_context(certs, certs.client_cert, certs.client_key)),
            ],
        )
    )
    assert principals == ["User:ANONYMOUS", "User:ANONYMOUS", f"User:{certs.client_dn}"]


def test_required_client_auth_refuses_a_client_without_certificate(
    tmp_path: Path, certs: Certs
) -> None:
    async def attempt() -> tuple[list[str], bool]:
        config = _tls_config(tmp_path, certs, "required")
        ok = await _principals(
            config, [("SSL", _client_context(certs, certs.client_cert, certs.client_key))]
        )
        broker = Broker(config)
        await broker.start()
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1",
                broker.bound_ports["SSL"],
                ssl=_client_context(certs),
                server_hostname="127.0.0.1",
            )
            writer.write(b"\x00\x00\x00\x01\x00")
            try:
                closed = await asyncio.wait_for(reader.read(), 10) == b""
            except (ssl.SSLError, ConnectionError):
                closed = True
            writer.close()
            return ok, closed
        except (ssl.SSLError, ConnectionError):
            return ok, True
        finally:
            await broker.stop()

    ok, refused = asyncio.run(attempt())
    assert ok == [f"User:{certs.client_dn}"]
    assert refused
