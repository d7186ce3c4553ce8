"""Which node a fault strikes on a managed Apache Kafka cluster (verify --apache-kafka): the
leader of a workload partition, the coordinator of a transactional id or of the group, or any
node; every role once per round; a failed look-up falls back to a random node and says so; and
the nemesis's kill, pause and partition plans on such a cluster."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from onceflow.apache_kafka import KafkaClusterError
from onceflow.verify.faults import KILL, PARTITION, PAUSE, Nemesis, Targets
from onceflow.verify.history import INVOKE, NEMESIS, OK, History
from onceflow.verify.kafka_nodes import (
    GROUP_COORDINATOR,
    NODE_ROLES,
    PARTITION_LEADER,
    RANDOM_NODE,
    TXN_COORDINATOR,
    NodeChoice,
    RoleDeck,
    WorkloadKeys,
    choose_node,
    workload_roles,
)

KEYS = WorkloadKeys([("a", 0), ("a", 1), ("b", 0)], ["producer0", "copier0"], "copiers")
NODES = [1, 2, 3]


class FakeCluster:
    """Leaders and coordinators as a table; a look-up of anything else fails as the cluster's
    helper does at its deadline."""

    def __init__(self) -> None:
        self.leaders = {("a", 0): 1, ("a", 1): 2, ("b", 0): -1}
        self.txn = {"producer0": 3, "copier0": 2}
        self.groups = {"copiers": 1}
        self.asked: list[tuple[str, str]] = []

    def leader(self, topic: str, partition: int = 0) -> int:
        self.asked.append(("leader", f"{topic}-{partition}"))
        return self.leaders[(topic, partition)]

    def transaction_coordinator(self, transactional_id: str, timeout_s: float = 60.0) -> int:
        self.asked.append(("txn", transactional_id))
        if transactional_id not in self.txn:
            raise KafkaClusterError(f"timed out waiting for the coordinator of {transactional_id}")
        return self.txn[transactional_id]

    def group_coordinator(self, group_id: str, timeout_s: float = 60.0) -> int:
        self.asked.append(("group", group_id))
        return self.groups[group_id]


def test_each_role_asks_the_cluster_who_holds_its_key() -> None:
    cluster = FakeCluster()
    seen: dict[str, set[tuple[int, str]]] = {role: set() for role in NODE_ROLES}
    rng = random.Random(5)
    for _ in range(200):
        for role in NODE_ROLES:
            choice = choose_node(rng, role, NODES, KEYS, cluster)
            seen[choice.role].add((choice.node, choice.of))
    # a leader is the partition's; b-0 has none, so its draws fell back to a random node
    assert seen[PARTITION_LEADER] == {(1, "a-0"), (2, "a-1")}
    assert seen[TXN_COORDINATOR] == {(3, "producer0"), (2, "copier0")}
    assert seen[GROUP_COORDINATOR] == {(1, "copiers")}
    assert {node for node, _ in seen[RANDOM_NODE]} == set(NODES)
    assert ("leader", "b-0") in cluster.asked


def test_a_failed_look_up_falls_back_to_a_random_node_and_says_why() -> None:
    keys = WorkloadKeys([("a", 0)], ["producer9"], None)
    choice = choose_node(random.Random(1), TXN_COORDINATOR, NODES, keys, FakeCluster())
    assert choice.role == RANDOM_NODE and choice.node in NODES
    assert choice.of == "producer9" and "timed out" in choice.note

    leaderless = WorkloadKeys([("b", 0)], [], None)
    choice = choose_node(random.Random(1), PARTITION_LEADER, NODES, leaderless, FakeCluster())
    assert choice.role == RANDOM_NODE and "node -1" in choice.note


def test_the_draws_do_not_depend_on_the_look_ups() -> None:
    """A seed gives the same schedule whether or not the cluster answers: the same keys are
    asked for, and the random number generator ends in the same state."""

    class Failing(FakeCluster):
        def leader(self, topic: str, partition: int = 0) -> int:
            super().leader(topic, partition)
            raise OSError("connection refused")

    answering, failing = FakeCluster(), Failing()
    rngs = random.Random(9), random.Random(9)
    for _ in range(20):
        choose_node(rngs[0], PARTITION_LEADER, NODES, KEYS, answering)
        choose_node(rngs[1], PARTITION_LEADER, NODES, KEYS, failing)
    assert answering.asked == failing.asked
    assert rngs[0].random() == rngs[1].random()


def test_every_role_once_per_round_and_no_group_without_copiers() -> None:
    deck, rng = RoleDeck(KEYS), random.Random(3)
    for _ in range(5):
        assert sorted(deck.draw(rng) for _ in NODE_ROLES) == sorted(NODE_ROLES)
    no_copiers = WorkloadKeys([("a", 0)], ["producer0"], None)
    assert GROUP_COORDINATOR not in workload_roles(no_copiers)
    assert workload_roles(WorkloadKeys([], [], None)) == [RANDOM_NODE]


class FakeNodes:
    """NodeFaults recording what the nemesis did to which node."""

    def __init__(self) -> None:
        self.deck = RoleDeck(KEYS)
        self.done: list[tuple[str, int]] = []

    def choose(self, rng: random.Random) -> NodeChoice:
        role = self.deck.draw(rng)
        return choose_node(rng, role, NODES, KEYS, FakeCluster())

    def address(self, node: int) -> tuple[str, int]:
        return "127.0.0.1", 9000 + node

    def kill(self, node: int) -> dict[str, Any]:
        self.done.append(("kill", node))
        return {}

    def restart(self, node: int) -> dict[str, Any]:
        self.done.append(("restart", node))
        return {}

    def pause(self, node: int) -> dict[str, Any]:
        self.done.append(("pause", node))
        return {}

    def resume(self, node: int) -> dict[str, Any]:
        self.done.append(("resume", node))
        return {}


class FakeClients:
    def names(self, roles: tuple[str, ...] | None = None) -> list[str]:
        return ["producer0", "copier0", "reader-rc0"]

    def pause(self, name: str, moment: str = "any") -> str:
        return name

    def resume(self, name: str) -> None:
        pass

    def crash(self, name: str, moment: str = "any") -> str:
        return name

    def start(self, name: str) -> str:
        return name


class FakeProxy:
    def __init__(self) -> None:
        self.done: list[tuple[str, Any]] = []

    def isolate_node(self, node: tuple[str, int], mode: str, seconds: float = 0.0) -> None:
        self.done.append((mode, node))

    def heal_node(self, node: tuple[str, int]) -> None:
        self.done.append(("heal", node))

    def cut(self, clients: list[str]) -> None:
        self.done.append(("cut", tuple(clients)))

    def blackhole(self, clients: list[str]) -> None:
        self.done.append(("blackhole", tuple(clients)))

    def delay(self, clients: list[str], seconds: float) -> None:
        self.done.append(("delay", tuple(clients)))

    def heal(self, clients: list[str] | None = None) -> None:
        self.done.append(("heal", tuple(clients or ())))


def nemesis_ops(tmp_path: Path, kind: str, rounds: int) -> tuple[list[Any], FakeNodes, FakeProxy]:
    history = History(tmp_path / "history.jsonl", start=0.0)
    nodes, proxy = FakeNodes(), FakeProxy()
    targets = Targets(None, FakeClients(), proxy, None, nodes=nodes)  # type: ignore[arg-type]
    nemesis = Nemesis((kind,), targets, history, random.Random(4), scale=0.0)
    nemesis._stop.set()  # holds end at once: the plans are what is tested
    for _ in range(rounds):
        nemesis._one(kind)
    history.close()
    return [op for op in history.ops if op.process == NEMESIS], nodes, proxy


def test_kill_strikes_a_chosen_node_and_restarts_it(tmp_path: Path) -> None:
    ops, nodes, _ = nemesis_ops(tmp_path, KILL, 8)
    invoked = [op.value for op in ops if op.type == INVOKE]
    assert len(invoked) == 8 and all(op.type in (INVOKE, OK) for op in ops)
    assert Counter(v["node_role"] for v in invoked) == Counter(dict.fromkeys(NODE_ROLES, 2))
    for value in invoked:
        assert value["target"] in {f"node {n}" for n in NODES}
    killed = [n for what, n in nodes.done if what == "kill"]
    assert [n for what, n in nodes.done if what == "restart"] == killed


def test_pause_strikes_nodes_and_clients(tmp_path: Path) -> None:
    ops, nodes, _ = nemesis_ops(tmp_path, PAUSE, 30)
    targets = [op.value["target"] for op in ops if op.type == INVOKE]
    on_nodes = [t for t in targets if t.startswith("node ")]
    assert 0 < len(on_nodes) < len(targets)  # both kinds of pause
    paused = [n for what, n in nodes.done if what == "pause"]
    assert (
        [n for what, n in nodes.done if what == "resume"]
        == paused
        == [int(t.split()[1]) for t in on_nodes]
    )


def test_partition_cuts_a_chosen_node_off_every_client_or_clients_off_every_node(
    tmp_path: Path,
) -> None:
    ops, _, proxy = nemesis_ops(tmp_path, PARTITION, 30)
    invoked = [op.value for op in ops if op.type == INVOKE]
    node_cuts = [v for v in invoked if v["target"].endswith("from all clients")]
    assert 0 < len(node_cuts) < len(invoked)
    assert {v["mode"] for v in node_cuts} == {"cut", "blackhole", "delay"}
    assert all(v["node_role"] in NODE_ROLES for v in node_cuts)
    isolated = [node for what, node in proxy.done if what in ("cut", "blackhole", "delay")]
    assert ("127.0.0.1", 9001) in isolated or ("127.0.0.1", 9002) in isolated


@pytest.mark.parametrize("text", ["fetched", ""])
def test_fetched_means_the_pinned_release(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from onceflow.verify import kafka_nodes

    asked: list[Any] = []
    monkeypatch.setattr(kafka_nodes, "locate", lambda where: asked.append(where))
    kafka_nodes.resolve_distribution(text)
    kafka_nodes.resolve_distribution("/opt/kafka_2.13-4.1.0")
    assert asked == [None, "/opt/kafka_2.13-4.1.0"]
