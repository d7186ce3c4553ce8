"""A consumer group's offsets in the target cluster as the checkpoints say them: MirrorMaker 2's
RemoteClusterUtils.translateOffsets, for checkpoints written by onceflow's mirror or by
MirrorMaker 2 itself (the records are the same bytes: see checkpoints.py).

The checkpoints topic `{alias}.checkpoints.internal` is read from its start to its end as it is
when called; for each target partition, the group's last checkpoint wins (the topic is
compacted by that key)."""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from onceflow.mirror.checkpoints import Checkpoint, CheckpointError, checkpoints_topic
from onceflow.mirror.positions import read_committed_consumer

log = logging.getLogger(__name__)


class CheckpointReadError(RuntimeError):
    """The checkpoints topic could not be read to its end in time."""


def remote_consumer_offsets(
    client: dict[str, str], alias: str, group: str, timeout_s: float = 30.0
) -> dict[tuple[str, int], Checkpoint]:
    """{(target topic, partition): the group's last checkpoint there}, from the checkpoints the
    mirror of source cluster `alias` wrote into this (target) cluster; empty when there are
    none (no topic yet, or none for the group)."""
    topic = checkpoints_topic(alias)
    consumer = read_committed_consumer(
        client, f"{topic}.reader", **{"enable.partition.eof": True, "enable.auto.commit": False}
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if metadata.error is not None:
            if metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return {}
            raise KafkaException(metadata.error)
        partitions = sorted(metadata.partitions)  # MM2 and onceflow make 1; read any number
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        found: dict[tuple[str, int], Checkpoint] = {}
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < len(partitions):
            if time.monotonic() > deadline:
                raise CheckpointReadError(f"{topic}: no end in {timeout_s} s")
            msg = consumer.poll(min(1.0, max(deadline - time.monotonic(), 0)))
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())  # type: ignore[arg-type]
                    continue
                raise KafkaException(error)
            if msg.value() is None:
                continue  # a tombstone: nothing to translate
            try:
                checkpoint = Checkpoint.decode(msg.key() or b"", msg.value() or b"")
            except CheckpointError as exc:
                # someone else's record in the topic: say so, translate without it
                log.warning("%s@%s: %s", topic, msg.offset(), exc)
                continue
            if checkpoint.group == group:
                found[(checkpoint.topic, checkpoint.partition)] = checkpoint
        return found
    finally:
        consumer.close()
