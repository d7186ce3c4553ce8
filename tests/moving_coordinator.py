"""A consumer whose group coordinator is moving: its first committed() answers are coordinator
errors, raised or on a partition (what librdkafka does on a Kafka cluster whose node died)."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, TopicPartition


@dataclass
class Answer:
    """One partition of committed()'s answer (confluent-kafka's TopicPartition sets `error`
    only from librdkafka)."""

    topic: str
    partition: int
    offset: int
    error: KafkaError | None = None


class MovingCoordinator:
    """A consumer whose first answers are the given failures (raised, or on a partition)."""

    def __init__(self, failures: list[object], offset: int = 42) -> None:
        self.failures = failures
        self.offset = offset
        self.asked = 0

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[Answer]:
        self.asked += 1
        if self.failures:
            failure = self.failures.pop(0)
            if isinstance(failure, KafkaException):
                raise failure
            assert isinstance(failure, KafkaError)
            return [Answer(tp.topic, tp.partition, -1001, failure) for tp in tps]
        return [Answer(tp.topic, tp.partition, self.offset) for tp in tps]
