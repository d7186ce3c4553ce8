"""The mirror's positions read on the driver while the target's group coordinator moves: on a
replicated Apache Kafka cluster (a node killed, __consumer_offsets being made) librdkafka's
committed() raises NOT_COORDINATOR and the like instead of asking the new coordinator; the
driver asks again rather than failing the query."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from onceflow.mirror.positions import MirrorPositions, PositionLookupError
from onceflow.mirror.replication_policy import ReplicationPolicy
from tests.moving_coordinator import MovingCoordinator


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
