"""Kafka 4's rolling upgrade of a consuming group, with real clients: three librdkafka consumers
in a classic group (cooperative-sticky) consume a topic a producer keeps feeding; one at a time
each is closed and replaced by one with group.protocol=consumer (KIP-848). The first one
upgrades the classic group with members online (group.consumer.migration.policy's default,
bidirectional); the classic members go on inside the consumer group until they are replaced.

Every consumer commits synchronously what it read. Checked: committed offsets never go back,
every record below the final committed offsets was consumed by some member, and at the end
the group is a consumer group with the three new members.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from itertools import count

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.cli.consumer_group_admin import describe_consumer_group
from onceflow.tools.clients import Cluster
from onceflow.verify.final_reads import group_type
from tests.cli.harness import invoke
from tests.confluent import QUIET, create_topic
from tests.waiting import wait_for

PARTITIONS = 6
# Commit errors a member may get while its group rebalances: its records are read again by
# the partition's next owner (at least once), never lost.
REBALANCING = {
    KafkaError._NO_OFFSET,
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.STALE_MEMBER_EPOCH,
    KafkaError.FENCED_MEMBER_EPOCH,
    KafkaError._ASSIGNMENT_LOST,
    KafkaError._STATE,
}


class Rolling:
    """The consumers of the group, the records they read and the offsets they committed."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.members: dict[str, tuple[Consumer, set[int]]] = {}
        self.consumed: dict[int, set[int]] = {p: set() for p in range(PARTITIONS)}
        self.committed: dict[int, int] = {}
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **QUIET})
        self.produced = 0
        self._values = count()

    def start(self, name: str, protocol: str) -> None:
        conf: dict[str, object] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "group.protocol": protocol,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "client.id": name,
            **QUIET,
        }
        if protocol == "classic":
            conf.update(
                {
                    "partition.assignment.strategy": "cooperative-sticky",
                    "session.timeout.ms": 6_000,
                    "heartbeat.interval.ms": 500,
                }
            )
        assigned: set[int] = set()

        def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            added = {p.partition for p in partitions}
            assert not added & assigned, (name, added, assigned)
            assigned.update(added)

        def on_revoke(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            assigned.difference_update(p.partition for p in partitions)

        consumer = Consumer(conf)
        consumer.subscribe(
            [self.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke
        )
        self.members[name] = (consumer, assigned)

    def stop(self, name: str) -> None:
        consumer, _ = self.members.pop(name)
        consumer.close()

    def feed(self, n: int = 6) -> None:
        for _ in range(n):
            self.producer.produce(self.topic, value=str(next(self._values)).encode())
        self.produced += n
        self.producer.poll(0)

    def round(self) -> None:
        """Every member reads what it can and commits it synchronously."""
        for name, (consumer, _) in self.members.items():
            msgs = consumer.consume(200, timeout=0.05)
            for m in msgs:
                assert m.error() is None, (name, m.error())
                self.consumed[m.partition()].add(m.offset())
            if not msgs:
                continue
            try:
                offsets = consumer.commit(asynchronous=False)
            except KafkaException as e:
                assert e.args[0].code() in REBALANCING, (name, e)
                continue
            for tp in offsets or ():
                if tp.error is None and tp.offset >= 0:
                    before = self.committed.get(tp.partition, 0)
                    assert tp.offset >= before, (name, tp, before)
                    self.committed[tp.partition] = tp.offset

    def settled(self) -> bool:
        """Every member owns partitions, none owned twice, all of them owned."""
        owned = [p for _, assigned in self.members.values() for p in assigned]
        return all(assigned for _, assigned in self.members.values()) and sorted(owned) == list(
            range(PARTITIONS)
        )

    def keep_going(self, condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
        def step() -> None:
            self.feed()
            self.round()

        wait_for(condition, timeout, what, poll=step)

    def drain(self) -> None:
        """The producer stops; the members go on until everything produced is committed, and
        every offset below each partition's commit was read by some member."""
        self.producer.flush(30)
        produced = self.produced

        def all_committed() -> bool:
            self.round()
            return sum(self.committed.values()) == produced

        wait_for(all_committed, 60, lambda: f"commits {self.committed} of {produced}")
        for p, offset in self.committed.items():
            missing = set(range(offset)) - self.consumed[p]
            assert not missing, f"partition {p}: offsets {sorted(missing)[:10]} never read"

    def group_type(self) -> str | None:
        return group_type(self.bootstrap, self.group)

    def close(self) -> None:
        for name in list(self.members):
            self.stop(name)
        self.producer.flush(10)


def test_a_rolling_upgrade_from_classic_to_consumer_while_consuming(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = make_broker(settings={"group.consumer.heartbeat.interval.ms": "500"})
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    rolling = Rolling(broker.bootstrap, topic, group)
    try:
        for i in range(3):
            rolling.start(f"classic-{i}", "classic")
        rolling.keep_going(rolling.settled, "the classic group to assign every partition")
        assert rolling.group_type() == "classic"
        for i in range(3):
            rolling.stop(f"classic-{i}")
            rolling.start(f"consumer-{i}", "consumer")
            rolling.keep_going(
                rolling.settled, f"the group to settle with consumer-{i} (step {i + 1} of 3)"
            )
            assert rolling.group_type() == "consumer"
            # The members not restarted yet are classic members of the consumer group.
            if i == 0:  # `onceflow groups describe` shows which members are classic
                described = invoke("groups", "describe", group, "-b", broker.bootstrap)
                assert described.exit_code == 0, described.stderr
                upgraded = sorted(
                    row[2] for row in described.table_rows() if row[0] != group and len(row) > 2
                )
                assert upgraded == ["false", "false", "true"], described.stdout
            info = describe_consumer_group(Cluster(broker.bootstrap), group)
            assert info is not None
            kinds = {m.client_id: m.upgraded for m in info.members}
            assert kinds == {
                **{f"classic-{j}": False for j in range(i + 1, 3)},
                **{f"consumer-{j}": True for j in range(i + 1)},
            }, kinds
        # The producer stops: everything produced is read and committed by the new members.
        rolling.drain()
        assert sorted(rolling.members) == ["consumer-0", "consumer-1", "consumer-2"]
        assert rolling.group_type() == "consumer"
    finally:
        rolling.close()


def test_a_rolling_downgrade_from_consumer_to_classic_while_consuming(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    """The way back: classic members join the consumer group, and when the last
    consumer-protocol member leaves the group is downgraded and its classic members rejoin it."""
    broker = make_broker(settings={"group.consumer.heartbeat.interval.ms": "500"})
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    rolling = Rolling(broker.bootstrap, topic, group)
    try:
        for i in range(3):
            rolling.start(f"consumer-{i}", "consumer")
        rolling.keep_going(rolling.settled, "the consumer group to assign every partition")
        for i in range(3):
            rolling.stop(f"consumer-{i}")
            rolling.start(f"classic-{i}", "classic")
            rolling.keep_going(
                rolling.settled, f"the group to settle with classic-{i} (step {i + 1} of 3)"
            )
            # The last consumer-protocol member gone (step 2), the group is classic again.
            assert rolling.group_type() == ("consumer" if i < 2 else "classic")
        rolling.drain()
    finally:
        rolling.close()
