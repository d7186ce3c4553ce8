"""librdkafka with group.protocol=consumer (KIP-848): members join, the group rebalances
incrementally as they come and go (a member never loses a partition it keeps), offsets are
committed under member epochs, and the same inside transactions (sendOffsetsToTransaction)."""

from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.cli.consumer_group_admin import describe_consumer_group
from onceflow.tools.clients import Cluster
from tests.confluent import QUIET, create_topic, produce, transactional_producer
from tests.eos.checker import read_back
from tests.waiting import wait_for


class Member:
    """A KIP-848 consumer and what its rebalance callbacks saw."""

    def __init__(self, bootstrap: str, group: str, topic: str, **conf: object) -> None:
        self.assigned: set[int] = set()
        self.lost_kept: list[set[int]] = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "group.protocol": "consumer",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                **QUIET,
                **conf,
            }
        )
        self.consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Incremental: only the partitions added, never one already owned.
        added = {p.partition for p in partitions}
        assert not added & self.assigned, (added, self.assigned)
        self.assigned |= added

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned -= {p.partition for p in partitions}

    def poll(self) -> list[object]:
        msgs = self.consumer.consume(100, timeout=0.1)
        for m in msgs:
            assert m.error() is None, m.error()
        return msgs


def commit(member: Member) -> None:
    try:
        member.consumer.commit(asynchronous=False)
    except KafkaException as e:
        # Nothing read since the last commit is not an error here.
        assert e.args[0].code() == KafkaError._NO_OFFSET, e


def poll_all(members: list[Member]) -> None:
    for m in members:
        m.poll()


def counts(members: list[Member]) -> list[int]:
    return [len(m.assigned) for m in members]


def test_members_come_and_go_and_only_moved_partitions_move(kip848_broker: EmbeddedBroker) -> None:
    bootstrap = kip848_broker.bootstrap
    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 6)
    produce(bootstrap, topic, [str(i).encode() for i in range(60)])
    a = Member(bootstrap, group, topic)
    members = [a]
    try:
        wait_for(
            lambda: counts(members) == [6],
            60,
            lambda: counts(members),
            poll=lambda: poll_all(members),
        )
        b = Member(bootstrap, group, topic)
        members.append(b)
        a_before = set(a.assigned)
        wait_for(
            lambda: counts(members) == [3, 3],
            60,
            lambda: counts(members),
            poll=lambda: poll_all(members),
        )
        assert a.assigned <= a_before  # a only gave partitions up
        c = Member(bootstrap, group, topic)
        members.append(c)
        a_before, b_before = set(a.assigned), set(b.assigned)
        wait_for(
            lambda: counts(members) == [2, 2, 2],
            60,
            lambda: counts(members),
            poll=lambda: poll_all(members),
        )
        assert a.assigned <= a_before and b.assigned <= b_before
        # Everything read so far is committed by its owner, under its member epoch.
        for m in members:
            commit(m)
        b.consumer.close()
        members.remove(b)
        a_before, c_before = set(a.assigned), set(c.assigned)
        wait_for(
            lambda: counts(members) == [3, 3],
            60,
            lambda: counts(members),
            poll=lambda: poll_all(members),
        )
        assert a_before <= a.assigned and c_before <= c.assigned  # they kept theirs
        assert a.assigned | c.assigned == set(range(6))

        def committed_all() -> bool:
            poll_all(members)
            for m in members:
                commit(m)
            parts = [TopicPartition(topic, p) for p in range(6)]
            return sum(tp.offset for tp in a.consumer.committed(parts, timeout=10)) == 60

        wait_for(committed_all, 60, "every record committed")
    finally:
        for m in members:
            m.consumer.close()


def test_transactional_copy_with_a_member_joining(kip848_broker: EmbeddedBroker) -> None:
    """consume-transform-produce with send_offsets_to_transaction under member epochs: the
    output holds every input exactly once although the group rebalanced in the middle."""
    bootstrap = kip848_broker.bootstrap
    source, sink = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 1)
    total = 400
    produce(bootstrap, source, [str(i).encode() for i in range(total)])
    copiers: list[tuple[Member, object]] = []

    def add_copier(n: int) -> None:
        member = Member(bootstrap, group, source, **{"isolation.level": "read_committed"})
        producer = transactional_producer(bootstrap, f"copier-{group}-{n}")
        copiers.append((member, producer))

    def copy_once(member: Member, producer) -> None:
        msgs = member.consumer.consume(50, timeout=0.1)
        if not msgs:
            return
        producer.begin_transaction()
        try:
            for m in msgs:
                assert m.error() is None, m.error()
                producer.produce(sink, value=m.value())
            positions = member.consumer.position(member.consumer.assignment())
            producer.send_offsets_to_transaction(
                positions, member.consumer.consumer_group_metadata(), 10
            )
            producer.commit_transaction(10)
        except KafkaException:
            # A stale member epoch (the group moved on meanwhile): abort, re-read from the
            # committed offsets.
            producer.abort_transaction(10)
            assigned = member.consumer.assignment()
            for tp in member.consumer.committed(assigned, timeout=10):
                member.consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))

    def committed() -> int:
        member = copiers[0][0]
        parts = [TopicPartition(source, p) for p in range(4)]
        return sum(max(tp.offset, 0) for tp in member.consumer.committed(parts, timeout=10))

    try:
        add_copier(0)
        wait_for(
            lambda: committed() >= total // 4,
            90,
            "a quarter copied",
            poll=lambda: copy_once(*copiers[0]),
        )
        add_copier(1)

        def copy_all() -> None:
            for member, producer in copiers:
                copy_once(member, producer)

        wait_for(
            lambda: committed() == total, 120, lambda: f"{committed()} committed", poll=copy_all
        )
        assert all(m.assigned for m, _ in copiers)  # both took part
    finally:
        for member, _producer in copiers:
            member.consumer.close()
    [read] = read_back(bootstrap, [(sink, 0)]).values()
    assert sorted(int(v) for v in read.committed) == list(range(total))


def test_a_broker_killed_and_restarted_keeps_the_group(tmp_path: Path) -> None:
    """kill -9 of the broker with three members: the records replayed at start give back the
    group epoch, the member epochs and the assignments, and no member loses a partition."""
    broker = EmbeddedBroker(tmp_path, settings={"group.consumer.heartbeat.interval.ms": "500"})
    broker.start()
    members: list[Member] = []
    try:
        bootstrap = broker.bootstrap
        topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, 6)
        members.extend(Member(bootstrap, group, topic) for _ in range(3))
        wait_for(
            lambda: counts(members) == [2, 2, 2],
            60,
            lambda: counts(members),
            poll=lambda: poll_all(members),
        )
        before = describe_consumer_group(Cluster(bootstrap), group)
        owned = [set(m.assigned) for m in members]
        broker.kill()
        broker.start()
        # The members go on heartbeating to the restarted broker, at their epochs.
        wait_for(
            lambda: describe_consumer_group(Cluster(bootstrap), group) is not None,
            60,
            "the group after the restart",
            poll=lambda: poll_all(members),
        )
        for _ in range(20):
            poll_all(members)  # ~2 s: several heartbeats each
        after = describe_consumer_group(Cluster(bootstrap), group)
        assert after is not None and before is not None
        assert after.group_epoch == before.group_epoch
        assert sorted((m.member_id, m.member_epoch, str(m.assignment)) for m in after.members) == (
            sorted((m.member_id, m.member_epoch, str(m.assignment)) for m in before.members)
        )
        assert [set(m.assigned) for m in members] == owned
    finally:
        for m in members:
            m.consumer.close()
        broker.stop()


def test_a_regex_subscription_is_resolved_by_the_broker(kip848_broker: EmbeddedBroker) -> None:
    """librdkafka sends `^...` subscriptions as the heartbeat's SubscribedTopicRegex."""
    bootstrap = kip848_broker.bootstrap
    tag = uuid.uuid4().hex[:8]
    create_topic(bootstrap, f"rx{tag}-1", 2)
    create_topic(bootstrap, f"rx{tag}-2", 1)
    create_topic(bootstrap, f"other{tag}", 1)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{tag}",
            "group.protocol": "consumer",
            **QUIET,
        }
    )
    try:
        consumer.subscribe([f"^rx{tag}-.*"])
        wanted = {(f"rx{tag}-1", 0), (f"rx{tag}-1", 1), (f"rx{tag}-2", 0)}

        def assigned() -> set[tuple[str, int]]:
            return {(tp.topic, tp.partition) for tp in consumer.assignment()}

        wait_for(lambda: assigned() == wanted, 60, assigned, poll=lambda: consumer.poll(0.1))
        info = describe_consumer_group(Cluster(bootstrap), f"g-{tag}")
        assert info is not None
        assert [m.member_epoch for m in info.members] == [info.group_epoch]
    finally:
        consumer.close()
