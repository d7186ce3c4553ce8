"""One Apache Kafka node: it starts, serves a producer and a read_committed consumer, and
leaves no JVM behind, whether stopped or orphaned by a SIGKILLed parent."""

from __future__ import annotations

import os
import signal
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
