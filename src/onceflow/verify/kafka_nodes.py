"""`onceflow verify --apache-kafka`: the Apache Kafka cluster a verify run starts on loopback
and faults node by node, and which node a fault strikes.

A node fault picks its victim by what the node does for the workload, at random: the leader of
one of the workload's partitions, the transaction coordinator of one of its transactional ids,
the coordinator of the copiers' group, or any node. The role and the key are drawn before the
cluster is asked (a seed replays the same schedule); a look-up that fails falls back to a
random node, and says so in the history.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from signal import SIGKILL
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition

from onceflow.apache_kafka import Distribution, KafkaCluster, KafkaClusterError, locate
from onceflow.apache_kafka.cluster import HOST
from onceflow.apache_kafka.links import LinkedKafkaCluster
from onceflow.protocol.client import KafkaClientError
from onceflow.verify.faults import FaultError
from onceflow.verify.lagging_failover import LaggingFailover

FETCHED = "fetched"  # --apache-kafka fetched: the pinned release, fetched with Maven once
PARTITION_LEADER = "partition leader"
TXN_COORDINATOR = "transaction coordinator"
GROUP_COORDINATOR = "group coordinator"
RANDOM_NODE = "random node"
NODE_ROLES = (PARTITION_LEADER, TXN_COORDINATOR, GROUP_COORDINATOR, RANDOM_NODE)
# Kafka's defaults, but quicker to abort the transactions of crashed or paused clients (10 s
# in Kafka), so that runs see fencing by the coordinator's timeout too; small segments roll.
VERIFY_SETTINGS = {
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "auto.create.topics.enable": "false",
    "log.segment.bytes": str(1 << 20),
}
LOOKUP_TIMEOUT_S = 10.0
# How long a node may take to start or come back: a 3-node run on the shared 2-core machine
# (load average 35) once saw a killed node take more than the cluster's default 120 s.
NODE_START_TIMEOUT_S = 300.0
# Kafka's defaults: how long a leader waits for a silent follower before it drops it from the
# ISR, and the controller for a silent broker before it fences it (and elects other leaders).
REPLICA_LAG_TIME_MAX_MS = 30_000
BROKER_SESSION_TIMEOUT_MS = 9_000


@dataclass(frozen=True)
class NodeChoice:
    node: int
    role: str  # one of NODE_ROLES
    of: str = ""  # the partition, transactional id or group it was chosen for
    note: str = ""  # why it fell back to a random node


class NodeLookup(Protocol):
    """Who does what in the cluster (KafkaCluster's look-ups)."""

    def leader(self, topic: str, partition: int = 0) -> int: ...
    def transaction_coordinator(self, transactional_id: str, timeout_s: float = ...) -> int: ...
    def group_coordinator(self, group_id: str, timeout_s: float = ...) -> int: ...


@dataclass(frozen=True)
class WorkloadKeys:
    """What the workload uses, by which a node is chosen."""

    partitions: Sequence[tuple[str, int]]
    transactional_ids: Sequence[str]
    group: str | None  # None: no copiers, so no group to coordinate
    # The partitions the producers write (lagging-failover strands one); none: any of them.
    written: Sequence[tuple[str, int]] = ()


def workload_roles(keys: WorkloadKeys) -> list[str]:
    """The roles a node can have for this workload (no group coordinator without copiers)."""
    roles = [RANDOM_NODE]
    if keys.partitions:
        roles.append(PARTITION_LEADER)
    if keys.transactional_ids:
        roles.append(TXN_COORDINATOR)
    if keys.group is not None:
        roles.append(GROUP_COORDINATOR)
    return sorted(roles, key=NODE_ROLES.index)


class RoleDeck:
    """Every role once per round, in a random order (as the nemesis deals fault kinds), so
    that a short run strikes each kind of node."""

    def __init__(self, keys: WorkloadKeys) -> None:
        self.roles = workload_roles(keys)
        self._deck: list[str] = []

    def draw(self, rng: random.Random) -> str:
        if not self._deck:
            self._deck = list(self.roles)
            rng.shuffle(self._deck)
        return self._deck.pop()


def choose_node(
    rng: random.Random, role: str, nodes: Sequence[int], keys: WorkloadKeys, lookup: NodeLookup
) -> NodeChoice:
    """The node to fault for `role`: its key drawn, then the cluster asked who holds it (a
    random node if it cannot say, or names no node of `nodes`)."""
    fallback = rng.choice(sorted(nodes))  # drawn always: the schedule does not depend on look-ups
    ask: Callable[[], int]
    if role == PARTITION_LEADER and keys.partitions:
        topic, partition = rng.choice(list(keys.partitions))
        of = f"{topic}-{partition}"
        ask = lambda: lookup.leader(topic, partition)  # noqa: E731
    elif role == TXN_COORDINATOR and keys.transactional_ids:
        of = rng.choice(list(keys.transactional_ids))
        ask = lambda: lookup.transaction_coordinator(of, LOOKUP_TIMEOUT_S)  # noqa: E731
    elif role == GROUP_COORDINATOR and keys.group is not None:
        of = keys.group
        ask = lambda: lookup.group_coordinator(of, LOOKUP_TIMEOUT_S)  # noqa: E731
    else:
        return NodeChoice(fallback, RANDOM_NODE)
    try:
        node = ask()
    except (KafkaClusterError, KafkaClientError, OSError) as e:
        return NodeChoice(fallback, RANDOM_NODE, of, f"no {role} of {of}: {e}")
    if node not in nodes:  # -1: no leader right now
        return NodeChoice(fallback, RANDOM_NODE, of, f"no {role} of {of} (node {node})")
    return NodeChoice(node, role, of)


def resolve_distribution(where: str) -> Distribution:
    """`fetched` (or empty): the pinned release from the cache, $ONCEFLOW_APACHE_KAFKA, or
    fetched now with Maven; otherwise a binary distribution's root or its libs/ folder."""
    return locate(None if where in ("", FETCHED) else where)


class ManagedKafka:
    """The cluster of a verify run, as the nemesis faults it (faults.NodeFaults)."""

    def __init__(
        self,
        directory: Path,
        nodes: int,
        distribution: Distribution,
        overrides: Mapping[str, str],
        links: bool = False,
    ) -> None:
        """`links`: the nodes replicate through relays that can be cut (lagging-failover)."""
        make = LinkedKafkaCluster if links else KafkaCluster
        self.cluster = make(
            directory,
            nodes,
            distribution=distribution,
            settings={**VERIFY_SETTINGS, **overrides},
            start_timeout_s=NODE_START_TIMEOUT_S,
        )
        self.serve(WorkloadKeys((), (), None))
        self.chosen: list[NodeChoice] = []
        self.failovers: list[LaggingFailover] = []

    def serve(self, keys: WorkloadKeys) -> None:
        """The workload whose partitions, transactional ids and group choose the nodes."""
        self.keys, self.deck = keys, RoleDeck(keys)

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap_servers

    @property
    def settings(self) -> dict[str, str]:
        return dict(self.cluster.settings)

    @property
    def version(self) -> str:
        return self.cluster.distribution.version

    def start(self) -> None:
        self.cluster.start()

    def stop(self) -> None:
        self.cluster.stop()

    def node_ids(self) -> list[int]:
        return sorted(self.cluster.nodes)

    # -- faults.NodeFaults --------------------------------------------------------------------

    def choose(self, rng: random.Random) -> NodeChoice:
        role = self.deck.draw(rng)
        choice = choose_node(rng, role, self.node_ids(), self.keys, self.cluster)
        self.chosen.append(choice)
        return choice

    def address(self, node: int) -> tuple[str, int]:
        found = self.cluster.node(node)
        return HOST, found.broker_port

    def kill(self, node: int) -> dict[str, Any]:
        self.cluster.kill(node)
        return {}

    def restart(self, node: int) -> dict[str, Any]:
        """Start the node on its data again and wait until every broker is registered."""
        try:
            self.cluster.restart(node)
        except KafkaClusterError as e:
            raise FaultError(f"node {node} does not come back: {e}") from e
        return {}

    def pause(self, node: int) -> dict[str, Any]:
        try:
            self.cluster.pause(node)
        except KafkaClusterError as e:
            raise FaultError(str(e)) from e
        return {}

    def resume(self, node: int) -> dict[str, Any]:
        self.cluster.resume(node)
        return {}

    def lagging_failover(self, rng: random.Random) -> LaggingFailover:
        """A lagging failover of one of the workload's partitions, drawn with rng: its
        deadlines from the cluster's replica.lag.time.max.ms and broker.session.timeout.ms."""
        if not self.keys.partitions or not isinstance(self.cluster, LinkedKafkaCluster):
            raise FaultError("lagging-failover needs the workload's partitions and cut links")
        topic, partition = rng.choice(list(self.keys.written or self.keys.partitions))
        lag_s = self._setting_ms("replica.lag.time.max.ms", REPLICA_LAG_TIME_MAX_MS) / 1000
        session_s = self._setting_ms("broker.session.timeout.ms", BROKER_SESSION_TIMEOUT_MS) / 1000
        failover = LaggingFailover(
            self,
            topic,
            partition,
            isr_timeout_s=2 * lag_s + 30,
            leader_timeout_s=session_s + 20,
        )
        self.failovers.append(failover)
        return failover

    def _setting_ms(self, name: str, default: int) -> int:
        return int(self.cluster.settings.get(name, default))

    # -- lagging_failover.FailoverCluster -----------------------------------------------------

    def leader(self, topic: str, partition: int) -> int:
        return self.cluster.leader(topic, partition)

    def isr(self, topic: str, partition: int) -> list[int]:
        return self.cluster.isr(topic, partition)

    def high_watermark(self, topic: str, partition: int) -> int:
        """The partition's high watermark as its leader tells it now (-1 if it cannot)."""
        # A group is required by the client; never joined (no subscribe, no commit).
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "onceflow-verify-watermarks",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        try:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=5, cached=False
            )
            return int(high)
        except KafkaException:
            return -1
        finally:
            consumer.close()

    def isolate(self, node: int) -> None:
        assert isinstance(self.cluster, LinkedKafkaCluster)
        # Only the fetches: transaction markers still reach it, so the workload writes on
        # (a leader nobody writes to keeps its idle followers in sync).
        self.cluster.isolate(node, fetches_only=True)

    def reconnect(self, node: int) -> None:
        assert isinstance(self.cluster, LinkedKafkaCluster)
        self.cluster.reconnect(node)

    # -- the end of a run ---------------------------------------------------------------------

    def failover_outcomes(self) -> list[dict[str, Any]]:
        """Each lagging failover: its partition, what its steps found (as in the nemesis's
        events in the history) and the steps done."""
        return [{"of": f.of, **f.outcome, "steps": f.steps} for f in self.failovers]

    def exited_on_their_own(self) -> dict[int, int]:
        """Nodes that exited other than by the nemesis's SIGKILL: node -> exit code."""
        return {
            i: n.process.returncode
            for i, n in self.cluster.nodes.items()
            if n.process is not None and n.process.poll() not in (None, -SIGKILL)
        }

    def ensure_running(self) -> None:
        """Every node up and registered (before the final reads)."""
        try:
            self.cluster.ensure_running()
        except KafkaClusterError as e:
            raise FaultError(f"the cluster does not come back: {e}") from e

    def roles_chosen(self) -> dict[str, int]:
        counts = dict.fromkeys(NODE_ROLES, 0)
        for choice in self.chosen:
            counts[choice.role] += 1
        return counts
