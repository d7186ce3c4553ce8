"""Kafka-style properties map onto the coordinator's settings."""

from __future__ import annotations

from onceflow.groups.config import GroupCoordinatorConfig


def test_from_properties_uses_kafka_names_and_ignores_others() -> None:
    cfg = GroupCoordinatorConfig.from_properties(
        {
            "group.initial.rebalance.delay.ms": "0",
            "group.max.size": 10,
            "offsets.retention.minutes": "60",
            "group.consumer.assignors": "uniform,range",  # not ours: ignored
        }
    )
    assert cfg.group_initial_rebalance_delay_ms == 0
    assert cfg.group_max_size == 10
    assert cfg.offsets_retention_ms == 3_600_000
    assert cfg.group_min_session_timeout_ms == 6_000  # Kafka's default
