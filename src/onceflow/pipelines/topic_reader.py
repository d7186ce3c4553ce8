"""Read a whole topic back, as a checker does: every record below the end offsets taken at
the start (the last stable offsets for read_committed), with a deadline."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from onceflow.librdkafka_log import QUIET


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
    partitions = sorted(metadata.topics[topic].partitions)
    isolation = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
    deadline = time.monotonic() + timeout
    while True:
        futures = admin.list_offsets(
            {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions},
            isolation_level=isolation,
            request_timeout=timeout,
        )
        ends = {tp.partition: f.result().offset for tp, f in futures.items()}
        # librdkafka may leave a partition's offset unset (-1001) without an error
        if min(ends.values(), default=0) >= 0:
            return ends
        if time.monotonic() > deadline:
            raise ReadTimeoutError(f"{topic}: no end offset for some partitions: {ends}")
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
