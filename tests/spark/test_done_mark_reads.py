"""A write task's done-mark read while the group's coordinator moves: on a replicated Apache
Kafka cluster (a node killed or restarting) librdkafka's committed() raises NOT_COORDINATOR and
the like instead of asking the new coordinator. The task asks again (as Java's consumer does)
rather than failing: Spark's four attempts of a task were spent in three seconds that way, and
the query with them (tests/spark/test_apache_kafka_file_transactions.py, once in ten runs).
The failure on a real cluster is that test's; this one pins which errors are asked again."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from onceflow.spark import task_transaction
from onceflow.spark.task_transaction import DoneMarkError, committed_offset
from tests.moving_coordinator import MovingCoordinator


class MovingMarkReaders(MovingCoordinator):
    """Mark readers of a moving coordinator; each failure discards the reader, and the next
    ask makes a new one."""

    def __init__(self) -> None:
        super().__init__([], offset=7)
        self.made = 0
        self.discarded = 0

    def reader(self, config: dict[str, object]) -> MovingMarkReaders:
        assert config["isolation.level"] == "read_committed"
        self.made += 1
        return self

    def discard(self, config: dict[str, object]) -> None:
        self.discarded += 1


@pytest.fixture
def moving(monkeypatch: pytest.MonkeyPatch) -> MovingMarkReaders:
    coordinator = MovingMarkReaders()
    monkeypatch.setattr(task_transaction, "mark_reader", coordinator.reader)
    monkeypatch.setattr(task_transaction, "discard", coordinator.discard)
    monkeypatch.setattr(task_transaction, "_COORDINATOR_BACKOFF_S", 0.01)
    return coordinator


def read(timeout: float = 10.0) -> int:
    _, offset = committed_offset({"group.id": "g"}, TopicPartition("out", 0), timeout)
    return offset


@pytest.mark.parametrize(
    "failures",
    [
        [KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))] * 4,
        [
            KafkaException(KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE)),
            KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS),
            KafkaException(KafkaError(KafkaError._TRANSPORT)),
        ],
    ],
    ids=["raised", "mixed-and-on-the-partition"],
)
def test_the_mark_is_asked_again_while_the_coordinator_moves(
    moving: MovingMarkReaders, failures: list[object]
) -> None:
    moving.failures = list(failures)
    assert read() == 7
    assert moving.asked == len(failures) + 1
    assert moving.discarded == len(failures)  # a new consumer after each failure
    assert moving.made == len(failures) + 1


def test_a_coordinator_still_moving_at_the_deadline_fails_the_read(
    moving: MovingMarkReaders,
) -> None:
    moving.failures = [KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))] * 10_000
    with pytest.raises(KafkaException, match="NOT_COORDINATOR"):
        read(timeout=0.2)
    assert 2 <= moving.asked < 10_000


@pytest.mark.parametrize(
    "failure",
    [
        KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)),
        KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED),
    ],
    ids=["raised", "on-the-partition"],
)
def test_other_errors_fail_at_once(moving: MovingMarkReaders, failure: object) -> None:
    moving.failures = [failure]
    with pytest.raises((KafkaException, DoneMarkError), match=r"(?i)authoriz"):
        read()
    assert moving.asked == 1
    assert moving.discarded == 1
