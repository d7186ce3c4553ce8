"""Read a whole topic back, as a checker does: every record below the end offsets taken at
the start (the last stable offsets for read_committed), with a deadline."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from onceflow.librdkafka_log import QUIET
from onceflow.offset_lookup import IncompleteAnswerError, isolation_level, list_offsets


@dataclass(frozen=True, slots=True)
class ReadRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class ReadTimeoutError(TimeoutError):
    """The topic could not be read to its end offsets before the deadline."""


def end_offsets(
    bootstrap: str, topic: str, *, read_committed: bool = True, timeout: float = 30.0
) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": QUIET})
    metadata = admin.list_topics(topic, timeout=timeout)
    partitions = [(topic, p) for p in sorted(metadata.topics[topic].partitions)]
    deadline = time.monotonic() + timeout
    while True:
        try:
            ends = list_offsets(
                admin,
                partitions,
                OffsetSpec.latest(),
                isolation=isolation_level(read_committed),
                timeout_s=timeout,
            )
            return {p: offset for (_, p), offset in ends.items()}
        except IncompleteAnswerError as exc:
            if time.monotonic() >= deadline:
                raise ReadTimeoutError(f"{topic}: {exc}") from exc
        time.sleep(0.2)


def read_topic(
    bootstrap: str, topic: str, *, read_committed: bool = True, timeout: float = 60.0
) -> list[ReadRecord]:
    ends = end_offsets(bootstrap, topic, read_committed=read_committed, timeout=timeout)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "logger": QUIET,
            "group.id": "onceflow-reader",
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 10,
            "isolation.level": "read_committed" if read_committed else "read_uncommitted",
        }
    )
    try:
        todo = {p: end for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in todo])
        out: list[ReadRecord] = []
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                raise ReadTimeoutError(f"{topic}: still to read up to {todo}")
            for msg in consumer.consume(10_000, 0.2):
                if msg.error() is not None:
                    continue
                p, offset = msg.partition(), msg.offset()
                if p in todo and offset < todo[p]:
                    out.append(ReadRecord(p, offset, msg.key(), msg.value()))
            # Aborted records and markers leave gaps: the position, not a count, says "done".
            for tp in consumer.position([TopicPartition(topic, p) for p in list(todo)]):
                if tp.offset >= todo[tp.partition]:
                    del todo[tp.partition]
        return out
    finally:
        consumer.close()
