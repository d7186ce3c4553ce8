"""The mirror's positions in the source, kept in the target cluster (KIP-656).

For each mirrored partition, the next source offset to copy is a transactional offset of the
group `onceflow-mirror-{alias}`, committed in the same transaction as the records it covers.
It is filed under the *target* topic partition (the same partition number): Apache Kafka, like
onceflow, refuses offsets of partitions the cluster does not have, and the source's topics are
not in the target cluster (under the default policy their names differ), while the target
partition exists by the time anything is written to it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from onceflow.kafka_errors import COORDINATOR_MOVING, coordinator_moving, retry_transient
from onceflow.lazy_clients import HoldsClients, client_property
from onceflow.librdkafka_log import QUIET
from onceflow.mirror.replication_policy import ReplicationPolicy
from onceflow.spark.offset_ranges import PartitionOffsets, TopicPartitionKey
from onceflow.spark.sink_target import consumer_config

_BACKOFF_S = 0.5


class PositionLookupError(RuntimeError):
    """The target cluster did not say where the mirror stands."""


def mirror_group(alias: str) -> str:
    return f"onceflow-mirror-{alias}"


def mirror_transactional_id(alias: str, target_topic: str, partition: int) -> str:
    """Stable for a source partition across restarts (checkpoint or not): a new run fences a
    zombie task of the old one."""
    return f"onceflow-mirror-{alias}.{target_topic}.{partition}"


def read_committed_consumer(client: dict[str, str], group: str, **overrides: object) -> Consumer:
    """A driver-side consumer of the target that never commits (offsets, the offset syncs)."""
    return Consumer(
        consumer_config(
            client,
            **{"group.id": group, "isolation.level": "read_committed", "logger": QUIET},
            **overrides,
        )
    )


class MirrorPositions(HoldsClients):
    """Driver-side reads of the positions the target holds; the consumer is made on first use
    (and dropped when pickled), as the source's admin client."""

    def __init__(self, client: dict[str, str], policy: ReplicationPolicy, timeout_s: float) -> None:
        self.client = client
        self.policy = policy
        self.timeout_s = timeout_s

    @client_property
    def consumer(self) -> Consumer:
        # read_committed: OffsetFetch with require_stable waits out a commit in progress
        return read_committed_consumer(self.client, mirror_group(self.policy.alias))

    def committed(self, source: Iterable[TopicPartitionKey]) -> PartitionOffsets:
        """{source partition: next source offset to copy}, for partitions the target has a
        position for; the others are left out."""
        wanted = {
            (self.policy.target_topic(topic), partition): (topic, partition)
            for topic, partition in source
        }
        if not wanted:
            return {}

        def ask() -> list[TopicPartition]:
            answers = self.consumer.committed(
                [TopicPartition(t, p) for t, p in wanted], timeout=self.timeout_s
            )
            for tp in answers:
                if tp.error is not None and tp.error.code() in COORDINATOR_MOVING:
                    raise KafkaException(tp.error)
            return answers

        # a node of a replicated target cluster failing over: asked again, not a failed query
        answers = retry_transient(
            ask,
            coordinator_moving,
            within_s=self.timeout_s,
            backoff_s=_BACKOFF_S,
            what="reading the mirror's positions",
            level=logging.WARNING,
        )
        out: PartitionOffsets = {}
        for tp in answers:
            if tp.error is not None and tp.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise PositionLookupError(f"{tp.topic}/{tp.partition}: {tp.error}")
            if tp.error is None and tp.offset >= 0:
                out[wanted[(tp.topic, tp.partition)]] = tp.offset
        return out

    def close(self) -> None:
        self.close_clients()
