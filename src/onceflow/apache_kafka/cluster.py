"""An Apache Kafka cluster on loopback: N KRaft nodes (combined broker+controller), each its own
JVM, data directory and ports, with the settings a production cluster uses for exactly-once.
Nodes can be SIGKILLed, paused (SIGSTOP/SIGCONT) and restarted; the cluster tells which node
leads a partition and which coordinates a transactional id or a group."""

from __future__ import annotations

import atexit
import base64
import signal
import socket
import subprocess
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from onceflow.apache_kafka.distribution import (
    Distribution,
    die_with_parent,
    locate,
    require_java,
)
from onceflow.protocol.client import (
    GROUP_KEY,
    TRANSACTION_KEY,
    KafkaClient,
    KafkaClientError,
)

HOST = "127.0.0.1"
BROKER_MAIN = "kafka.Kafka"
STORAGE_TOOL_MAIN = "kafka.tools.StorageTool"
# Three JVMs plus a Spark JVM fit the 2-core, 24 GiB machine shared by several test runs:
# serial GC (no parallel GC threads fighting over 2 cores), heaps well under Kafka's default 1 GiB.
DEFAULT_HEAP = "512m"
JVM_OPTIONS = (
    "-Xms128m",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)
# C1 only: starting a node and creating a topic took 0.70x the CPU and 0.57x the wall time of
# the default (C2) on this loaded 2-core machine, medians of 4 interleaved runs (14.3 s against
# 29.2 s); benchmarks that want peak throughput pass jvm_options=() for C2.
QUICK_START_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1",)
START_TIMEOUT_S = 120.0
POLL_S = 0.2
T = TypeVar("T")
# The listener a cluster made with sasl_mechanisms adds beside PLAINTEXT (which stays the
# inter-broker and controller listener, so the helper's own look-ups need no credentials).
SASL_LISTENER = "SASL_PLAINTEXT"
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule required;"

LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
"""


def exactly_once_settings(nodes: int) -> dict[str, str]:
    """What a production cluster sets for exactly-once (replication 3, two in sync to
    acknowledge, no unclean election), scaled down to the node count below 3."""
    replicas = str(min(3, nodes))
    min_isr = str(min(2, nodes))
    return {
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "unclean.leader.election.enable": "false",
    }


# Not safety settings: fewer internal partitions (Kafka: 50 each) make a node's start and
# recovery after a kill seconds shorter; no wait before the first rebalance of a group. The
# controller quorum's timeouts are 3x Kafka's: on the 2-core machine, with Spark beside it, a
# JVM stalled past the 2 s fetch timeout, and with one of three voters killed the other two
# went from election to election for two minutes, committing no metadata (no new leader for
# the dead node's partitions; CI, Kafka 4.4).
TEST_SETTINGS = {
    "offsets.topic.num.partitions": "6",
    "transaction.state.log.num.partitions": "6",
    "controller.quorum.fetch.timeout.ms": "6000",
    "controller.quorum.election.timeout.ms": "3000",
    "group.initial.rebalance.delay.ms": "0",
}


def free_ports(count: int) -> list[int]:
    """Ports free on loopback now (held open together, so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((HOST, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def random_cluster_id() -> str:
    """A Kafka Uuid as StorageTool's random-uuid prints it: 16 bytes, URL-safe base64, never
    starting with '-' (it would read as an option on a command line, as Kafka's Uuid avoids)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


@dataclass
class KafkaNode:
    """One combined broker+controller node."""

    node_id: int
    broker_port: int
    controller_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    sasl_port: int | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.broker_port}"

    @property
    def sasl_address(self) -> str:
        if self.sasl_port is None:
            raise KafkaClusterError(f"node {self.node_id} has no {SASL_LISTENER} listener")
        return f"{HOST}:{self.sasl_port}"

    @property
    def config_file(self) -> Path:
        return self.directory / "server.properties"

    @property
    def log_file(self) -> Path:
        return self.directory / "logs" / "server.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        texts = []
        for path in (self.directory / "stdout.log", self.log_file):
            if path.exists():
                texts.append("\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(texts)


class KafkaClusterError(RuntimeError):
    """A node did not start, or the cluster did not reach a state within its deadline."""


_live: weakref.WeakSet[KafkaCluster] = weakref.WeakSet()


@atexit.register
def _kill_all() -> None:
    for cluster in list(_live):
        cluster.stop()


class KafkaCluster:
    """N nodes on loopback in `directory`; `start()` formats KRaft storage (once) and waits
    until every broker is registered."""

    def __init__(
        self,
        directory: str | Path,
        nodes: int = 3,
        *,
        distribution: Distribution | None = None,
        heap: str = DEFAULT_HEAP,
        settings: Mapping[str, str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        jvm_options: Sequence[str] = QUICK_START_JVM_OPTIONS,
        sasl_mechanisms: Sequence[str] = (),
    ) -> None:
        """`sasl_mechanisms` (SCRAM-SHA-256, SCRAM-SHA-512): each node also listens on
        SASL_PLAINTEXT with them (`sasl_bootstrap_servers`), its users made at runtime
        (AlterUserScramCredentials); an authorizer and super.users are `settings`."""
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.directory = Path(directory)
        self.distribution = distribution or locate()
        self.java = require_java()
        self.heap = heap
        self.jvm_options = tuple(jvm_options)
        self.start_timeout_s = start_timeout_s
        self.settings = {**exactly_once_settings(nodes), **TEST_SETTINGS, **(settings or {})}
        self.cluster_id = random_cluster_id()
        ports = free_ports(2 * nodes)
        self.nodes = {
            i: KafkaNode(i, ports[2 * (i - 1)], ports[2 * i - 1], self.directory / f"node-{i}")
            for i in range(1, nodes + 1)
        }
        self.sasl_mechanisms = tuple(m.upper() for m in sasl_mechanisms)
        unknown = set(self.sasl_mechanisms) - {"SCRAM-SHA-256", "SCRAM-SHA-512"}
        if unknown:
            raise ValueError(f"SASL mechanisms {sorted(unknown)}: only SCRAM is set up")
        if self.sasl_mechanisms:
            for node, port in zip(self.nodes.values(), free_ports(nodes), strict=True):
                node.sasl_port = port
        self._formatted = False
        self._client: KafkaClient | None = None
        self._lock = threading.Lock()

    # -- addresses ----------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.address for n in self.nodes.values())

    @property
    def sasl_bootstrap_servers(self) -> str:
        """The SASL_PLAINTEXT listeners (a cluster made with sasl_mechanisms)."""
        return ",".join(n.sasl_address for n in self.nodes.values())

    def node(self, node_id: int) -> KafkaNode:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise ValueError(f"no node {node_id} (nodes: {sorted(self.nodes)})") from None

    # -- start and stop -----------------------------------------------------------------------

    def _server_properties(self, node: KafkaNode) -> str:
        voters = ",".join(f"{n.node_id}@{HOST}:{n.controller_port}" for n in self.nodes.values())
        base = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{node.address},CONTROLLER://{HOST}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{node.address}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.directory / "data"),
        }
        if self.sasl_mechanisms:
            base.update(self._sasl_properties(node))
        return "".join(f"{k}={v}\n" for k, v in {**base, **self.settings}.items())

    def _sasl_properties(self, node: KafkaNode) -> dict[str, str]:
        listener = SASL_LISTENER.lower()
        properties = {
            "listeners": f"PLAINTEXT://{node.address},{SASL_LISTENER}://{node.sasl_address},"
            f"CONTROLLER://{HOST}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{node.address},"
            f"{SASL_LISTENER}://{node.sasl_address}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
            f"{SASL_LISTENER}:{SASL_LISTENER}",
            "sasl.enabled.mechanisms": ",".join(self.sasl_mechanisms),
        }
        # SCRAM needs its login module declared per listener; users are added at runtime.
        for mechanism in self.sasl_mechanisms:
            properties[f"listener.name.{listener}.{mechanism.lower()}.sasl.jaas.config"] = (
                SCRAM_LOGIN
            )
        return properties

    def _java(
        self, main: str, *args: str, heap: str, node: KafkaNode, options: Sequence[str]
    ) -> list[str]:
        return [
            self.java,
            f"-Xmx{heap}",
            *JVM_OPTIONS,
            *options,
            f"-Dlog4j2.configurationFile={node.directory / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={node.directory / 'logs'}",
            "-cp",
            self.distribution.classpath,
            main,
            *args,
        ]

    def _format(self) -> None:
        """Format every node's storage for a static quorum of all the nodes (in parallel:
        each format is a JVM start)."""
        formats = []
        for node in self.nodes.values():
            (node.directory / "logs").mkdir(parents=True, exist_ok=True)
            node.config_file.write_text(self._server_properties(node))
            (node.directory / "log4j2.properties").write_text(LOG4J2)
            command = self._java(
                STORAGE_TOOL_MAIN,
                "format",
                "--cluster-id",
                self.cluster_id,
                "--config",
                str(node.config_file),
                "--ignore-formatted",
                heap="256m",
                node=node,
                options=QUICK_START_JVM_OPTIONS,
            )
            formats.append((node, subprocess.Popen(command, **self._output(node, "format.log"))))
        for node, process in formats:
            if process.wait(timeout=self.start_timeout_s) != 0:
                raise KafkaClusterError(
                    f"formatting node {node.node_id} failed:\n"
                    + (node.directory / "format.log").read_text(errors="replace")
                )
        self._formatted = True

    @staticmethod
    def _output(node: KafkaNode, name: str) -> dict[str, Any]:
        out = open(node.directory / name, "ab")  # noqa: SIM115 - the child holds it
        return {"stdout": out, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}

    def _launch(self, node: KafkaNode) -> None:
        command = self._java(
            BROKER_MAIN, str(node.config_file), heap=self.heap, node=node, options=self.jvm_options
        )
        options = self._output(node, "stdout.log")
        if threading.current_thread() is threading.main_thread():
            options["preexec_fn"] = die_with_parent
        node.process = subprocess.Popen(command, **options)
        options["stdout"].close()
        node.paused = False

    def start(self) -> KafkaCluster:
        """Format (first time), start every node and wait until every broker is registered."""
        if not self._formatted:
            self._format()
        _live.add(self)
        for node in self.nodes.values():
            if not node.running:
                self._launch(node)
        self.wait_ready()
        return self

    def stop(self) -> None:
        """SIGKILL every node (tests need no controlled shutdown; the data stays)."""
        for node in self.nodes.values():
            self.kill(node.node_id)
        self._close_client()

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults -------------------------------------------------------------------------------

    def kill(self, node_id: int) -> None:
        """SIGKILL one node and reap it (a paused node dies too)."""
        node = self.node(node_id)
        if node.process is not None and node.process.poll() is None:
            node.process.kill()
            node.process.wait()
        node.paused = False
        self._close_client()

    def pause(self, node_id: int) -> None:
        """SIGSTOP one node: its sockets stay open but it answers nothing."""
        node = self.node(node_id)
        if not node.running:
            raise KafkaClusterError(f"node {node_id} is not running")
        assert node.process is not None
        node.process.send_signal(signal.SIGSTOP)
        node.paused = True
        self._close_client()

    def resume(self, node_id: int) -> None:
        """SIGCONT a paused node."""
        node = self.node(node_id)
        if node.running and node.paused:
            assert node.process is not None
            node.process.send_signal(signal.SIGCONT)
        node.paused = False

    def restart(self, node_id: int, *, wait: bool = True) -> None:
        """Start a killed (or SIGKILL then start a running) node on its data and ports, and
        wait until it is registered again."""
        self.kill(node_id)
        self._launch(self.node(node_id))
        if wait:
            self.wait_ready()

    def ensure_running(self) -> None:
        """Every node up and answering again (after a test that left one killed or paused)."""
        for node in self.nodes.values():
            if node.paused:
                self.resume(node.node_id)
            if not node.running:
                self._launch(node)
        self.wait_ready()

    # -- waiting ------------------------------------------------------------------------------

    def wait_for(
        self, what: str, probe: Callable[[], T | None], timeout_s: float | None = None
    ) -> T:
        """probe() until it returns something other than None (client errors count as not
        yet), or KafkaClusterError naming `what` at the deadline; a node that died says so."""
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        last_error: Exception | None = None
        while True:
            for node in self.nodes.values():
                exited = node.process is not None and node.process.poll() is not None
                if exited and node.process.returncode != -signal.SIGKILL:
                    raise KafkaClusterError(
                        f"node {node.node_id} exited with {node.process.returncode} "
                        f"while waiting for {what}:\n{node.log_tail()}"
                    )
            try:
                result = probe()
                if result is not None:
                    return result
            except (KafkaClientError, OSError) as e:
                last_error = e
                self._close_client()
            if time.monotonic() >= deadline:
                raise KafkaClusterError(
                    f"timed out waiting for {what}"
                    + (f" (last error: {last_error})" if last_error else "")
                )
            time.sleep(POLL_S)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Every running, unpaused node answers Metadata listing every such node as a broker
        (in KRaft a broker is listed once registered and unfenced)."""
        up = [n for n in self.nodes.values() if n.running and not n.paused]
        expected = {n.node_id for n in up}

        def every_node_sees_all() -> bool | None:
            for node in up:
                with KafkaClient(
                    [(HOST, node.broker_port)], connect_timeout_s=2, request_timeout_s=5
                ) as client:
                    if not expected <= set(client.brokers):
                        return None
            return True

        self.wait_for(
            f"brokers {sorted(expected)} to be registered", every_node_sees_all, timeout_s
        )

    # -- who does what ------------------------------------------------------------------------

    def client(self) -> KafkaClient:
        """A protocol client bootstrapped on the nodes that are up (remade after a fault)."""
        with self._lock:
            if self._client is None:
                up = [
                    (HOST, n.broker_port) for n in self.nodes.values() if n.running and not n.paused
                ]
                self._client = KafkaClient(
                    up or [(HOST, n.broker_port) for n in self.nodes.values()],
                    connect_timeout_s=2,
                    request_timeout_s=5,
                ).connect()
            return self._client

    def _close_client(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def metadata(self, topics: list[str] | None) -> Any:
        """Metadata from the cached client, or from a new one when its connection is gone: a
        node closes a connection idle for `connections.max.idle.ms` (10 minutes), and a
        cluster may serve a session's tests far longer (a CI run failed so, in `leader`)."""
        try:
            return self.client().metadata(topics)
        except (KafkaClientError, OSError):
            self._close_client()
            return self.client().metadata(topics)

    def _find_partition(self, topic: str, partition: int) -> Any | None:
        response = self.metadata([topic])
        for t in response.topics:
            if t.name == topic:
                for p in t.partitions:
                    if p.partition_index == partition:
                        return p
        return None

    def _partition(self, topic: str, partition: int) -> Any:
        found = self._find_partition(topic, partition)
        if found is None:
            raise KafkaClusterError(f"{topic}-{partition} does not exist")
        return found

    def leader(self, topic: str, partition: int = 0) -> int:
        """Node id of the partition's leader (-1 while it has none)."""
        return int(self._partition(topic, partition).leader_id)

    def isr(self, topic: str, partition: int = 0) -> list[int]:
        return sorted(int(n) for n in self._partition(topic, partition).isr_nodes)

    def replicas(self, topic: str, partition: int = 0) -> list[int]:
        return [int(n) for n in self._partition(topic, partition).replica_nodes]

    def transaction_coordinator(self, transactional_id: str, timeout_s: float = 60.0) -> int:
        """Node id of the transaction coordinator of `transactional_id` (FindCoordinator),
        waiting while there is none (__transaction_state being made, or a leader elected)."""
        return self._coordinator(transactional_id, TRANSACTION_KEY, timeout_s)

    def group_coordinator(self, group_id: str, timeout_s: float = 60.0) -> int:
        """Node id of the group coordinator of `group_id` (FindCoordinator)."""
        return self._coordinator(group_id, GROUP_KEY, timeout_s)

    def _coordinator(self, key: str, key_type: int, timeout_s: float) -> int:
        kind = "transactional id" if key_type == TRANSACTION_KEY else "group"
        return self.wait_for(
            f"the coordinator of {kind} {key!r}",
            lambda: self.client().find_coordinator(key, key_type, refresh=True).node_id,
            timeout_s,
        )

    def wait_for_leader(
        self,
        topic: str,
        partition: int = 0,
        *,
        not_on: Iterable[int] = (),
        timeout_s: float | None = None,
    ) -> int:
        """Wait until the partition has a leader (other than the nodes `not_on`); its id."""
        excluded = set(not_on)

        def elected() -> int | None:
            # A broker learns of a new topic a moment after the controller: unknown is "not yet".
            found = self._find_partition(topic, partition)
            leader = -1 if found is None else int(found.leader_id)
            return leader if leader >= 0 and leader not in excluded else None

        return self.wait_for(f"a leader of {topic}-{partition}", elected, timeout_s)

    def wait_for_isr(
        self, topic: str, partition: int = 0, size: int | None = None, timeout_s: float = 60.0
    ) -> list[int]:
        """Wait until the partition has `size` replicas in sync (all of them by default)."""

        def in_sync() -> list[int] | None:
            found = self._find_partition(topic, partition)
            if found is None:
                return None
            isr = sorted(int(n) for n in found.isr_nodes)
            wanted = len(found.replica_nodes) if size is None else size
            return isr if len(isr) >= wanted else None

        return self.wait_for(f"the ISR of {topic}-{partition}", in_sync, timeout_s)

    def wait_for_known_everywhere(
        self, topic: str, partitions: int, timeout_s: float | None = None
    ) -> None:
        """Wait until every running node's metadata has the topic with `partitions` partitions,
        each with a leader: CreateTopics answers once the controller has it, and each broker
        learns of it a moment later (a tool's next request may reach any of them)."""
        up = [n for n in self.nodes.values() if n.running and not n.paused]

        def known() -> bool | None:
            for node in up:
                with KafkaClient(
                    [(HOST, node.broker_port)], connect_timeout_s=2, request_timeout_s=5
                ) as client:
                    found = [t for t in client.metadata([topic]).topics if t.name == topic]
                    led = [p for t in found for p in t.partitions if int(p.leader_id) >= 0]
                    if len(led) != partitions:
                        return None
            return True

        self.wait_for(f"{topic} on every node", known, timeout_s)

    def wait_fully_replicated(self, timeout_s: float | None = None) -> None:
        """Wait until every partition of every topic has all its replicas in sync again (what
        an operator waits for between two restarts of a rolling restart)."""

        def in_sync() -> bool | None:
            for topic in self.metadata(None).topics:
                for p in topic.partitions:
                    if len(p.isr_nodes) < len(p.replica_nodes) or int(p.leader_id) < 0:
                        return None
            return True

        self.wait_for("every partition fully replicated", in_sync, timeout_s)

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: Mapping[str, str] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        """Create a topic (the cluster's default replication unless given) and wait until
        every partition has a leader with every replica in sync."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        new = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=replication_factor or -1,
            config=dict(config or {}),
        )
        admin.create_topics([new], operation_timeout=timeout_s)[name].result(timeout=timeout_s)
        for p in range(partitions):
            self.wait_for_leader(name, p, timeout_s=timeout_s)
            self.wait_for_isr(name, p, timeout_s=timeout_s)

    def pids(self) -> dict[int, int]:
        return {i: n.process.pid for i, n in self.nodes.items() if n.process is not None}
