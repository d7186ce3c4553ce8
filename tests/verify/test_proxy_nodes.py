"""The proxy's per-broker faults (verify --apache-kafka): every client cut off from, or
black-holed or delayed on the way to, one broker while the others still answer."""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from onceflow.protocol.api_key import ApiKey
from onceflow.verify.proxy import BLACKHOLE, CUT, DELAY, KafkaProxy

# A request frame the proxy forwards as is (ApiVersions is never rewritten).
FRAME = struct.pack(">ihhi", 8, int(ApiKey.API_VERSIONS), 0, 7)


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def brokers() -> Iterator[list[tuple[str, int]]]:
    """Two stand-in brokers that echo every frame back."""
    servers = [socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo) for _ in range(2)]
    for server in servers:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield [("127.0.0.1", s.server_address[1]) for s in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy() -> Iterator[KafkaProxy]:
    proxy = KafkaProxy().start()
    yield proxy
    proxy.close()


def listeners(proxy: KafkaProxy, client: str, brokers: list[tuple[str, int]]) -> list[int]:
    bootstrap = ",".join(f"{h}:{p}" for h, p in brokers)
    return [int(a.rpartition(":")[2]) for a in proxy.bootstrap_for(client, bootstrap).split(",")]


def round_trip(port: int, timeout: float = 2.0) -> bytes:
    """Send one frame through the proxy and read what comes back (b'' if the connection was
    closed, TimeoutError if nothing came)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        got = b""
        try:
            s.sendall(FRAME)
            while len(got) < len(FRAME):
                chunk = s.recv(len(FRAME) - len(got))
                if not chunk:
                    return got
                got += chunk
        except ConnectionResetError:  # cut: closed at once, perhaps before the send
            pass
        return got


def test_a_cut_broker_is_unreachable_for_every_client_the_other_answers(
    proxy: KafkaProxy, brokers: list[tuple[str, int]]
) -> None:
    a0, b0 = listeners(proxy, "producer0", brokers)
    a1, b1 = listeners(proxy, "reader-rc0", brokers)
    assert round_trip(a0) == FRAME and round_trip(a1) == FRAME

    with socket.create_connection(("127.0.0.1", a0), timeout=2) as held:
        held.sendall(FRAME)
        assert held.recv(len(FRAME)) == FRAME
        proxy.isolate_node(brokers[0], CUT)
        with pytest.raises(ConnectionError):  # the open connection is reset...
            held.sendall(FRAME)
            if not held.recv(len(FRAME)):
                raise ConnectionResetError("closed")
    for port in (a0, a1):  # ...and new ones to that broker are closed at once
        assert round_trip(port) == b""
    assert round_trip(b0) == FRAME and round_trip(b1) == FRAME  # the other broker answers

    proxy.heal_node(brokers[0])
    assert round_trip(a0) == FRAME and round_trip(a1) == FRAME


def test_a_black_holed_broker_answers_late_and_a_delayed_one_slowly(
    proxy: KafkaProxy, brokers: list[tuple[str, int]]
) -> None:
    a, b = listeners(proxy, "copier0", brokers)
    proxy.isolate_node(brokers[1], BLACKHOLE)
    with pytest.raises(TimeoutError):
        round_trip(b, timeout=0.5)
    assert round_trip(a) == FRAME
    proxy.heal()  # heals brokers as well as clients
    assert round_trip(b) == FRAME

    proxy.isolate_node(brokers[0], DELAY, 0.3)
    started = time.monotonic()
    assert round_trip(a) == FRAME
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    assert round_trip(b) == FRAME
    assert time.monotonic() - started < 0.3
    proxy.heal_node(brokers[0])


def test_an_unknown_mode_is_refused(proxy: KafkaProxy, brokers: list[tuple[str, int]]) -> None:
    with pytest.raises(ValueError):
        proxy.isolate_node(brokers[0], "open")
