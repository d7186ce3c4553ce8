"""kafka-python against the broker: admin, produce with every codec, consume, groups."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import kafka.codec
import kafka.record.default_records
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import CommitFailedError
from kafka.structs import OffsetAndMetadata

from tests.child_consumer import assigned_child
from tests.clients.kafka_python_consumer import consumer, subscribe
from tests.clients.stored_batches import assert_idempotent, stored_codecs
from tests.confluent import consume_all
from tests.kafka_python_codecs import use_cramjam
from tests.waiting import wait_for


@pytest.fixture
def admin(bootstrap: str) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=bootstrap)
    yield client
    client.close()


def create(admin: KafkaAdminClient, topic: str, partitions: int) -> None:
    admin.create_topics([NewTopic(topic, partitions, 1)])


def produce(
    bootstrap: str, topic: str, partitions: int, count: int, **conf: Any
) -> dict[int, list[bytes]]:
    """Send `count` records round-robin over the partitions; what each partition must hold."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=-1, **conf)
    sent: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    futures = []
    for i in range(count):
        value = b"value-%05d-" % i * 5
        futures.append(
            (
                i % partitions,
                producer.send(topic, value=value, key=b"%d" % i, partition=i % partitions),
            )
        )
        sent[i % partitions].append(value)
    producer.flush(30)
    offsets: dict[int, list[int]] = {p: [] for p in range(partitions)}
    for partition, future in futures:
        metadata = future.get(timeout=10)
        assert metadata.partition == partition
        offsets[partition].append(metadata.offset)
    producer.close()
    # Contiguous per partition, in the order sent.
    assert all(offs == list(range(offs[0], offs[0] + len(offs))) for offs in offsets.values())
    return sent


def read_assigned(
    bootstrap: str, topic: str, partitions: int, total: int
) -> dict[int, list[bytes]]:
    """Every record, by assignment (no group), in offset order per partition."""
    c = consumer(bootstrap)
    c.assign([TopicPartition(topic, p) for p in range(partitions)])
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    wait_for(
        lambda: sum(map(len, got.values())) >= total,
        poll=lambda: [
            got[tp.partition].extend((m.offset, m.value) for m in ms)
            for tp, ms in c.poll(200).items()
        ],
    )
    c.close()
    for records in got.values():
        assert [o for o, _ in records] == list(range(len(records)))
    return {p: [v for _, v in records] for p, records in got.items()}


# -- admin ----------------------------------------------------------------------------------------


def test_admin_create_list_describe_delete(admin: KafkaAdminClient, topic_name: str) -> None:
    admin.create_topics([NewTopic(topic_name, 3, 1, topic_configs={"retention.ms": "3600000"})])
    assert topic_name in admin.list_topics()
    [described] = admin.describe_topics([topic_name])
    assert len(described["partitions"]) == 3
    configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name)])
    assert "3600000" in repr(configs)
    admin.delete_topics([topic_name])
    wait_for(lambda: topic_name not in admin.list_topics(), 10, interval=0.05)


# -- produce with each codec ----------------------------------------------------------------------


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_produce_and_consume_each_codec(
    bootstrap: str,
    admin: KafkaAdminClient,
    topic_name: str,
    codec: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if codec is not None and not getattr(kafka.codec, f"has_{codec}")():
        use_cramjam(monkeypatch)
    create(admin, topic_name, 3)
    sent = produce(bootstrap, topic_name, 3, 600, compression_type=codec, enable_idempotence=False)
    assert stored_codecs(bootstrap, topic_name, 3) == {codec or "none"}
    assert read_assigned(bootstrap, topic_name, 3, 600) == sent
    # librdkafka decodes the same batches with its own codecs: the framing is Kafka's.
    by_partition: dict[int, list[bytes]] = {p: [] for p in range(3)}
    for msg in consume_all(bootstrap, topic_name, 3):
        by_partition[msg.partition()].append(msg.value())  # type: ignore[attr-defined]
    assert by_partition == sent


def test_default_idempotent_producer(
    bootstrap: str, admin: KafkaAdminClient, topic_name: str
) -> None:
    create(admin, topic_name, 2)
    sent = produce(bootstrap, topic_name, 2, 200)
    assert_idempotent(bootstrap, topic_name, 2)
    assert read_assigned(bootstrap, topic_name, 2, 200) == sent


# -- groups ---------------------------------------------------------------------------------------


def test_group_consume_commit_and_fetch_offsets(
    bootstrap: str, admin: KafkaAdminClient, topic_name: str
) -> None:
    create(admin, topic_name, 2)
    sent = produce(bootstrap, topic_name, 2, 100, enable_idempotence=False)
    group = f"g-{topic_name}"
    c = consumer(bootstrap, group_id=group)
    subscribe(c, topic_name)
    got: dict[int, list[bytes]] = {0: [], 1: []}
    wait_for(
        lambda: sum(map(len, got.values())) >= 100,
        poll=lambda: [
            got[tp.partition].extend(m.value for m in ms) for tp, ms in c.poll(200).items()
        ],
    )
    assert got == sent
    c.commit({TopicPartition(topic_name, 0): OffsetAndMetadata(30, "half way", -1)})
    c.commit({TopicPartition(topic_name, 1): OffsetAndMetadata(50, "", -1)})
    assert c.committed(TopicPartition(topic_name, 0)) == 30
    assert c.committed(TopicPartition(topic_name, 1)) == 50
    c.close()
    offsets = admin.list_group_offsets(group)[group]
    assert {tp.partition: o.offset for tp, o in offsets.items()} == {0: 30, 1: 50}
    assert offsets[TopicPartition(topic_name, 0)].metadata == "half way"
    # A new member of the group resumes from the committed offsets.
    remaining = {0: sent[0][30:], 1: sent[1][50:]}
    d = consumer(bootstrap, group_id=group)
    subscribe(d, topic_name)
    rest: dict[int, list[bytes]] = {0: [], 1: []}
    wait_for(
        lambda: sum(map(len, rest.values())) >= sum(map(len, remaining.values())),
        poll=lambda: [
            rest[tp.partition].extend(m.value for m in ms) for tp, ms in d.poll(200).items()
        ],
    )
    d.close()
    assert rest == remaining


def _partitions(c: KafkaConsumer) -> set[int]:
    return {tp.partition for tp in c.assignment()}


class PolledConsumer:
    """A group member polled by its own thread, as each application instance would be (a member
    that stops polling holds up everyone's rebalance); commits after each batch it handles."""

    def __init__(self, bootstrap: str, group: str, topic: str, pace: float = 0.02) -> None:
        self.consumer = consumer(bootstrap, group_id=group, max_poll_records=10)
        subscribe(self.consumer, topic)
        self.pace = pace
        self.partitions: set[int] = set()
        self.delivered: list[tuple[int, int, bytes]] = []  # (partition, offset, value)
        self.commit_failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            batches = self.consumer.poll(50)
            for tp, msgs in batches.items():
                self.delivered.extend((tp.partition, m.offset, m.value) for m in msgs)
            if batches:
                try:
                    self.consumer.commit()
                except CommitFailedError:
                    self.commit_failures += 1  # a rebalance began: at-least-once redelivery
                time.sleep(self.pace)  # a slow application, so that work spans the rebalance
            self.partitions = _partitions(self.consumer)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()  # LeaveGroup


def test_rebalance_when_a_consumer_joins_and_leaves(
    bootstrap: str, admin: KafkaAdminClient, topic_name: str
) -> None:
    create(admin, topic_name, 4)
    sent = produce(bootstrap, topic_name, 4, 400, enable_idempotence=False)
    group = f"g-{topic_name}"
    a = PolledConsumer(bootstrap, group, topic_name)
    members = [a]

    def covered() -> bool:
        seen: dict[int, set[int]] = {p: set() for p in sent}
        for c in members:
            for partition, offset, _ in list(c.delivered):
                seen[partition].add(offset)
        return all(seen[p] == set(range(len(sent[p]))) for p in sent)

    try:
        wait_for(lambda: a.partitions == {0, 1, 2, 3}, interval=0.02)
        b = PolledConsumer(bootstrap, group, topic_name)
        members.append(b)

        def split() -> bool:
            pa, pb = a.partitions, b.partitions
            return bool(pa) and bool(pb) and pa | pb == {0, 1, 2, 3} and not pa & pb

        try:
            wait_for(split, what=lambda: (a.partitions, b.partitions), interval=0.02)
            wait_for(covered, interval=0.02)
        finally:
            b.close()  # LeaveGroup: a takes everything back
        wait_for(
            lambda: a.partitions == {0, 1, 2, 3},
            what=lambda: a.partitions,
            interval=0.02,
        )
        more = produce(bootstrap, topic_name, 4, 40, enable_idempotence=False)
        for p, values in more.items():
            sent[p].extend(values)
        wait_for(covered, interval=0.02)
    finally:
        a.close()
    # Every record reached the group with its own value; exactly once unless a commit failed.
    delivered = a.delivered + b.delivered
    assert all(sent[p][offset] == value for p, offset, value in delivered)
    if a.commit_failures + b.commit_failures == 0:
        assert len(delivered) == sum(map(len, sent.values()))


CHILD_CONSUMER = """
import sys
from kafka import KafkaConsumer
c = KafkaConsumer(bootstrap_servers=sys.argv[1], group_id=sys.argv[2],
                  session_timeout_ms=6000, heartbeat_interval_ms=200)
assert c.partitions_for_topic(sys.argv[3])  # see subscribe() in kafka_python_consumer.py
c.subscribe([sys.argv[3]])
while not c.assignment():
    c.poll(50)
print("assigned", flush=True)
while True:
    c.poll(50)
"""


def test_a_killed_member_is_evicted_after_its_session_timeout(
    bootstrap: str, admin: KafkaAdminClient, topic_name: str
) -> None:
    create(admin, topic_name, 2)
    group = f"g-{topic_name}"
    with assigned_child(CHILD_CONSUMER, bootstrap, group, topic_name) as child:
        a = consumer(bootstrap, group_id=group)
        subscribe(a, topic_name)
        wait_for(
            lambda: len(_partitions(a)) == 1,
            30,
            # at the deadline, what `a` holds: both partitions if the child was evicted first
            lambda: f"a to hold one partition; it holds {_partitions(a)}",
            poll=lambda: a.poll(50),
        )
        child.kill()  # SIGKILL: no LeaveGroup, the heartbeats just stop
        child.wait()
        killed_at = time.monotonic()
        wait_for(lambda: len(_partitions(a)) == 2, poll=lambda: a.poll(50))
        # Not before the session timeout: the broker waited for the missing heartbeats.
        assert time.monotonic() - killed_at > 3
        a.close()
