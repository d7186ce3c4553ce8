"""The driver's view of the offset syncs (MirrorMaker 2's OffsetSyncStore): the sync topic read
read_committed, incrementally (each refresh() reads from where the last stopped to the last
stable offset), into an OffsetIndex. A new driver rebuilds it from the start of the topic, so
neither a restart nor a lost checkpoint loses a translation."""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from onceflow.lazy_clients import HoldsClients, client_property
from onceflow.mirror.offset_syncs import OffsetIndex, OffsetSync, OffsetSyncError
from onceflow.mirror.positions import read_committed_consumer

log = logging.getLogger(__name__)


class OffsetSyncReadError(RuntimeError):
    """The sync topic could not be read to its end in time."""


class OffsetSyncStore(HoldsClients):
    def __init__(self, client: dict[str, str], topic: str, timeout_s: float = 30.0) -> None:
        self.client = client
        self.topic = topic
        self.timeout_s = timeout_s
        self.index = OffsetIndex()
        self._next = 0  # next offset of the sync topic to read

    @client_property
    def consumer(self) -> Consumer:
        return read_committed_consumer(
            self.client,
            f"{self.topic}.reader",  # never commits: assign() only
            **{
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",  # syncs gone by retention: from the oldest
            },
        )

    def refresh(self) -> int:
        """Read the syncs committed since the last refresh; how many there were."""
        topic = self.consumer.list_topics(self.topic, timeout=self.timeout_s).topics[self.topic]
        if topic.error is not None:
            if topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return 0  # the mirror has not started yet
            raise KafkaException(topic.error)
        self.consumer.assign([TopicPartition(self.topic, 0, self._next)])
        read = 0
        deadline = time.monotonic() + self.timeout_s
        try:
            while True:
                msg = self.consumer.poll(min(1.0, max(deadline - time.monotonic(), 0)))
                if msg is None:
                    if time.monotonic() > deadline:
                        raise OffsetSyncReadError(f"{self.topic}: no end in {self.timeout_s} s")
                    continue
                deadline = time.monotonic() + self.timeout_s  # a long topic: read on
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return read
                    raise KafkaException(error)
                self._next = msg.offset() + 1  # type: ignore[operator]
                try:
                    self.index.add(OffsetSync.decode(msg.value() or b""))
                except OffsetSyncError as exc:
                    # someone else's record in our topic: say so, translate without it
                    log.warning("%s@%s: %s", self.topic, msg.offset(), exc)
                    continue
                read += 1
        finally:
            self.consumer.unassign()

    def close(self) -> None:
        self.close_clients()
