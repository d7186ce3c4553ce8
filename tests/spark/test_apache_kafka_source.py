"""The source's driver-side offset look-ups on a 3-node Apache Kafka cluster keep answering
after a partition's leader moves. librdkafka's AdminClient keeps the leader epoch it cached:
after a leader change each ListOffsets is refused with FENCED_LEADER_EPOCH (measured for over
15 s, its metadata refresh being 5 minutes away), and after a leader's SIGKILL it asks the dead
node (no offset for 10 s a call); Kafka's own AdminClient refreshes its metadata on both."""

from __future__ import annotations

import uuid
from dataclasses import replace

from onceflow.apache_kafka import KafkaCluster
from onceflow.spark.options import SourceOptions
from onceflow.spark.topic_offsets import TopicOffsets
from tests.confluent import QUIET, produce


def ten_records(cluster: KafkaCluster, prefix: str) -> tuple[str, SourceOptions]:
    """A new one-partition topic holding 10 records, and a stream source's options on it."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 1)
    produce(cluster.bootstrap_servers, topic, [b"v%d" % i for i in range(10)], **QUIET)
    options = SourceOptions.parse(
        {"kafka.bootstrap.servers": cluster.bootstrap_servers, "subscribe": topic},
        streaming=True,
    )
    return topic, options


def test_latest_offsets_are_found_after_the_leader_moves(kafka_cluster3: KafkaCluster) -> None:
    cluster = kafka_cluster3
    topic, options = ten_records(cluster, "moving-leader")
    offsets = TopicOffsets(options)
    tp = (topic, 0)
    try:
        assert offsets.latest([tp]) == {tp: 10}

        # Leadership moves away and the old leader comes back: the cached epoch is fenced.
        first = cluster.leader(topic)
        cluster.kill(first)
        cluster.wait_for_leader(topic, not_on=[first])
        cluster.restart(first)
        cluster.wait_for_isr(topic)
        assert offsets.latest([tp]) == {tp: 10}

        # The leader the client knows is SIGKILLed: it answers once another is elected.
        second = cluster.leader(topic)
        cluster.kill(second)
        cluster.wait_for_leader(topic, not_on=[second])
        assert offsets.latest([tp]) == {tp: 10}
    finally:
        offsets.close_clients()


def test_latest_offsets_asked_while_the_leader_is_dead_come_within_one_attempt(
    kafka_cluster3: KafkaCluster,
) -> None:
    """Asked right after the leader's SIGKILL, before another is elected (a micro-batch's
    latestOffset in the middle of a broker failure): one attempt of the look-up (no
    fetchOffset retries) answers once the election is done. A ListOffsets call waiting out the
    whole request timeout on the dead leader used that attempt up: the Spark-on-Kafka copy
    failed so, every attempt spent on a dead node (CI, Kafka 4.4)."""
    cluster = kafka_cluster3
    topic, parsed = ten_records(cluster, "dead-leader")
    # One attempt: its 60 s (Kafka's default.api.timeout.ms) far longer than a KRaft election
    # (broker.session.timeout.ms 9 s), so that only the way the window is used can fail this.
    offsets = TopicOffsets(replace(parsed, fetch_offset_retries=0, api_timeout_s=60.0))
    tp = (topic, 0)
    try:
        assert offsets.latest([tp]) == {tp: 10}  # the client caches the leader
        cluster.kill(cluster.leader(topic))
        assert offsets.latest([tp]) == {tp: 10}
    finally:
        offsets.close_clients()
