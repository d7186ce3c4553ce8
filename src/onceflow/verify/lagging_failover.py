"""The lagging-failover fault (verify --apache-kafka): the failure by which Kafka loses writes
it acknowledged, when its settings let it (Jepsen's Kafka analysis, 2013), for one workload
partition:

1. strand: cut the followers' fetches from the partition's leader (its inbound node-to-node
   links, apache_kafka/links.py; the other inter-broker requests, transaction markers, still
   pass, so the workload writes on: a follower that is behind by nothing stays in the ISR),
   and wait until the leader has dropped them from the ISR: it is alone in its ISR. Clients
   and the controllers still reach it. With min.insync.replicas=1 it now acknowledges acks=all
   writes alone; with min.insync.replicas=2 it refuses them (NOT_ENOUGH_REPLICAS).
2. the nemesis holds it so for a moment while the workload writes, and longer (up to
   ack_timeout_s) until the lone leader has acknowledged a write, if it does;
3. fail over: SIGKILL the leader, heal its links, wait for another leader (or a deadline) and
   restart the old leader on its data. With unclean.leader.election.enable=true the controller
   elects a stale follower: what the old leader acknowledged alone is gone, and the old leader
   truncates its log to the new leader's when it comes back. With the safe settings the
   partition stays offline until the old leader returns (or a follower that Kafka knows holds
   every acknowledged record, KIP-966's eligible leader replicas, is elected): nothing is lost.

Pausing the followers instead would not do: with 3 combined broker+controller nodes, two
paused nodes are two of the three controllers, and the ISR shrink needs the quorum.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from onceflow.apache_kafka import KafkaClusterError
from onceflow.protocol.client import KafkaClientError
from onceflow.verify.faults import FaultError

POLL_S = 0.2


class FailoverCluster(Protocol):
    """What the fault needs of the cluster (kafka_nodes.ManagedKafka)."""

    def leader(self, topic: str, partition: int) -> int: ...
    def isr(self, topic: str, partition: int) -> list[int]: ...
    def high_watermark(self, topic: str, partition: int) -> int: ...  # -1: unknown now
    def isolate(self, node: int) -> None: ...
    def reconnect(self, node: int) -> None: ...
    def kill(self, node: int) -> Any: ...
    def restart(self, node: int) -> Any: ...  # FaultError if it does not come back


@dataclass
class LaggingFailover:
    """One lagging failover of `topic`-`partition`: strand() injects, fail_over() heals."""

    cluster: FailoverCluster
    topic: str
    partition: int
    isr_timeout_s: float  # for the leader to drop its followers (replica.lag.time.max.ms)
    leader_timeout_s: float  # for a new leader once the old one is killed
    ack_timeout_s: float = 10.0  # for the lone leader to acknowledge a write (if it does)
    clock: Callable[[], float] = time.monotonic
    # The run is ending (the nemesis stops): no more waiting to strand or for acknowledgements.
    interrupted: Callable[[], bool] = lambda: False
    sleep: Callable[[float], None] = time.sleep
    leader: int = -1
    steps: list[str] = field(default_factory=list)  # what was done, in order (for the tests)
    outcome: dict[str, Any] = field(default_factory=dict)  # what strand and fail_over found
    _alone_hw: int = -1

    @property
    def of(self) -> str:
        return f"{self.topic}-{self.partition}"

    def strand(self) -> dict[str, Any]:
        """Cut the leader off from its followers and wait until it is alone in the ISR (the
        links healed again, and FaultError, if it is not within isr_timeout_s)."""
        leader = self._ask(lambda: self.cluster.leader(self.topic, self.partition))
        if leader is None or leader < 0:
            raise FaultError(f"{self.of} has no leader to strand")
        self.leader = leader
        self.cluster.isolate(leader)
        self.steps.append(f"isolate {leader}")
        started = self.clock()
        alone = self._until(
            lambda: self.cluster.isr(self.topic, self.partition) == [leader],
            self.isr_timeout_s,
            self.interrupted,
        )
        if not alone:
            self.cluster.reconnect(leader)
            self.steps.append(f"reconnect {leader}")
            raise FaultError(
                f"the ISR of {self.of} did not shrink to its leader {leader} alone "
                f"within {self.isr_timeout_s:g} s"
                + (" (the run ended)" if self.interrupted() else "")
            )
        self.steps.append("alone")
        self._alone_hw = self._watermark()
        self.outcome = {
            "leader": leader,
            "alone_after_s": round(self.clock() - started, 3),
            "high_watermark_alone": self._alone_hw,
        }
        return dict(self.outcome)

    def fail_over(self) -> dict[str, Any]:
        """Once the lone leader acknowledged a write (or ack_timeout_s passed), SIGKILL it,
        heal its links, wait for another leader (-1 if none came within leader_timeout_s),
        then restart the old leader."""
        leader = self.leader
        if self._alone_hw >= 0:  # safe settings: it acknowledges nothing, this times out
            self._until(
                lambda: self._watermark() > self._alone_hw, self.ack_timeout_s, self.interrupted
            )
        acknowledged = self._watermark()  # what the leader acknowledged, alone at the end
        self.cluster.kill(leader)
        self.cluster.reconnect(leader)
        self.steps += [f"kill {leader}", f"reconnect {leader}"]
        started = self.clock()
        elected: list[int] = []

        def new_leader() -> bool:
            node = self.cluster.leader(self.topic, self.partition)
            if node >= 0 and node != leader:
                elected.append(node)
                return True
            return False

        self._until(new_leader, self.leader_timeout_s)
        details: dict[str, Any] = {
            "high_watermark_at_kill": acknowledged,
            "acknowledged_alone": max(0, acknowledged - self._alone_hw)
            if min(acknowledged, self._alone_hw) >= 0
            else None,
            "new_leader": elected[-1] if elected else -1,
        }
        if elected:
            details["new_leader_after_s"] = round(self.clock() - started, 3)
            details["high_watermark_new_leader"] = new_hw = self._watermark()
            if min(acknowledged, new_hw) >= 0:  # records the new leader lacks, at least
                details["new_leader_behind"] = max(0, acknowledged - new_hw)
        self.steps.append(f"elected {details['new_leader']}")
        self.outcome.update(details)
        self.cluster.restart(leader)
        self.steps.append(f"restart {leader}")
        return details

    def _watermark(self) -> int:
        found = self._ask(lambda: self.cluster.high_watermark(self.topic, self.partition))
        return -1 if found is None else found

    def _until(
        self,
        probe: Callable[[], bool],
        timeout_s: float,
        interrupted: Callable[[], bool] = lambda: False,
    ) -> bool:
        deadline = self.clock() + timeout_s
        while True:
            if self._ask(probe):
                return True
            if self.clock() >= deadline or interrupted():
                return False
            self.sleep(POLL_S)

    @staticmethod
    def _ask(question: Callable[[], Any]) -> Any:
        """The cluster's answer, or None while it cannot give one (a node just cut or
        killed, a leader being elected)."""
        try:
            return question()
        except (KafkaClusterError, KafkaClientError, OSError):
            return None
