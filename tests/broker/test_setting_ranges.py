"""Broker settings past Kafka's widest type (LONG) are refused at start, as Kafka's ConfigDef
refuses them, instead of becoming topic defaults that fail every CreateTopics later (a
`log.retention.hours` of 2^62 made `retention.ms` 1.7e25: "Not a number of type LONG")."""

from __future__ import annotations

import pytest

from onceflow.broker.config import BrokerConfig, ConfigError
from onceflow.records.varint import INT64_MAX


@pytest.mark.parametrize(
    ("name", "value", "kafka_type"),
    [
        ("log.cleaner.delete.retention.ms", str(INT64_MAX + 1), "LONG"),
        ("log.retention.ms", str(-(1 << 70)), "LONG"),
        ("log.retention.hours", str(1 << 62), "INT"),  # Kafka's INT, then * 3,600,000
        ("log.retention.hours", str(1 << 31), "INT"),
    ],
)
def test_a_setting_past_its_kafka_type_is_refused(name: str, value: str, kafka_type: str) -> None:
    with pytest.raises(ConfigError, match=f"{name}.*not a number of type {kafka_type}"):
        BrokerConfig().with_settings({name: value})


def test_the_largest_values_kafka_accepts_are_accepted() -> None:
    config = BrokerConfig().with_settings(
        {"log.cleaner.delete.retention.ms": str(INT64_MAX), "log.retention.hours": "2147483647"}
    )
    assert config.log_cleaner_delete_retention_ms == INT64_MAX
    assert config.log_retention_ms == 2_147_483_647 * 3_600_000  # fits a LONG
