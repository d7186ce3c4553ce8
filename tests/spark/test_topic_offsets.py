"""The driver's offset look-ups against answers a restarting broker gives: an offset left unset
by librdkafka (-1001, no error) or behind what the query has read is fetched again, never
taken as "no new data" (which ends processAllAvailable and Trigger.AvailableNow early: the
demo's exactly-once run once stopped a micro-batch short after a broker SIGKILL)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from onceflow.spark.options import SourceOptions
from onceflow.spark.source import OnceflowStreamReader
from onceflow.spark.topic_offsets import OffsetLookupError, TopicOffsets

UNSET = -1001  # librdkafka's RD_KAFKA_OFFSET_INVALID
OPTIONS = {
    "kafka.bootstrap.servers": "127.0.0.1:1",
    "subscribe": "t",
    "fetchOffset.retryIntervalMs": "0",
}


@dataclass
class _Listed:
    offset: int


class _Future:
    def __init__(self, offset: int) -> None:
        self.offset = offset

    def result(self) -> _Listed:
        return _Listed(self.offset)


class ScriptedAdmin:
    """Answers each list_offsets call with the next of `answers` (offset by partition)."""

    def __init__(self, answers: list[dict[int, int]]) -> None:
        self.answers: Iterator[dict[int, int]] = iter(answers)
        self.calls = 0

    def list_offsets(self, request: dict[Any, Any], **_: Any) -> dict[Any, _Future]:
        self.calls += 1
        answer = next(self.answers)
        return {tp: _Future(answer[tp.partition]) for tp in request}


def lookup(answers: list[dict[int, int]], retries: int = 3) -> TopicOffsets:
    options = SourceOptions.parse(
        {**OPTIONS, "fetchOffset.numRetries": str(retries)}, streaming=True
    )
    offsets = TopicOffsets(options)
    offsets._admin = ScriptedAdmin(answers)  # type: ignore[assignment]
    return offsets


def test_an_offset_left_unset_is_fetched_again() -> None:
    offsets = lookup([{0: UNSET, 1: 3000}, {0: 2998, 1: 3002}])
    assert offsets.latest([("t", 0), ("t", 1)]) == {("t", 0): 2998, ("t", 1): 3002}
    assert offsets.admin.calls == 2


def test_offsets_left_unset_through_every_retry_fail_the_lookup() -> None:
    offsets = lookup([{0: UNSET}] * 3, retries=2)
    with pytest.raises(OffsetLookupError):
        offsets.latest([("t", 0)])


def test_latest_offsets_behind_what_was_read_are_fetched_again() -> None:
    offsets = lookup([{0: 10}, {0: 2998}])
    assert offsets.latest([("t", 0)], known={("t", 0): 2496}) == {("t", 0): 2998}


def test_latest_offset_of_the_stream_never_comes_from_an_unset_answer() -> None:
    """The micro-batch after a broker restart: the end planned covers the rest of the input."""
    options = SourceOptions.parse({**OPTIONS, "fetchOffset.numRetries": "3"}, streaming=True)
    reader = OnceflowStreamReader(options)
    reader.lookup._admin = ScriptedAdmin(  # type: ignore[assignment]
        [{0: UNSET}, {0: UNSET}, {0: 2998}]
    )
    reader.lookup.partitions = lambda: [("t", 0)]  # type: ignore[method-assign]
    end = reader.latestOffset({"t": {"0": 2496}}, reader.getDefaultReadLimit())
    assert end == {"t": {"0": 2998}}
