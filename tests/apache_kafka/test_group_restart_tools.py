"""A classic group of two confluent-kafka consumers and Kafka's Java consumer (its
kafka-verifiable-consumer) through kill -9 restarts of the broker (issue 24): neither client
rebalances (no partitions revoked or assigned), both go on consuming their partitions, and
Kafka's kafka-consumer-groups and `onceflow groups describe` agree on the group the broker
loaded: Stable, the same three members, each owning the partitions its consumer was given."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from onceflow.apache_kafka import Distribution
from onceflow.broker.embedded import EmbeddedBroker
from tests.apache_kafka.kafka_tools import (
    CONSUMER_GROUPS,
    VERIFIABLE_CONSUMER,
    KafkaTools,
    space_table,
    write_log4j2,
)
from tests.broker.group_consumers import DEADLINE_S, PARTITIONS, Group, consuming
from tests.cli.harness import invoke
from tests.waiting import wait_for

RESTARTS = 2


class JavaConsumer:
    """kafka-verifiable-consumer in the group: its JSON events, read as it prints them."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                with self._lock:
                    self._events.append(json.loads(line))

    def events(self, *names: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self._events if e["name"] in names]

    def assigned(self) -> frozenset[int]:
        owned: set[int] = set()
        for e in self.events("partitions_assigned", "partitions_revoked"):
            changed = {p["partition"] for p in e["partitions"]}
            owned = owned | changed if e["name"] == "partitions_assigned" else owned - changed
        return frozenset(owned)

    def consumed_to(self) -> dict[int, int]:
        """partition -> the last offset consumed."""
        last: dict[int, int] = {}
        for e in self.events("records_consumed"):
            for p in e["partitions"]:
                last[p["partition"]] = max(last.get(p["partition"], -1), p["maxOffset"])
        return last


@contextmanager
def java_consumer(tools: KafkaTools, group: Group, tmp_path: Path) -> Iterator[JavaConsumer]:
    config = tmp_path / "java-consumer.properties"
    config.write_text("client.id=java\nreconnect.backoff.max.ms=500\n")
    command = tools.distribution.command(
        VERIFIABLE_CONSUMER,
        "--bootstrap-server", group.broker.bootstrap, "--topic", group.topic,
        "--group-id", group.group_id, "--group-protocol", "classic",
        "--assignment-strategy", "org.apache.kafka.clients.consumer.RangeAssignor",
        "--session-timeout", "30000", "--reset-policy", "earliest",
        "--consumer.config", str(config),
        heap="128m",
        options=(f"-Dlog4j2.configurationFile={tools.log4j2}",),
    )  # fmt: skip
    consumer = JavaConsumer(command)
    try:
        yield consumer
    finally:
        consumer.process.kill()
        consumer.process.wait()


def test_java_and_librdkafka_keep_their_group_and_tools_agree_after_restarts(
    apache_kafka: Distribution,
    make_broker: Callable[..., EmbeddedBroker],
    topic_name: str,
    tmp_path: Path,
) -> None:
    broker = make_broker()
    tools = KafkaTools(apache_kafka, broker.bootstrap, write_log4j2(tmp_path))
    with (
        consuming(broker, topic_name, consumers=2) as group,
        java_consumer(tools, group, tmp_path) as java,
    ):

        def settled() -> bool:
            sizes = sorted(len(a) for a in [*group.assignments(), java.assigned()])
            state, members = group.describe()
            return sizes == [2, 2, 2] and state == "Stable" and len(members) == 3

        def consumed_all() -> bool:
            """Every value produced, on the partitions of each consumer, consumed by it."""
            per_partition = group.produced // PARTITIONS
            ours = {v for m in group.members for v in m.seen()[2]}
            want = {f"v{i}".encode() for i in range(group.produced)}
            theirs = {f"v{i}".encode() for i in range(group.produced) if i % 6 in java.assigned()}
            java_done = all(java.consumed_to().get(p) == per_partition - 1 for p in java.assigned())
            return java_done and ours >= want - theirs

        # Settled before anything is written: each consumer reads its partitions from 0.
        wait_for(settled, DEADLINE_S, lambda: f"settled: {group.rebalances()}, {java.assigned()}")
        group.produce(30)
        wait_for(consumed_all, DEADLINE_S, lambda: f"all consumed: java {java.consumed_to()}")
        rebalances = group.rebalances()
        java_rebalances = java.events("partitions_assigned", "partitions_revoked")
        owners = {str(p): f"c{i}" for i, m in enumerate(group.members) for p in m.seen()[1]}
        owners.update({str(p): "java" for p in java.assigned()})
        for _ in range(RESTARTS):
            broker.restart()  # kill -9, then the same data directory and port
            group.produce(30)
            wait_for(consumed_all, DEADLINE_S, lambda: f"all consumed: java {java.consumed_to()}")
        assert group.rebalances() == rebalances
        assert java.events("partitions_assigned", "partitions_revoked") == java_rebalances

        b = ("--bootstrap-server", broker.bootstrap, "--group", group.group_id)
        kafka_rows = space_table(tools.ok(CONSUMER_GROUPS, *b, "--describe").stdout, "GROUP")
        kafka = {r["PARTITION"]: (r["CONSUMER-ID"], r["CLIENT-ID"]) for r in kafka_rows}
        (state,) = space_table(
            tools.ok(CONSUMER_GROUPS, *b, "--describe", "--state").stdout, "GROUP"
        )
        described = invoke("groups", "describe", group.group_id, "-b", broker.bootstrap)
        assert described.exit_code == 0, described.stderr
        ours = {row[2]: (row[6], row[8]) for row in described.table_rows(first_cell=group.group_id)}
        assert group.rebalances() == rebalances  # nobody rebalanced meanwhile

    assert (state["STATE"], state["#MEMBERS"], state["ASSIGNMENT-STRATEGY"]) == (
        "Stable", "3", "range",
    )  # fmt: skip
    assert kafka == ours
    assert {p: client for p, (_, client) in kafka.items()} == owners
    assert len({member for member, _ in kafka.values()}) == 3
