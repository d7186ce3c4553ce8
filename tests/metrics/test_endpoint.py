"""The scrape endpoint is bounded like any listener: a malformed, oversized, slow or flooding
client gets an HTTP error or a closed connection, and other scrapers (and the broker's Kafka
clients) are served meanwhile."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from onceflow.broker.config import BrokerConfig, ConfigError
from onceflow.broker.embedded import EmbeddedBroker
from onceflow.metrics import endpoint as endpoint_module
from onceflow.metrics.endpoint import MAX_CLIENTS, MetricsEndpoint
from onceflow.metrics.snapshot import PartitionRow, Snapshot, Steps
from tests.metrics.scrape import scrape, value
from tests.waiting import wait_for
from tests.wire import api_versions


def _read() -> Steps:
    """A broker's state with one partition, as read_state copies it."""
    yield
    return Snapshot(partitions=[PartitionRow("t", 0, 10, 5, 0, 1, 0, 5)])


async def _exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send `data`, then read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def _run(test: Any) -> None:
    async def main() -> None:
        endpoint = MetricsEndpoint(_read, "127.0.0.1", 0)
        await endpoint.start()
        try:
            await test(endpoint)
        finally:
            await endpoint.stop()

    asyncio.run(main())


def test_a_scrape_answers_and_closes() -> None:
    async def test(endpoint: MetricsEndpoint) -> None:
        answer = await _exchange(endpoint.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b'kafka_log_log_logendoffset{topic="t",partition="0"} 5.0' in answer

    _run(test)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"garbage\r\n\r\n", b"400"),
        (b"\x00\x01\x02 \xff\r\n\r\n", b"400"),
        (b"POST /metrics HTTP/1.1\r\n\r\n", b"405"),
        (b"GET /admin HTTP/1.1\r\n\r\n", b"404"),
        (b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"a" * 20_000 + b"\r\n\r\n", b"431"),
    ],
)
def test_a_malformed_request_gets_an_error_and_a_close(request_bytes: bytes, status: bytes) -> None:
    async def test(endpoint: MetricsEndpoint) -> None:
        answer = await _exchange(endpoint.port, request_bytes)
        assert answer.split(b" ")[1] == status, answer[:100]
        good = await _exchange(endpoint.port, b"GET /metrics HTTP/1.0\r\n\r\n")
        assert good.startswith(b"HTTP/1.1 200")

    _run(test)


def test_a_flood_of_connections_is_bounded_and_a_silent_client_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(endpoint_module, "REQUEST_TIMEOUT_S", 0.5)

    async def test(endpoint: MetricsEndpoint) -> None:
        silent = [await asyncio.open_connection("127.0.0.1", endpoint.port) for _ in range(40)]
        deadline = time.monotonic() + 10
        while endpoint.refused < 40 - MAX_CLIENTS and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert len(endpoint.clients) <= MAX_CLIENTS
        assert endpoint.refused == 40 - MAX_CLIENTS
        # The silent ones are aborted at REQUEST_TIMEOUT_S; then a scraper gets in.
        for reader, _writer in silent:
            assert await asyncio.wait_for(reader.read(), 5) == b""
        answer = await _exchange(endpoint.port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200")
        for _reader, writer in silent:
            writer.close()

    _run(test)


def test_renders_are_rate_limited() -> None:
    async def test(endpoint: MetricsEndpoint) -> None:
        for _ in range(20):
            await _exchange(endpoint.port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert endpoint.renders < 20  # the ones within MIN_RENDER_INTERVAL_S share a render

    _run(test)


def test_metrics_listen_must_be_host_and_port() -> None:
    assert BrokerConfig().metrics_address() is None  # off by default
    assert BrokerConfig().with_settings({"metrics.listen": "127.0.0.1:9404"}).metrics_address() == (
        "127.0.0.1",
        9404,
    )
    for bad in ("9404x", "localhost", "host:99999"):
        with pytest.raises(ConfigError, match=r"metrics\.listen"):
            BrokerConfig().with_settings({"metrics.listen": bad})


def test_a_broker_under_a_scrape_flood_serves_its_clients(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "data", settings={"metrics.listen": "127.0.0.1:0"}).start()
    held: list[socket.socket] = []
    try:
        assert broker.metrics_port is not None
        for _ in range(3 * MAX_CLIENTS):
            sock = socket.create_connection(("127.0.0.1", broker.metrics_port), timeout=10)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nX: ")  # a head never finished
            held.append(sock)
        assert api_versions(broker.bootstrap)  # Kafka clients are served meanwhile
        for sock in held:
            sock.close()
        samples = wait_for(
            lambda: _try_scrape(broker.metrics_port), what="a scrape once the flood is gone"
        )
        assert value(samples, "kafka_server_replicamanager_partitioncount") is not None
        assert broker.process is not None and broker.process.poll() is None
    finally:
        for sock in held:
            sock.close()
        broker.stop()


def _try_scrape(port: int | None) -> Any:
    assert port is not None
    try:
        return scrape(port, timeout=2)
    except OSError:
        return None
