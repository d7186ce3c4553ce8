"""Spark Kafka option names parsed into source and sink settings (no Spark session needed)."""

from __future__ import annotations

import pytest

from onceflow.spark.offset_ranges import EARLIEST
from onceflow.spark.options import OptionError, SinkOptions, SourceOptions, Subscription

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_source_defaults_follow_spark_and_read_committed() -> None:
    stream = SourceOptions.parse({**BASE, "subscribe": "a, b"}, streaming=True)
    batch = SourceOptions.parse({**BASE, "subscribe": "a"}, streaming=False)
    assert stream.subscription.topics == ("a", "b")
    assert stream.starting == "latest" and batch.starting == "earliest"
    assert stream.isolation_level == "read_committed"
    assert stream.client == {
        "bootstrap.servers": "127.0.0.1:9092",
        "isolation.level": "read_committed",
    }


def test_options_are_case_insensitive_as_spark_passes_them_lower_cased() -> None:
    parsed = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "h:1",
            "subscribepattern": "in-.*",
            "maxoffsetspertrigger": "500",
            "startingoffsets": '{"in-1": {"0": -2, "1": 7}}',
            "kafka.isolation.level": "read_uncommitted",
        },
        streaming=True,
    )
    assert parsed.max_offsets_per_trigger == 500
    assert parsed.starting == {("in-1", 0): EARLIEST, ("in-1", 1): 7}
    assert parsed.isolation_level == "read_uncommitted"
    assert parsed.subscription.matches("in-7") and not parsed.subscription.matches("xin-7")


@pytest.mark.parametrize(
    "options",
    [
        {"subscribe": "a"},  # no bootstrap servers
        {**BASE},  # no subscription
        {**BASE, "subscribe": "a", "assign": '{"a": [0]}'},
        {**BASE, "subscribe": "a", "maxOffsetsPerTrigger": "many"},
        {**BASE, "subscribe": "a", "kafka.auto.offset.reset": "latest"},
        {**BASE, "subscribe": "a", "kafka.key.deserializer": "x"},
        {**BASE, "subscribe": "a", "endingOffsets": "latest"},  # streaming has no end
        {**BASE, "subscribePattern": "("},
        {**BASE, "assign": "[0]"},
        {**BASE, "subscribe": "a", "startingOffsets": '{"a": {"0": -3}}'},
    ],
)
def test_bad_source_options_fail_clearly(options: dict[str, str]) -> None:
    with pytest.raises(OptionError):
        SourceOptions.parse(options, streaming=True)


def test_assign_lists_partitions() -> None:
    assert Subscription.parse({"assign": '{"b": [1], "a": [0, 2]}'}).assigned == (
        ("a", 0),
        ("a", 2),
        ("b", 1),
    )


def test_sink_options() -> None:
    parsed = SinkOptions.parse(
        {**BASE, "topic": "out", "transactional.id.prefix": "job-7", "exactlyOnce": "false"}
    )
    assert (parsed.topic, parsed.prefix, parsed.exactly_once) == ("out", "job-7", False)
    assert SinkOptions.parse({**BASE, "topic": "out"}).exactly_once is True
    with pytest.raises(OptionError):
        SinkOptions.parse({**BASE, "kafka.transactional.id": "fixed"})
