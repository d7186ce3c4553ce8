"""Target topics made to match the source's: created with its partition count and its topic
configs, and given the partitions added on the source (MirrorMaker 2's MirrorSourceConnector
does both). Runs on the driver before a micro-batch plans a partition, so a task never
writes to a partition the target does not have yet."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from onceflow.kafka_errors import kafka_error_code, retriable, retry_transient
from onceflow.lazy_clients import HoldsClients, client_property
from onceflow.librdkafka_log import QUIET
from onceflow.mirror.replication_policy import ReplicationPolicy
from onceflow.spark.offset_ranges import TopicPartitionKey
from onceflow.spark.topic_offsets import TopicOffsets

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# MirrorMaker 2's DefaultConfigPropertyFilter: configs that describe one cluster's brokers or
# would rewrite what is mirrored (message.timestamp.type: the target keeps CreateTime).
EXCLUDED_CONFIGS = re.compile(
    r"follower\.replication\.throttled\.replicas|leader\.replication\.throttled\.replicas"
    r"|message\.timestamp\.difference\.max\.ms|message\.timestamp\.type"
    r"|unclean\.leader\.election\.enable|min\.insync\.replicas"
)

_ALREADY = (KafkaError.TOPIC_ALREADY_EXISTS,)


def _away(exc: Exception) -> bool:
    """A failure worth asking again about: the cluster is away (a broker restarting)."""
    return retriable(exc, (KafkaError._TRANSPORT,))


class TopicSyncError(RuntimeError):
    """A target topic could not be created or grown to the source's partition count."""


class TopicSync(HoldsClients):
    """Remembers the target's partition counts it made sure of, so that a trigger whose source
    partitions did not change costs no request to the target."""

    def __init__(
        self,
        source: TopicOffsets,
        target: dict[str, str],
        policy: ReplicationPolicy,
        *,
        timeout_s: float = 30.0,
        retry_for_s: float = 120.0,
    ) -> None:
        self.source = source
        self.target_client = target
        self.policy = policy
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        self._known: dict[str, int] = {}
        self._internal: set[str] = set()

    @client_property
    def target(self) -> AdminClient:
        return AdminClient({**self.target_client, "logger": QUIET})

    def _retrying(self, what: str, call: Callable[[], _T]) -> _T:
        """Retry while a cluster is away (a broker restarting), up to `retry_for_s`."""
        try:
            return retry_transient(
                call,
                _away,
                within_s=self.retry_for_s,
                backoff_s=1.0,
                what=what,
                level=logging.WARNING,
            )
        except KafkaException as exc:
            raise TopicSyncError(f"{what}: {exc}") from exc

    def ensure(self, partitions: Iterable[TopicPartitionKey]) -> None:
        """Make every target topic of `partitions` exist with at least as many partitions."""
        counts = Counter(topic for topic, _ in set(partitions))
        todo = {t: n for t, n in counts.items() if self._known.get(t, 0) < n}
        if not todo:
            return
        existing = self._retrying("listing the target's topics", self._target_counts)
        create, grow = {}, {}
        for topic, count in todo.items():
            there = existing.get(self.policy.target_topic(topic))
            if there is None:
                create[topic] = count
            elif there < count:
                grow[topic] = count
            else:
                self._known[topic] = there
        if create:
            self._create(create)
        if grow:
            self._grow(grow)

    def ensure_internal(self, name: str, config: dict[str, str]) -> None:
        """Make one of the mirror's internal topics exist on the target (once per driver)."""
        if name not in self._internal:
            self._retrying(
                f"creating {name}",
                lambda: ensure_internal_topic(self.target, name, config, self.timeout_s),
            )
            self._internal.add(name)

    def _target_counts(self) -> dict[str, int]:
        metadata = self.target.list_topics(timeout=self.timeout_s)
        return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}

    def source_configs(self, topic: str) -> dict[str, str]:
        """The topic's own (non-default) configs on the source, minus the excluded ones."""
        resource = ConfigResource(ResourceType.TOPIC, topic)

        def describe() -> dict[str, str]:
            entries = self.source.admin.describe_configs([resource])[resource].result(
                timeout=self.timeout_s
            )
            return {
                name: entry.value
                for name, entry in entries.items()
                if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
                and entry.value is not None
                and not EXCLUDED_CONFIGS.fullmatch(name)
            }

        return self._retrying(f"describing {topic}'s configs on the source", describe)

    def _create(self, topics: dict[str, int]) -> None:
        new = [
            NewTopic(self.policy.target_topic(t), n, config=self.source_configs(t))
            for t, n in topics.items()
        ]

        def create() -> None:
            futures = self.target.create_topics(new, request_timeout=self.timeout_s)
            for name, future in futures.items():
                try:
                    future.result(timeout=self.timeout_s)
                except KafkaException as exc:
                    if kafka_error_code(exc) not in _ALREADY:  # made by an earlier attempt
                        raise
                log.info("created %s on the target", name)

        self._retrying("creating topics on the target", create)
        self._known.update(topics)

    def _grow(self, topics: dict[str, int]) -> None:
        wanted = {self.policy.target_topic(t): n for t, n in topics.items()}

        def grow() -> None:
            futures = self.target.create_partitions(
                [NewPartitions(name, n) for name, n in wanted.items()],
                request_timeout=self.timeout_s,
            )
            for name, future in futures.items():
                try:
                    future.result(timeout=self.timeout_s)
                except KafkaException as exc:
                    # an earlier attempt may have added them, its answer lost
                    if kafka_error_code(exc) != KafkaError.INVALID_PARTITIONS:
                        raise
                    if self._target_counts().get(name, 0) < wanted[name]:
                        raise
                log.info("added partitions to %s on the target", name)

        self._retrying("adding partitions on the target", grow)
        self._known.update(topics)


def ensure_internal_topic(
    admin: AdminClient, name: str, config: dict[str, str], timeout_s: float
) -> None:
    """Create one of the mirror's internal topics on the target (1 partition, as MirrorMaker
    2's), unless it exists."""
    if name in admin.list_topics(timeout=timeout_s).topics:
        return
    future = admin.create_topics([NewTopic(name, 1, config=config)], request_timeout=timeout_s)
    try:
        future[name].result(timeout=timeout_s)
    except KafkaException as exc:
        if kafka_error_code(exc) not in _ALREADY:  # else made meanwhile by another driver
            raise
    log.info("created %s on the target", name)
