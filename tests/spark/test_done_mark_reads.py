"""A write task's done-mark read while the group's coordinator moves: on a replicated Apache
Kafka cluster (a node killed or restarting) librdkafka's committed() raises NOT_COORDINATOR and
the like instead of asking the new coordinator. The task asks again (as Java's consumer does)
rather than failing: Spark's four attempts of a task were spent in three seconds that way, and
the query with them (tests/spark/test_apache_kafka_file_transactions.py, once in ten runs).
The failure on a real cluster is that test's; this one pins which errors are asked again."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from onceflow.spark import task_transaction
from onceflow.spark.task_transaction import DoneMarkError, committed_offset


@dataclass
class Answer:
    """committed()'s answer for one partition (confluent-kafka's TopicPartition sets `error`
    only from librdkafka)."""

    topic: str
    partition: int
    offset: int
    error: KafkaError | None = None


class MovingCoordinator:
    """Mark readers whose first answers are the given failures (raised, or on the partition);
    each failure discards the reader, and the next ask makes a new one."""

    def __init__(self, failures: list[object], offset: int = 7) -> None:
        self.failures = failures
        self.offset = offset
        self.asked = 0
        self.made = 0
        self.discarded = 0

    def reader(self, config: dict[str, object]) -> MovingCoordinator:
        assert config["isolation.level"] == "read_committed"
        self.made += 1
        return self

    def discard(self, config: dict[str, object]) -> None:
        self.discarded += 1

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[Answer]:
        self.asked += 1
        if self.failures:
            failure = self.failures.pop(0)
            if isinstance(failure, KafkaException):
                raise failure
            assert isinstance(failure, KafkaError)
            return [Answer(tp.topic, tp.partition, -1001, failure) for tp in tps]
        return [Answer(tp.topic, tp.partition, self.offset) for tp in tps]


@pytest.fixture
def moving(monkeypatch: pytest.MonkeyPatch) -> MovingCoordinator:
    coordinator = MovingCoordinator([])
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
    moving: MovingCoordinator, failures: list[object]
) -> None:
    moving.failures = list(failures)
    assert read() == 7
    assert moving.asked == len(failures) + 1
    assert moving.discarded == len(failures)  # a new consumer after each failure
    assert moving.made == len(failures) + 1


def test_a_coordinator_still_moving_at_the_deadline_fails_the_read(
    moving: MovingCoordinator,
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
def test_other_errors_fail_at_once(moving: MovingCoordinator, failure: object) -> None:
    moving.failures = [failure]
    with pytest.raises((KafkaException, DoneMarkError), match=r"(?i)authoriz"):
        read()
    assert moving.asked == 1
    assert moving.discarded == 1
