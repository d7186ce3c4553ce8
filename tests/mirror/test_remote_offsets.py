"""remote_consumer_offsets: a group's translated offsets from `{alias}.checkpoints.internal`, as
MirrorMaker 2's RemoteClusterUtils.translateOffsets reads them (tests/apache_kafka/
test_mirror_maker.py checks both readers agree on MM2's own checkpoints)."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.mirror.checkpoints import Checkpoint, checkpoints_topic
from onceflow.mirror.remote_offsets import remote_consumer_offsets
from tests.confluent import QUIET


def test_the_groups_last_checkpoint_per_partition_wins(bootstrap: str) -> None:
    alias = f"dc{uuid.uuid4().hex[:8]}"
    topic = checkpoints_topic(alias)
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})  # alive until answered
    compacted = NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})
    admin.create_topics([compacted])[topic].result(timeout=30)
    mirrored = f"{alias}.orders"
    written = [
        Checkpoint("shop", mirrored, 0, 10, 8),
        Checkpoint("other", mirrored, 0, 99, 97),  # another group: not ours
        Checkpoint("shop", mirrored, 1, 5, 5, "meta"),
        Checkpoint("shop", mirrored, 0, 20, 17),  # later: wins over 10 -> 8
    ]
    producer = Producer({"bootstrap.servers": bootstrap, **QUIET})
    for checkpoint in written[:2]:
        producer.produce(topic, checkpoint.value(), checkpoint.key())
    producer.produce(topic, b"not a checkpoint", b"\x00")  # someone else's: skipped
    producer.produce(topic, None, Checkpoint("shop", mirrored, 2, 0, 0).key())  # a tombstone
    for checkpoint in written[2:]:
        producer.produce(topic, checkpoint.value(), checkpoint.key())
    assert producer.flush(30) == 0
    client = {"bootstrap.servers": bootstrap}
    assert remote_consumer_offsets(client, alias, "shop") == {
        (mirrored, 0): written[3],
        (mirrored, 1): written[2],
    }
    assert remote_consumer_offsets(client, alias, "nobody") == {}


def test_no_checkpoints_topic_is_no_offsets(bootstrap: str) -> None:
    assert remote_consumer_offsets({"bootstrap.servers": bootstrap}, "nowhere", "shop") == {}
