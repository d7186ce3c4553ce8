"""Broker settings: the log cleaner's and the topic defaults they give, with Kafka's defaults."""

from __future__ import annotations

import pytest

from onceflow.broker.config import BrokerConfig, ConfigError


def test_cleaner_settings_have_kafkas_names_and_defaults():
    settings = BrokerConfig().kafka_settings()
    assert {k: v for k, v in settings.items() if k.startswith("log.clean")} == {
        "log.cleanup.policy": "delete",
        "log.cleaner.enable": "true",
        "log.cleaner.threads": "1",
        "log.cleaner.backoff.ms": "15000",
        "log.cleaner.dedupe.buffer.size": "134217728",
        "log.cleaner.io.buffer.load.factor": "0.9",
        "log.cleaner.min.cleanable.ratio": "0.5",
        "log.cleaner.delete.retention.ms": "86400000",
        "log.cleaner.min.compaction.lag.ms": "0",
        "log.cleaner.max.compaction.lag.ms": "9223372036854775807",
    }


def test_internal_log_segment_sizes_have_kafkas_names_and_defaults():
    settings = BrokerConfig().kafka_settings()
    assert settings["offsets.topic.segment.bytes"] == "10485760"  # a tenth of Kafka's
    assert settings["transaction.state.log.segment.bytes"] == "104857600"
    config = BrokerConfig().with_settings(
        {"offsets.topic.segment.bytes": "4096", "transaction.state.log.segment.bytes": 8192}
    )
    assert config.offsets_topic_segment_bytes == 4096
    assert config.transaction_state_log_segment_bytes == 8192


def test_cleaner_settings_are_read_from_kafka_names():
    config = BrokerConfig().with_settings(
        {
            "log.cleanup.policy": "compact, delete",
            "log.cleaner.enable": "false",
            "log.cleaner.backoff.ms": 100,
            "log.cleaner.min.cleanable.ratio": "0.1",
            "log.cleaner.delete.retention.ms": 5,
        }
    )
    assert config.log_cleanup_policy == "compact, delete"
    assert not config.log_cleaner_enable
    assert config.log_cleaner_backoff_ms == 100
    assert config.log_cleaner_min_cleanable_ratio == 0.1
    assert config.log_cleaner_delete_retention_ms == 5


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"log.cleaner.threads": 2}, "only 1 is accepted"),
        ({"log.cleaner.threads": 0}, "only 1 is accepted"),
        ({"log.cleanup.policy": "compacted"}, "String must be one of: compact, delete"),
        ({"log.cleaner.min.cleanable.ratio": 1.5}, "between 0 and 1"),
        ({"log.cleaner.io.buffer.load.factor": 0}, "load.factor"),
        ({"log.cleaner.dedupe.buffer.size": 1000}, "below the minimum"),
        ({"log.cleaner.backoff.ms": -1}, "below the minimum"),
        ({"log.cleaner.max.compaction.lag.ms": 0}, "below the minimum"),
        ({"offsets.topic.segment.bytes": 13}, "below the minimum"),
        ({"transaction.state.log.segment.bytes": 0}, "below the minimum"),
        ({"num.recovery.threads.per.data.dir": 0}, "below the minimum"),
    ],
)
def test_cleaner_settings_outside_kafkas_ranges_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        BrokerConfig().with_settings(settings)


def test_group_consumer_migration_policy_is_kafkas_setting():
    assert BrokerConfig().kafka_settings()["group.consumer.migration.policy"] == "bidirectional"
    config = BrokerConfig().with_settings({"group.consumer.migration.policy": "Upgrade"})
    assert config.group_consumer_migration_policy == "Upgrade"
    with pytest.raises(ConfigError, match="String must be one of \\(case insensitive\\)"):
        BrokerConfig().with_settings({"group.consumer.migration.policy": "sideways"})
