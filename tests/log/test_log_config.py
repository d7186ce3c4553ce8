from __future__ import annotations

import pytest

from onceflow.log.config import LogConfig
from onceflow.log.errors import LogConfigError


def test_defaults_are_kafkas():
    config = LogConfig()
    assert config.to_kafka_configs() == {
        "cleanup.policy": "delete",
        "index.interval.bytes": "4096",
        "max.message.bytes": "1048588",
        "message.timestamp.type": "CreateTime",
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
        {"cleanup.policy": "compact"},
        {"cleanup.policy": "compact,delete"},
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
