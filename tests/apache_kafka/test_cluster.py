"""Three Apache Kafka nodes with exactly-once production settings: the helper's look-ups agree
with what the cluster does, and a transactional producer stays exact while the leader of its
partition is SIGKILLed and restarted and while its transaction coordinator is paused."""

from __future__ import annotations

import uuid
from collections import Counter

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from onceflow.apache_kafka import KafkaCluster
from tests.apache_kafka.exactly_once import (
    read_committed,
    transactional_producer,
    write_transaction,
)
from tests.confluent import QUIET
from tests.waiting import wait_for

# TEST_SETTINGS of the helper: the internal topics' partition counts.
INTERNAL_PARTITIONS = 6


def coordinator_partition(key: str) -> int:
    """The internal topic's partition Kafka maps a transactional id or group to:
    Utils.abs(key.hashCode()) % partitions, with Java's String.hashCode."""
    h = 0
    for unit in memoryview(key.encode("utf-16-be")).cast("H"):
        h = (31 * h + int.from_bytes(unit.to_bytes(2, "little"), "big")) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % INTERNAL_PARTITIONS


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_java_string_hash_matches_known_values() -> None:
    # "hello".hashCode() == 99162322 and "polygenelubricants".hashCode() == Integer.MIN_VALUE
    assert coordinator_partition("hello") == 99162322 % INTERNAL_PARTITIONS
    assert coordinator_partition("polygenelubricants") == 0


def test_lookups_agree_with_the_cluster(kafka_cluster3: KafkaCluster) -> None:
    cluster = kafka_cluster3
    topic = unique("lookups")
    cluster.create_topic(topic, 3)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, **QUIET})

    # Partition leaders: as confluent-kafka's AdminClient describes them.
    from confluent_kafka import TopicCollection

    described = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout=30)
    assert {p.id: p.leader.id for p in described.partitions} == {
        p: cluster.leader(topic, p) for p in range(3)
    }
    assert all(cluster.isr(topic, p) == [1, 2, 3] for p in range(3))

    # Transaction coordinators: the leader of the id's __transaction_state partition.
    for transactional_id in (unique("txn") for _ in range(6)):
        coordinator = cluster.transaction_coordinator(transactional_id)
        state = cluster.leader("__transaction_state", coordinator_partition(transactional_id))
        assert coordinator == state, transactional_id

    # Group coordinators: as a joined group is described, and the __consumer_offsets leader.
    group = unique("group")
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": group, **QUIET}
    )
    try:
        consumer.subscribe([topic])
        wait_for(
            lambda: consumer.assignment(),
            60,
            "the group's assignment",
            poll=lambda: consumer.poll(0.2),
        )
        description = admin.describe_consumer_groups([group])[group].result(timeout=30)
        assert description.coordinator.id == cluster.group_coordinator(group)
        assert cluster.group_coordinator(group) == cluster.leader(
            "__consumer_offsets", coordinator_partition(group)
        )
    finally:
        consumer.close()


def test_transactions_stay_exact_while_the_partition_leader_is_killed_and_restarted(
    kafka_cluster3: KafkaCluster,
) -> None:
    cluster = kafka_cluster3
    topic = unique("leader-kill")
    cluster.create_topic(topic, 2)
    victim = cluster.leader(topic, 0)
    producer = transactional_producer(cluster.bootstrap_servers, unique("writer"))
    committed: Counter = Counter()
    aborted: set[bytes] = set()
    leaders_seen = {victim}

    def kill_leader() -> None:
        cluster.kill(victim)
        leaders_seen.add(cluster.wait_for_leader(topic, 0, not_on=[victim], timeout_s=60))

    def restart_leader() -> None:
        cluster.restart(victim)

    hooks = {8: kill_leader, 16: restart_leader}
    for n in range(24):
        values = [b"%d-%d" % (n, i) for i in range(20)]
        wanted = n % 5 != 4  # every fifth transaction aborted on purpose
        done = write_transaction(
            producer, topic, values, partitions=(0, 1), commit=wanted, mid_transaction=hooks.get(n)
        )
        for value in values:
            (committed.__setitem__(value, 1) if done else aborted.add(value))
    producer.flush(30)
    cluster.wait_for_isr(topic, 0)

    assert len(leaders_seen) >= 2, "the partition never changed leader"
    seen = read_committed(cluster.bootstrap_servers, topic, 2)
    duplicated = {v: c for v, c in seen.items() if c > 1}
    lost = set(committed) - set(seen)
    visible_aborted = aborted & set(seen)
    assert (duplicated, lost, visible_aborted) == ({}, set(), set())
    assert set(seen) == set(committed)


def test_a_paused_transaction_coordinator_is_replaced_and_transactions_stay_exact(
    kafka_cluster3: KafkaCluster,
) -> None:
    cluster = kafka_cluster3
    topic = unique("coordinator-pause")
    cluster.create_topic(topic, 3)
    transactional_id = unique("paused")
    producer = transactional_producer(cluster.bootstrap_servers, transactional_id)
    paused = cluster.transaction_coordinator(transactional_id)
    # Written where the paused node does not lead: this test pauses a coordinator, not a leader.
    partition = next(p for p in range(3) if cluster.leader(topic, p) != paused)
    committed = [b"before"]
    assert write_transaction(producer, topic, committed, partitions=[partition])

    # SIGSTOP mid-transaction: the controller fences the silent node after
    # broker.session.timeout.ms and another node takes over the coordinator's partition.
    during = [b"during-%d" % i for i in range(10)]
    assert write_transaction(
        producer,
        topic,
        during,
        partitions=[partition],
        mid_transaction=lambda: cluster.pause(paused),
    )
    successor = cluster.transaction_coordinator(transactional_id)
    assert successor != paused
    cluster.resume(paused)
    cluster.wait_ready()
    assert write_transaction(producer, topic, [b"after"], partitions=[partition])
    producer.flush(30)

    seen = read_committed(cluster.bootstrap_servers, topic, 3)
    assert seen == dict.fromkeys([*committed, *during, b"after"], 1)
