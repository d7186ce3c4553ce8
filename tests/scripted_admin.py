"""An AdminClient stand-in that answers ListOffsets from a script: the answers a restarting
broker gives through librdkafka, replayed without a broker."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException

UNSET = -1001  # librdkafka's RD_KAFKA_OFFSET_INVALID: no offset, and no error
NO_LEADER = -2  # (scripted) the answer of a broker that is down: _NOENT "No leaders found"
# (scripted) a leader just elected: "Leader high watermark is not caught up"
NOT_CAUGHT_UP = -3


@dataclass
class _Listed:
    offset: int


class _Future:
    def __init__(self, offset: int) -> None:
        self.offset = offset

    def result(self) -> _Listed:
        if self.offset == NO_LEADER:
            raise KafkaException(KafkaError(KafkaError._NOENT, "No leaders found"))
        if self.offset == NOT_CAUGHT_UP:
            raise KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE))
        return _Listed(self.offset)


class ScriptedAdmin:
    """Answers each list_offsets call with the next of `answers` (offset by partition); its
    metadata lists one topic with the partitions of the first answer."""

    def __init__(self, answers: list[dict[int, int]]) -> None:
        self.partitions = sorted(answers[0]) if answers else []
        self.answers: Iterator[dict[int, int]] = iter(answers)
        self.calls = 0

    def list_topics(self, topic: str, **_: Any) -> SimpleNamespace:
        partitions = dict.fromkeys(self.partitions)
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions=partitions)})

    def list_offsets(self, request: dict[Any, Any], **_: Any) -> dict[Any, _Future]:
        self.calls += 1
        answer = next(self.answers)
        return {tp: _Future(answer[tp.partition]) for tp in request}
