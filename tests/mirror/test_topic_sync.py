"""The mirror's target topics: made while the target cluster is away for a moment (a broker
restarting), refused at once when the failure is not one to wait out."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from onceflow import kafka_errors
from onceflow.mirror.replication_policy import ReplicationPolicy
from onceflow.mirror.topic_sync import TopicSync, TopicSyncError


class _Done:
    def __init__(self, value: object = None) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> object:
        return self.value


class _Target:
    """The target's AdminClient: its topic listing fails `failures` times with `code`, then
    answers that no topic exists; what create_topics is asked is recorded."""

    def __init__(self, code: int, failures: int) -> None:
        self.code = code
        self.failures = failures
        self.listings = 0
        self.created: list[tuple[str, int]] = []

    def list_topics(self, **_: Any) -> SimpleNamespace:
        self.listings += 1
        if self.failures:
            self.failures -= 1
            raise KafkaException(KafkaError(self.code, "scripted"))
        return SimpleNamespace(topics={})

    def create_topics(self, new: list[NewTopic], **_: Any) -> dict[str, _Done]:
        self.created.extend((t.topic, t.num_partitions) for t in new)
        return {t.topic: _Done() for t in new}


def _sync(target: _Target, retry_for_s: float) -> TopicSync:
    source_admin = SimpleNamespace(describe_configs=lambda rs: {r: _Done({}) for r in rs})
    sync = TopicSync(
        SimpleNamespace(admin=source_admin),  # type: ignore[arg-type]
        {"bootstrap.servers": "target:9092"},
        ReplicationPolicy(),
        retry_for_s=retry_for_s,
    )
    sync.target = target  # type: ignore[assignment]
    return sync


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(kafka_errors.time, "sleep", slept.append)
    return slept


def test_the_target_away_for_a_moment_is_waited_for(sleeps: list[float]) -> None:
    target = _Target(KafkaError._TRANSPORT, failures=2)
    _sync(target, retry_for_s=120.0).ensure([("orders", 0), ("orders", 1)])
    assert target.listings == 3
    assert sleeps == [1.0, 1.0]
    assert target.created == [("source.orders", 2)]


def test_a_failure_not_to_wait_out_is_raised_at_once(sleeps: list[float]) -> None:
    target = _Target(KafkaError.TOPIC_AUTHORIZATION_FAILED, failures=1)
    with pytest.raises(TopicSyncError, match=r"listing the target's topics.*AUTHORIZATION"):
        _sync(target, retry_for_s=120.0).ensure([("orders", 0)])
    assert (target.listings, sleeps, target.created) == (1, [], [])


def test_the_target_away_past_the_deadline_is_an_error(sleeps: list[float]) -> None:
    target = _Target(KafkaError._TRANSPORT, failures=5)
    with pytest.raises(TopicSyncError, match="listing the target's topics"):
        _sync(target, retry_for_s=0.0).ensure([("orders", 0)])
    assert (target.listings, sleeps, target.created) == (1, [], [])
