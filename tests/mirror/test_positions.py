"""The mirror's positions read on the driver while the target's group coordinator moves: on a
replicated Apache Kafka cluster (a node killed, __consumer_offsets being made) librdkafka's
committed() raises NOT_COORDINATOR and the like instead of asking the new coordinator; the
driver asks again rather than failing the query."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from onceflow.mirror.positions import MirrorPositions, PositionLookupError
from onceflow.mirror.replication_policy import ReplicationPolicy


@dataclass
class Answer:
    """One partition of committed()'s answer (confluent-kafka's TopicPartition sets `error`
    only from librdkafka)."""

    topic: str
    partition: int
    offset: int
    error: KafkaError | None = None


class MovingCoordinator:
    """A consumer whose first answers are coordinator errors (raised, or on a partition)."""

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


def positions_with(consumer: MovingCoordinator, timeout_s: float = 10.0) -> MirrorPositions:
    positions = MirrorPositions({"bootstrap.servers": "unused:1"}, ReplicationPolicy(), timeout_s)
    positions.__dict__["consumer"] = consumer  # as if the client_property had made it
    return positions


@pytest.mark.parametrize(
    "failures",
    [
        [KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))],
        [
            KafkaException(KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE)),
            KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS),
        ],
    ],
    ids=["raised", "on-a-partition"],
)
def test_positions_are_asked_again_while_the_coordinator_moves(failures: list[object]) -> None:
    consumer = MovingCoordinator(list(failures))
    assert positions_with(consumer).committed([("orders", 0), ("orders", 1)]) == {
        ("orders", 0): 42,
        ("orders", 1): 42,
    }
    assert consumer.asked == len(failures) + 1


def test_other_errors_still_fail_the_look_up() -> None:
    consumer = MovingCoordinator([KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)])
    with pytest.raises(PositionLookupError, match="orders/0"):
        positions_with(consumer).committed([("orders", 0)])
    assert consumer.asked == 1
