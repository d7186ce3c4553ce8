"""Group coordinator settings, with Apache Kafka's names and defaults."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields

from onceflow.records.saturating import saturated_multiply

_INT32_MAX = 2**31 - 1


class ConsumerGroupMigrationPolicy(enum.Enum):
    """``group.consumer.migration.policy``: which online conversions between a classic group
    with members and a consumer group are allowed (Kafka's ConsumerGroupMigrationPolicy)."""

    DISABLED = "disabled"
    UPGRADE = "upgrade"
    DOWNGRADE = "downgrade"
    BIDIRECTIONAL = "bidirectional"

    @property
    def upgrade_enabled(self) -> bool:
        return self in (ConsumerGroupMigrationPolicy.UPGRADE, self.BIDIRECTIONAL)

    @property
    def downgrade_enabled(self) -> bool:
        return self in (ConsumerGroupMigrationPolicy.DOWNGRADE, self.BIDIRECTIONAL)

    @classmethod
    def parse(cls, value: str) -> ConsumerGroupMigrationPolicy:
        """Case-insensitive, as Kafka's validator; ValueError names the valid values."""
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            valid = ", ".join(p.value for p in cls)
            raise ValueError(
                f"Invalid value {value} for configuration group.consumer.migration.policy: "
                f"String must be one of (case insensitive): {valid}"
            ) from None


@dataclass(frozen=True)
class GroupCoordinatorConfig:
    """Settings of the classic group coordinator and the committed-offsets store.

    Each field is the Kafka broker property of the same name with dots turned into
    underscores (``group.initial.rebalance.delay.ms`` -> ``group_initial_rebalance_delay_ms``).
    """

    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    group_max_size: int = _INT32_MAX
    group_initial_rebalance_delay_ms: int = 3_000
    # Not a Kafka property (a constant there): how long a new member may wait in a JoinGroup
    # before the coordinator gives up on it; it cannot heartbeat before it knows its member id.
    new_member_join_timeout_ms: int = 300_000
    # KIP-848 consumer groups (group.protocol=consumer).
    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_max_size: int = _INT32_MAX
    # Kafka 4's default: classic groups with members upgrade, and consumer groups left with
    # classic members only downgrade, online.
    group_consumer_migration_policy: str = ConsumerGroupMigrationPolicy.BIDIRECTIONAL.value
    offset_metadata_max_bytes: int = 4_096
    offsets_retention_ms: int = 7 * 24 * 60 * 60 * 1000
    offsets_retention_check_interval_ms: int = 600_000

    def __post_init__(self) -> None:
        ConsumerGroupMigrationPolicy.parse(self.group_consumer_migration_policy)

    @property
    def migration_policy(self) -> ConsumerGroupMigrationPolicy:
        return ConsumerGroupMigrationPolicy.parse(self.group_consumer_migration_policy)

    @classmethod
    def from_properties(cls, props: Mapping[str, str | int]) -> GroupCoordinatorConfig:
        """Build from Kafka-style properties; unknown keys are left to other components."""
        known = {f.name for f in fields(cls)}
        values: dict[str, int | str] = {}
        for key, value in props.items():
            name = key.replace(".", "_")
            if name == "group_consumer_migration_policy":
                values[name] = ConsumerGroupMigrationPolicy.parse(str(value)).value
            elif name in known:
                values[name] = int(value)
        # Kafka names the retention in minutes; accept it as well.
        if "offsets.retention.minutes" in props and "offsets_retention_ms" not in values:
            minutes = int(props["offsets.retention.minutes"])
            values["offsets_retention_ms"] = saturated_multiply(minutes, 60_000)
        return cls(**values)  # type: ignore[arg-type]
