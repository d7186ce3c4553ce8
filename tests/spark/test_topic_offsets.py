"""The driver's offset look-ups against answers a restarting broker gives: an offset left unset
by librdkafka (-1001, no error) or behind what the query has read is fetched again, never
taken as "no new data" (which ends processAllAvailable and Trigger.AvailableNow early: the
demo's exactly-once run once stopped a micro-batch short after a broker SIGKILL)."""

from __future__ import annotations

import dataclasses

import pytest

from onceflow.spark.options import SourceOptions
from onceflow.spark.source import OnceflowStreamReader
from onceflow.spark.topic_offsets import OffsetLookupError, TopicOffsets
from tests.scripted_admin import NO_LEADER, NOT_CAUGHT_UP, UNSET, ScriptedAdmin

OPTIONS = {
    "kafka.bootstrap.servers": "127.0.0.1:1",
    "subscribe": "t",
    "fetchOffset.retryIntervalMs": "0",
}


def lookup(
    answers: list[dict[int, int]], retries: int = 3, api_timeout_s: float = 60.0
) -> TopicOffsets:
    options = SourceOptions.parse(
        {**OPTIONS, "fetchOffset.numRetries": str(retries)}, streaming=True
    )
    offsets = TopicOffsets(dataclasses.replace(options, api_timeout_s=api_timeout_s))
    admin = ScriptedAdmin(answers)  # every client made after a failed answer: the same script
    offsets.make_admin = lambda: admin  # type: ignore[method-assign,assignment,return-value]
    return offsets


def test_an_offset_left_unset_is_fetched_again() -> None:
    offsets = lookup([{0: UNSET, 1: 3000}, {0: 2998, 1: 3002}])
    assert offsets.latest([("t", 0), ("t", 1)]) == {("t", 0): 2998, ("t", 1): 3002}
    assert offsets.admin.calls == 2


def test_offsets_left_unset_through_every_retry_fail_the_lookup() -> None:
    # (with no time to wait for a restarting broker, each attempt is one answer)
    offsets = lookup([{0: UNSET}] * 3, retries=2, api_timeout_s=0)
    with pytest.raises(OffsetLookupError):
        offsets.latest([("t", 0)])


def test_latest_offsets_behind_what_was_read_are_fetched_again() -> None:
    offsets = lookup([{0: 10}, {0: 2998}])
    assert offsets.latest([("t", 0)], known={("t", 0): 2496}) == {("t", 0): 2998}


def test_latest_offset_of_the_stream_never_comes_from_an_unset_answer() -> None:
    """The micro-batch after a broker restart: the end planned covers the rest of the input."""
    options = SourceOptions.parse({**OPTIONS, "fetchOffset.numRetries": "3"}, streaming=True)
    reader = OnceflowStreamReader(options)
    admin = ScriptedAdmin([{0: UNSET}, {0: UNSET}, {0: 2998}])
    reader.lookup.make_admin = lambda: admin  # type: ignore[method-assign,assignment,return-value]
    reader.lookup.partitions = lambda: [("t", 0)]  # type: ignore[method-assign]
    end = reader.latestOffset({"t": {"0": 2496}}, reader.getDefaultReadLimit())
    assert end == {"t": {"0": 2998}}


def test_a_broker_down_is_waited_for_within_one_attempt() -> None:
    offsets = lookup([{0: NO_LEADER}] * 5 + [{0: 2998}], retries=0)
    assert offsets.latest([("t", 0)]) == {("t", 0): 2998}


def test_a_new_leader_not_caught_up_is_waited_for_within_one_attempt() -> None:
    """OFFSET_NOT_AVAILABLE: a leader just elected, its high watermark behind (Kafka 4.4
    answered so right after a leader's SIGKILL, and the attempt failed at once)."""
    offsets = lookup([{0: NOT_CAUGHT_UP}] * 3 + [{0: 2998}], retries=0)
    assert offsets.latest([("t", 0)]) == {("t", 0): 2998}


def test_report_latest_offset_asks_nothing_of_the_broker() -> None:
    """Spark calls it for progress after each trigger; a look-up there failed the query
    while a broker restarted. It reports what latestOffset found."""
    options = SourceOptions.parse(OPTIONS, streaming=True)
    reader = OnceflowStreamReader(options)
    admin = ScriptedAdmin([{0: 2998}])
    reader.lookup.make_admin = lambda: admin  # type: ignore[method-assign,assignment,return-value]
    reader.lookup.partitions = lambda: [("t", 0)]  # type: ignore[method-assign]
    assert reader.reportLatestOffset() is None
    reader.latestOffset({"t": {"0": 2496}}, reader.getDefaultReadLimit())
    assert reader.reportLatestOffset() == {"t": {"0": 2998}}
    assert reader.lookup.admin.calls == 1


def test_an_answer_without_an_offset_is_asked_again_of_a_new_client() -> None:
    """librdkafka's client that asked a SIGKILLed leader went on answering no offset; a new
    one learns the leaders afresh."""
    offsets = lookup([{0: UNSET}, {0: UNSET}, {0: 2998}], retries=0)
    made = []
    scripted = offsets.make_admin

    def make_admin() -> object:
        made.append(1)
        return scripted()

    offsets.make_admin = make_admin  # type: ignore[method-assign,assignment]
    assert offsets.latest([("t", 0)]) == {("t", 0): 2998}
    assert len(made) == 3
