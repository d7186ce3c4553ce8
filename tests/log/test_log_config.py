from __future__ import annotations

import pytest

from onceflow.log.config import LogConfig
from onceflow.log.errors import LogConfigError


def test_defaults_are_kafkas():
    config = LogConfig()
    assert config.to_kafka_configs() == {
        "cleanup.policy": "delete",
        "delete.retention.ms": "86400000",
        "index.interval.bytes": "4096",
        "max.compaction.lag.ms": "9223372036854775807",
        "max.message.bytes": "1048588",
        "message.timestamp.type": "CreateTime",
        "min.cleanable.dirty.ratio": "0.5",
        "min.compaction.lag.ms": "0",
        "retention.bytes": "-1",
        "retention.ms": "604800000",
        "segment.bytes": "1073741824",
        "segment.index.bytes": "10485760",
        "segment.ms": "604800000",
    }


def test_parses_kafka_topic_configs_and_round_trips():
    config = LogConfig.from_kafka_configs(
        {
            "segment.bytes": "1048576",
            "segment.ms": "60000",
            "retention.ms": "-1",
            "retention.bytes": "5000000",
            "message.timestamp.type": "LogAppendTime",
            "cleanup.policy": "delete",
            "max.message.bytes": "2000000",
            "min.insync.replicas": "1",  # a Kafka topic config the log does not use
            "index.interval.bytes": None,  # None = default
        }
    )
    assert config.segment_bytes == 1 << 20 and config.segment_ms == 60000
    assert config.retention_ms == -1 and config.retention_bytes == 5_000_000
    assert config.log_append_time and config.max_message_bytes == 2_000_000
    assert config.index_interval_bytes == 4096
    assert LogConfig.from_kafka_configs(config.to_kafka_configs()) == config


def test_parses_over_a_base():
    base = LogConfig(segment_bytes=1000)
    assert LogConfig.from_kafka_configs({"retention.ms": "5"}, base).segment_bytes == 1000


@pytest.mark.parametrize(
    "configs",
    [
        {"no.such.config": "1"},
        {"segment.bytes": "big"},
        {"segment.bytes": "10"},
        {"segment.bytes": str(1 << 31)},
        {"retention.ms": "-2"},
        {"segment.ms": "0"},
        {"message.timestamp.type": "WallClock"},
    ],
)
def test_rejects_what_the_log_cannot_honour(configs):
    with pytest.raises(LogConfigError) as raised:
        LogConfig.from_kafka_configs(configs)
    assert isinstance(raised.value, ValueError)  # callers may catch ValueError


@pytest.mark.parametrize(
    ("raw", "policy"),
    [
        ("delete", ("delete",)),
        ("compact", ("compact",)),
        ("compact,delete", ("compact", "delete")),
        ("delete,compact", ("delete", "compact")),
        (" compact ,\tdelete ", ("compact", "delete")),
        ("", ()),  # ValidList.in allows the empty list: neither deleted nor compacted
    ],
)
def test_cleanup_policy_as_kafkas_validator_accepts_it(raw, policy):
    config = LogConfig.from_kafka_configs({"cleanup.policy": raw})
    assert config.cleanup_policy == policy
    assert config.compact == ("compact" in policy)
    assert config.delete == ("delete" in policy)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("Compact", "String must be one of: compact, delete"),
        ("compact;delete", "String must be one of: compact, delete"),
        ("compact,", "values must not be empty"),
        ("compact,,delete", "values must not be empty"),
        ("delete,delete", "values must not be duplicated"),
    ],
)
def test_cleanup_policy_refusals(raw, message):
    with pytest.raises(LogConfigError, match=message):
        LogConfig.from_kafka_configs({"cleanup.policy": raw})


def test_compaction_settings_are_parsed_with_kafkas_types_and_ranges():
    config = LogConfig.from_kafka_configs(
        {
            "min.cleanable.dirty.ratio": "0.25",
            "min.compaction.lag.ms": "1000",
            "max.compaction.lag.ms": "60000",
            "delete.retention.ms": "0",
        }
    )
    assert config.min_cleanable_dirty_ratio == 0.25
    assert config.min_compaction_lag_ms == 1000 and config.max_compaction_lag_ms == 60000
    assert config.delete_retention_ms == 0
    assert LogConfig.from_kafka_configs(config.to_kafka_configs()) == config


@pytest.mark.parametrize(
    "configs",
    [
        {"min.cleanable.dirty.ratio": "1.5"},
        {"min.cleanable.dirty.ratio": "NaN"},
        {"min.compaction.lag.ms": "-1"},
        {"max.compaction.lag.ms": "0"},
        {"delete.retention.ms": "-1"},
        {"delete.retention.ms": str(1 << 63)},  # LONG
        # LogConfig.validateValues: the pair conflicts
        {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"},
    ],
)
def test_compaction_settings_refusals(configs):
    with pytest.raises(LogConfigError):
        LogConfig.from_kafka_configs(configs)
