"""`onceflow run mirror --groups`: a consumer group fails over from source to target and resumes
at the translated position, skipping and repeating nothing, although source and target offsets
differ (aborted source transactions, markers on both sides). A group with members on the
target is not moved, a group ahead on the target is not rewound, and an offset beyond what is
mirrored is not committed until it is."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.librdkafka_log import QUIET
from onceflow.mirror.checkpoints import Checkpoint, checkpoints_topic
from onceflow.pipelines import mirror
from tests.waiting import wait_for

from .kafka_io import create_topic
from .mirror_runs import (
    Source,
    after,
    caught_up,
    consume_and_commit,
    group_offsets,
    positions,
    resume,
    start_mirror,
    two_clusters,  # noqa: F401 (the fixture `clusters`)
)

TARGET = "source.orders"


def member_of(bootstrap: str, group: str, topic: str) -> Consumer:
    """A consumer that has joined `group` on `topic` and stays a member until closed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "logger": QUIET})
    consumer.subscribe([topic])

    def joined() -> bool:
        consumer.poll(0.2)
        return bool(consumer.assignment())

    wait_for(joined, 60, f"a member of {group} on the target")
    return consumer


def checkpoints(bootstrap: str, alias: str = "source") -> list[Checkpoint]:
    """The MM2 checkpoint records on the target (waiting for the first)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "checkpoint-reader", "logger": QUIET}
    )
    found: list[Checkpoint] = []

    def more() -> bool:
        found.extend(Checkpoint.decode(m.key(), m.value()) for m in consumer.consume(100, 0.5))
        return bool(found)

    try:
        consumer.assign([TopicPartition(checkpoints_topic(alias), 0, 0)])
        wait_for(more, 30, "MM2 checkpoints on the target")
        seen = 0
        while len(found) > seen:  # the rest: until a read brings nothing new
            seen = len(found)
            more()
    finally:
        consumer.close()
    return found


def commit_on(bootstrap: str, group: str, topic: str, partition: int, offset: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "logger": QUIET})
    try:
        consumer.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)
    finally:
        consumer.close()


def test_groups_fail_over_to_the_target_at_the_translated_offset(
    spark: SparkSession, clusters: tuple[EmbeddedBroker, EmbeddedBroker], tmp_path: Path
) -> None:
    src, dst = clusters[0].bootstrap, clusters[1].bootstrap
    create_topic(src, "orders", 2)
    orders = Source(src, "orders")
    orders.write(300, per_transaction=20)  # 10 a partition per transaction, every third aborted
    # mid-transaction on partition 0, at a transaction's end (its marker) on partition 1
    app = consume_and_commit(src, "app", "orders", {0: 37, 1: 50})
    consume_and_commit(src, "ahead", "orders", {0: 10})
    consume_and_commit(src, "busy", "orders", {0: 10, 1: 10})

    query = start_mirror(spark, src, dst, tmp_path / "checkpoint")
    try:
        wait_for(lambda: caught_up(orders, dst, TARGET), 180, "the mirror to catch up")
    finally:
        query.stop()
    # on the target: "ahead" has consumed further, "busy" has a member
    app_resumes_with = after(orders, app)  # the target has these; later writes are not mirrored
    commit_on(dst, "ahead", TARGET, 0, 5000)
    busy = member_of(dst, "busy", TARGET)
    # written after the mirror stopped: "late" on partition 0 is beyond what is mirrored
    orders.write(40, per_transaction=20)
    late = consume_and_commit(src, "late", "orders", {0: len(orders.expected()[0]), 1: 20})
    assert late[0] > positions(dst, "source", TARGET, 2)[0]

    groups = mirror.group_sync(
        source=src, target=dst, topics="orders.*", groups="app|ahead|busy|late"
    )
    try:

        def synced(group: str) -> bool:
            groups.sync()
            return min(group_offsets(dst, group, TARGET, 2).values()) >= 0

        wait_for(lambda: synced("app"), 60, "app's translated offsets on the target")
        assert resume(dst, "app", TARGET, 2) == app_resumes_with, "app skipped or repeated"
        assert group_offsets(dst, "ahead", TARGET, 2)[0] == 5000, "ahead was rewound"
        assert max(group_offsets(dst, "busy", TARGET, 2).values()) < 0, "busy was moved"
        line = groups.sync().line()
        assert "busy: active on the target" in line, line
        assert "late: 1 partitions not mirrored" in line and "ahead: 1 partitions ahead" in line
        held = group_offsets(dst, "late", TARGET, 2)
        assert held[0] < 0 and held[1] >= 0, "late: only what is mirrored is translated"
        mine = {(c.group, c.partition): c for c in checkpoints(dst) if c.group == "app"}
        assert {c.upstream_offset for c in mine.values()} == set(app.values())
        assert {c.offset for c in mine.values()} == set(
            group_offsets(dst, "app", TARGET, 2).values()
        )
        busy.close()

        # mirrored further: "late" translates now, still exactly
        query = start_mirror(spark, src, dst, tmp_path / "checkpoint")
        try:
            wait_for(lambda: caught_up(orders, dst, TARGET), 180, "the mirror to catch up again")
        finally:
            query.stop()
        wait_for(lambda: synced("late"), 60, "late's translated offsets")
        assert resume(dst, "late", TARGET, 2) == after(orders, late)
    finally:
        groups.close()
