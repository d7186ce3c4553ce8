"""The relay in front of a node's inter-broker listener (apache_kafka/links.py), on a plain echo
server (no JVM): it relays both ways; cut resets what is open and refuses new connections;
heal lets them through again. The lagging-failover run test drives it on Kafka itself."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from onceflow.apache_kafka.cluster import HOST, free_ports
from onceflow.apache_kafka.links import NodeLink


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socket.create_server((HOST, 0))
    server.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(4096):
                    conn.sendall(data)
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


def exchange(port: int, payload: bytes) -> socket.socket:
    s = socket.create_connection((HOST, port), timeout=10)
    s.sendall(payload)
    assert s.recv(4096) == payload
    return s


def request(api_key: int) -> bytes:
    """A Kafka request frame as far as the relay reads it: size, api key, then the rest."""
    body = api_key.to_bytes(2, "big") + b"\x00" * 10
    return len(body).to_bytes(4, "big") + body


def closed(s: socket.socket) -> bool:
    """The peer closed or reset the connection (not merely slow: waits up to 10 s)."""
    s.settimeout(10)
    try:
        return s.recv(4096) == b""
    except ConnectionResetError:
        return True


def test_a_cut_link_resets_its_connections_and_refuses_new_ones_until_healed(
    echo_port: int,
) -> None:
    link = NodeLink(free_ports(1)[0], echo_port)
    link.start()
    open_before = exchange(link.port, request(27))
    try:
        link.cut()
        assert closed(open_before)
        with socket.create_connection((HOST, link.port), timeout=10) as refused:
            assert closed(refused)  # accepted, then closed at once: as a refused connection
        assert link.refused == 1
        link.heal()
        exchange(link.port, request(1)).close()
        assert link.connections == 2
    finally:
        open_before.close()
        link.close()


def test_cutting_fetches_resets_the_fetchers_only_and_any_connection_that_fetches(
    echo_port: int,
) -> None:
    link = NodeLink(free_ports(1)[0], echo_port)
    link.start()
    try:
        fetcher = exchange(link.port, request(18) + request(1))  # ApiVersions, then Fetch
        markers = exchange(link.port, request(18) + request(27))  # WriteTxnMarkers
        link.cut(fetches_only=True)
        assert closed(fetcher)
        exchange(link.port, request(27)).close()  # new ones pass too
        markers.sendall(request(27))
        assert markers.recv(4096) == request(27)  # still open, still relayed
        split = request(1)
        markers.sendall(split[:3])  # a Fetch, its header split over two packets
        markers.sendall(split[3:])
        assert closed(markers)  # reset before the Fetch reaches the node
        link.heal()
        exchange(link.port, request(1)).close()
    finally:
        link.close()
