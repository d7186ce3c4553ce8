"""Node-to-node links of a loopback Apache Kafka cluster that can be cut: each node's
inter-broker listener (replica fetches, transaction markers) is reached by the other nodes
through a relay, so that a node can be cut off from the other nodes, or only its followers'
fetches from it, while its clients and the controller quorum (their own listeners) still
reach it, as a network partition between brokers would. With 3 combined broker+controller
nodes this is the way to leave a leader alone in its ISR: pausing both its followers would
also stop two of the three controllers, and no ISR change is committed without a quorum.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from onceflow.apache_kafka.cluster import HOST, KafkaCluster, KafkaNode, free_ports

REPLICATION_LISTENER = "REPLICATION"
CHUNK = 64 << 10


FETCH = 1  # the Fetch request's api key: what a follower replicates with


class _Relayed:
    """One connection through a link: the two sockets, and whether Fetch requests (a
    follower's replication) went through it."""

    def __init__(self, downstream: socket.socket, upstream: socket.socket) -> None:
        self.downstream, self.upstream = downstream, upstream
        self.fetches = False

    def reset(self) -> None:
        _shut(self.downstream)
        _shut(self.upstream)


class NodeLink:
    """A TCP relay in front of one node's inter-broker listener. `cut()` resets every
    connection through it and refuses new ones (accepted, then closed at once) until
    `heal()`; `cut(fetches_only=True)` resets only the connections that carry Fetch requests
    (the followers' replica fetchers), and any that sends one, while the other inter-broker
    requests (transaction markers, say) still pass: the node's followers lag behind it."""

    def __init__(self, port: int, upstream_port: int) -> None:
        self.port, self.upstream_port = port, upstream_port
        self.cut_off = False
        self.fetches_only = False
        self.connections = 0  # relayed since start, for tests and post-mortems
        self.refused = 0  # connections refused and fetches reset while cut
        self._lock = threading.Lock()
        self._open: set[_Relayed] = set()
        self._listener: socket.socket | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self.port))
        listener.listen(64)
        listener.settimeout(0.5)  # so that close() is seen
        self._listener = listener
        self._stop.clear()
        threading.Thread(target=self._accept, name=f"link-{self.port}", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._reset(lambda relayed: True)

    def cut(self, fetches_only: bool = False) -> None:
        with self._lock:
            self.cut_off, self.fetches_only = True, fetches_only
        self._reset(lambda relayed: relayed.fetches or not fetches_only)

    def heal(self) -> None:
        with self._lock:
            self.cut_off = False

    def _refuses(self, fetch: bool) -> bool:
        with self._lock:
            refused = self.cut_off and (fetch or not self.fetches_only)
            self.refused += refused
            return refused

    def _reset(self, which: Callable[[_Relayed], bool]) -> None:
        with self._lock:
            chosen = {r for r in self._open if which(r)}
            self._open -= chosen
        for relayed in chosen:
            relayed.reset()

    def _accept(self) -> None:
        listener = self._listener
        while listener is not None and not self._stop.is_set():
            try:
                downstream, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._refuses(fetch=False):
                _shut(downstream)
                continue
            try:
                upstream = socket.create_connection((HOST, self.upstream_port), timeout=2)
            except OSError:  # the node is down: as if it refused the connection itself
                _shut(downstream)
                continue
            for s in (downstream, upstream):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            relayed = _Relayed(downstream, upstream)
            with self._lock:
                self._open.add(relayed)
                self.connections += 1
            threading.Thread(target=self._requests, args=(relayed,), daemon=True).start()
            threading.Thread(target=self._responses, args=(relayed,), daemon=True).start()

    def _requests(self, relayed: _Relayed) -> None:
        """Requests to the node, frame by frame (a size, then the api key): a request's
        header is held back until whole, so that a Fetch is seen before any of it passes."""
        held = b""  # the start of a header that is not whole yet
        body_left = 0  # bytes of the current request still to pass
        try:
            while data := relayed.downstream.recv(CHUNK):
                data, held = held + data, b""
                i = 0
                while i < len(data):
                    if body_left:
                        step = min(body_left, len(data) - i)
                        i, body_left = i + step, body_left - step
                    elif len(data) - i < 6:
                        data, held = data[:i], data[i:]
                    else:
                        fetch = int.from_bytes(data[i + 4 : i + 6], "big", signed=True) == FETCH
                        relayed.fetches |= fetch
                        if self._refuses(fetch):
                            return
                        body_left = int.from_bytes(data[i : i + 4], "big") - 2
                        i += 6
                if data:
                    relayed.upstream.sendall(data)
        except OSError:
            pass
        finally:
            self._forget(relayed)

    def _responses(self, relayed: _Relayed) -> None:
        try:
            while data := relayed.upstream.recv(CHUNK):
                relayed.downstream.sendall(data)
        except OSError:
            pass
        finally:
            self._forget(relayed)

    def _forget(self, relayed: _Relayed) -> None:
        with self._lock:
            self._open.discard(relayed)
        relayed.reset()


def _shut(s: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the other side
        s.shutdown(socket.SHUT_RDWR)
    s.close()


class LinkedKafkaCluster(KafkaCluster):
    """A KafkaCluster whose nodes replicate through NodeLinks: each node also listens on a
    REPLICATION listener (the inter-broker one), advertised at its relay's address. Clients
    (PLAINTEXT) and the controllers (CONTROLLER) connect directly, as in KafkaCluster."""

    def __init__(self, directory: str | Path, nodes: int = 3, **options: Any) -> None:
        if options.get("sasl_mechanisms"):
            raise ValueError("a LinkedKafkaCluster has no SASL listener")
        super().__init__(directory, nodes, **options)
        taken = {p for n in self.nodes.values() for p in (n.broker_port, n.controller_port)}
        while True:  # the relays' ports and the nodes' own, none already the cluster's
            ports = free_ports(2 * nodes)
            if not taken & set(ports):
                break
        self.links = {
            node_id: NodeLink(ports[2 * i], ports[2 * i + 1])
            for i, node_id in enumerate(self.nodes)
        }

    def _server_properties(self, node: KafkaNode) -> str:
        properties = dict(
            line.split("=", 1) for line in super()._server_properties(node).splitlines() if line
        )
        link = self.links[node.node_id]
        listener = REPLICATION_LISTENER
        properties.update(
            {
                "listeners": f"PLAINTEXT://{node.address},"
                f"{listener}://{HOST}:{link.upstream_port},"
                f"CONTROLLER://{HOST}:{node.controller_port}",
                "advertised.listeners": f"PLAINTEXT://{node.address},"
                f"{listener}://{HOST}:{link.port}",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
                f"{listener}:PLAINTEXT",
                "inter.broker.listener.name": listener,
            }
        )
        return "".join(f"{k}={v}\n" for k, v in properties.items())

    def start(self) -> LinkedKafkaCluster:
        for link in self.links.values():
            link.start()
        super().start()
        return self

    def stop(self) -> None:
        super().stop()
        for link in self.links.values():
            link.close()

    def isolate(self, node_id: int, fetches_only: bool = False) -> None:
        """Cut the other nodes off from `node_id`'s inter-broker listener: they can neither
        fetch from it nor send it requests (transaction markers, say); with `fetches_only`
        they cannot fetch from it, so its followers lag, but their other requests pass. It
        still reaches them, and its clients and the controllers still reach it."""
        self.node(node_id)
        self.links[node_id].cut(fetches_only)

    def reconnect(self, node_id: int) -> None:
        self.links[node_id].heal()
