"""Node-to-node links of a loopback Apache Kafka cluster that can be cut: each node's
inter-broker listener (replica fetches, transaction markers) is reached by the other nodes
through a relay, so that a node can be cut off from the other nodes while its clients and the
controller quorum (its own listeners) still reach it, as a network partition between brokers
would. With 3 combined broker+controller nodes this is the only way to leave a leader alone
in its ISR: pausing both its followers would also stop two of the three controllers, and no
ISR change can be committed without a controller quorum.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from onceflow.apache_kafka.cluster import HOST, KafkaCluster, KafkaNode, free_ports

REPLICATION_LISTENER = "REPLICATION"
CHUNK = 64 << 10


class NodeLink:
    """A TCP relay in front of one node's inter-broker listener. `cut()` resets every
    connection through it and refuses new ones (accepted, then closed at once) until
    `heal()`."""

    def __init__(self, port: int, upstream_port: int) -> None:
        self.port, self.upstream_port = port, upstream_port
        self.cut_off = False
        self.connections = 0  # relayed since start, for tests and post-mortems
        self.refused = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
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
        self._reset_all()

    def cut(self) -> None:
        with self._lock:
            self.cut_off = True
        self._reset_all()

    def heal(self) -> None:
        with self._lock:
            self.cut_off = False

    def _reset_all(self) -> None:
        with self._lock:
            sockets, self._open = list(self._open), set()
        for s in sockets:
            _shut(s)

    def _accept(self) -> None:
        listener = self._listener
        while listener is not None and not self._stop.is_set():
            try:
                downstream, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                refused = self.cut_off
                self.refused += refused
            if refused:
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
            with self._lock:
                if self.cut_off:  # cut while connecting
                    _shut(downstream)
                    _shut(upstream)
                    continue
                self._open |= {downstream, upstream}
                self.connections += 1
            for a, b in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(CHUNK):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open -= {source, sink}
            _shut(source)
            _shut(sink)


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

    def isolate(self, node_id: int) -> None:
        """Cut `node_id` off from the other nodes: none can fetch from it or send it
        transaction markers (it still reaches them, its clients and the controllers)."""
        self.node(node_id)
        self.links[node_id].cut()

    def reconnect(self, node_id: int) -> None:
        self.links[node_id].heal()

    def link_counts(self) -> Mapping[int, tuple[int, int]]:
        """node -> (connections relayed, connections refused while cut)."""
        return {i: (link.connections, link.refused) for i, link in self.links.items()}
