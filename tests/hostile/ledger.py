"""A topic with known contents on a broker under attack: after each hostile act, the broker
still lives, a normal client can still write, and the log reads back exactly."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Producer, TopicPartition

from onceflow.broker.embedded import EmbeddedBroker
from tests.confluent import Deliveries
from tests.wire import WAIT


@dataclass
class Ledger:
    """A topic with known contents on a broker under attack."""

    broker: EmbeddedBroker
    topic: str
    partitions: int = 2
    expected: dict[int, list[bytes]] = field(default_factory=dict)
    checks: int = 0

    def produce(self, partition: int, values: list[bytes]) -> None:
        deliveries = Deliveries()
        producer = Producer({"bootstrap.servers": self.broker.bootstrap, "acks": "all"})
        for value in values:
            producer.produce(self.topic, value=value, partition=partition, on_delivery=deliveries)
        assert producer.flush(WAIT) == 0
        assert deliveries.failed == []
        self.expected.setdefault(partition, []).extend(values)

    def assert_intact(self) -> None:
        """The broker lives, a normal client can still write, and the log reads back exactly."""
        assert self.broker.process is not None and self.broker.process.poll() is None
        self.checks += 1
        self.produce(self.checks % self.partitions, [f"check-{self.checks}".encode()])
        assert self.read_back() == self.expected

    def read_back(self) -> dict[int, list[bytes]]:
        consumer = Consumer(
            {
                "bootstrap.servers": self.broker.bootstrap,
                "group.id": "ledger-reader",
                "enable.auto.commit": False,
            }
        )
        try:
            tps = [TopicPartition(self.topic, p, 0) for p in range(self.partitions)]
            ends = [consumer.get_watermark_offsets(tp, timeout=WAIT) for tp in tps]
            # The high watermarks alone prove that no refused batch took an offset.
            assert ends == [(0, len(self.expected.get(p, []))) for p in range(self.partitions)]
            consumer.assign(tps)
            got: dict[int, list[bytes]] = {}
            remaining = sum(high for _, high in ends)
            deadline = time.monotonic() + WAIT
            while remaining > 0:
                assert time.monotonic() < deadline, f"{remaining} records did not come back"
                for msg in consumer.consume(remaining, timeout=1.0):
                    assert msg.error() is None, msg.error()
                    got.setdefault(msg.partition(), []).append(msg.value())
                    remaining -= 1
            return got
        finally:
            consumer.close()
