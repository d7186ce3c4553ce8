"""The topics a benchmark writes: created with every partition led, deleted afterwards."""

from __future__ import annotations

import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import NewTopic

from onceflow.bench.errors import BenchError
from onceflow.tools.clients import REQUEST_TIMEOUT_S, AdminSession, result_of
from onceflow.tools.errors import CliError, kafka_error_text
from onceflow.tools.output import note

TOPIC_READY_TIMEOUT_S = 30.0


def create_topic(session: AdminSession, topic: str, partitions: int, replication: int) -> None:
    """Create a topic and wait until every partition has a leader."""
    futures = session.admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=replication)],
        operation_timeout=REQUEST_TIMEOUT_S,
        request_timeout=REQUEST_TIMEOUT_S,
    )
    try:
        result_of(futures[topic], f"Creating topic '{topic}'")
    except KafkaException as exc:
        raise BenchError(f"cannot create topic '{topic}': {kafka_error_text(exc)}") from exc
    deadline = time.monotonic() + TOPIC_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        metadata = session.admin.list_topics(topic, timeout=REQUEST_TIMEOUT_S).topics.get(topic)
        if (
            metadata is not None
            and metadata.error is None
            and len(metadata.partitions) == partitions
            and all(p.leader >= 0 for p in metadata.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise BenchError(f"topic '{topic}' has no leader for every partition after creation")


def delete_topic(session: AdminSession, topic: str) -> None:
    futures = session.admin.delete_topics([topic], operation_timeout=REQUEST_TIMEOUT_S)
    try:
        result_of(futures[topic], f"Deleting topic '{topic}'")
    except (KafkaException, CliError) as exc:
        # Not fatal to the figures; say so rather than drop it.
        note(f"Could not delete benchmark topic '{topic}': {exc}")
