"""One Apache Kafka node: it starts, serves a producer and a read_committed consumer, and
leaves no JVM behind, whether stopped or orphaned by a SIGKILLed parent."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

from confluent_kafka.admin import AdminClient, ConfigResource

from onceflow.apache_kafka import Distribution, KafkaCluster
from tests.apache_kafka.exactly_once import (
    read_committed,
    transactional_producer,
    write_transaction,
)
from tests.confluent import QUIET, produce
from tests.waiting import wait_for


def gone(pid: int) -> bool:
    """The process has exited (absent, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_one_node_serves_producers_and_read_committed_and_stops(
    apache_kafka: Distribution, tmp_path: Path
) -> None:
    cluster = KafkaCluster(tmp_path, 1, distribution=apache_kafka)
    with cluster:
        bootstrap = cluster.bootstrap_servers
        cluster.create_topic("plain", 2)
        values = [b"v%d" % i for i in range(200)]
        assert len(produce(bootstrap, "plain", values, **QUIET)) == 200
        assert read_committed(bootstrap, "plain", 2) == dict.fromkeys(values, 1)

        # A single node scales the exactly-once settings down to itself.
        admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
        broker = ConfigResource(ConfigResource.Type.BROKER, "1")
        configs = admin.describe_configs([broker])[broker].result(timeout=30)
        assert configs["min.insync.replicas"].value == "1"
        assert configs["unclean.leader.election.enable"].value == "false"

        cluster.create_topic("txn", 1)
        producer = transactional_producer(bootstrap, "one-node")
        assert write_transaction(producer, "txn", [b"kept"])
        assert write_transaction(producer, "txn", [b"dropped"], commit=False) is False
        producer.flush(10)
        assert read_committed(bootstrap, "txn", 1) == {b"kept": 1}
        assert cluster.transaction_coordinator("one-node") == 1
        pid = cluster.pids()[1]
    assert gone(pid), "the JVM outlived stop()"


def test_a_sigkilled_parent_leaves_no_jvm(apache_kafka: Distribution, tmp_path: Path) -> None:
    """`python -m onceflow.apache_kafka run`, SIGKILLed: atexit cannot run, and the node's JVM
    still dies with it (PR_SET_PDEATHSIG)."""
    env = {**os.environ, "ONCEFLOW_APACHE_KAFKA": str(apache_kafka.libs)}
    parent = subprocess.Popen(
        [sys.executable, "-m", "onceflow.apache_kafka", "run", str(tmp_path), "--nodes", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line.startswith("bootstrap.servers="), line
        pids = [int(p) for p in parent.stdout.readline().removeprefix("pids=").split(",")]
        assert pids and not any(gone(p) for p in pids)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    wait_for(lambda: all(gone(p) for p in pids), 30, f"the JVMs {pids} to die with their parent")


def _closed_by_peer(sock: socket.socket) -> bool:
    """The node closed this connection: readable, and at its end."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


def test_the_clusters_client_is_remade_after_the_node_closes_its_idle_connection(
    apache_kafka: Distribution, tmp_path: Path
) -> None:
    """A node closes a connection idle for `connections.max.idle.ms` (10 minutes; 3 s here); a
    session's cluster serves tests for longer, and its cached client then failed in `leader`
    ("closed the connection during Metadata", a CI run). It is remade."""
    cluster = KafkaCluster(
        tmp_path, 1, distribution=apache_kafka, settings={"connections.max.idle.ms": "3000"}
    )
    with cluster:
        cluster.create_topic("idle", 1)
        assert cluster.leader("idle") == 1
        client = cluster.client()
        connections = [*client._connections.values(), client._bootstrap_connection]
        sockets = [c._socket for c in connections if c is not None and c._socket is not None]
        assert sockets, "the cached client holds no connection"
        wait_for(lambda: all(_closed_by_peer(s) for s in sockets), 60, "the node to close them")
        assert cluster.leader("idle") == 1
