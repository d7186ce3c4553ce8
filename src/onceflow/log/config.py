"""Topic-level log settings, under Kafka's names and with Kafka's defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from onceflow.log.errors import LogConfigError

CREATE_TIME = "CreateTime"
_INT32_MAX = (1 << 31) - 1
LOG_APPEND_TIME = "LogAppendTime"

# Topic configs Kafka defines that the log does not act on: accepted (clients set them when
# creating topics) but not kept. Anything outside this set and the ones parsed below is
# rejected, as Kafka rejects an unknown topic config name.
_KAFKA_TOPIC_CONFIGS_NOT_USED_BY_THE_LOG = frozenset(
    {
        "compression.type",
        "compression.gzip.level",
        "compression.lz4.level",
        "compression.zstd.level",
        "delete.retention.ms",
        "file.delete.delay.ms",
        "flush.messages",
        "flush.ms",
        "follower.replication.throttled.replicas",
        "leader.replication.throttled.replicas",
        "local.retention.bytes",
        "local.retention.ms",
        "max.compaction.lag.ms",
        "message.downconversion.enable",
        "message.format.version",
        "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.difference.max.ms",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "min.insync.replicas",
        "preallocate",
        "remote.log.copy.disable",
        "remote.log.delete.on.disable",
        "remote.storage.enable",
        "segment.jitter.ms",
        "unclean.leader.election.enable",
    }
)


@dataclass(frozen=True)
class LogConfig:
    """Settings of one partition's log. Defaults are Kafka's."""

    segment_bytes: int = 1 << 30  # segment.bytes (broker: log.segment.bytes)
    segment_ms: int = 7 * 24 * 3600 * 1000  # segment.ms (broker: log.roll.ms)
    retention_ms: int = 7 * 24 * 3600 * 1000  # retention.ms, -1 = forever
    retention_bytes: int = -1  # retention.bytes, -1 = no size limit
    index_interval_bytes: int = 4096  # index.interval.bytes
    segment_index_bytes: int = 10 * 1024 * 1024  # segment.index.bytes
    message_timestamp_type: str = CREATE_TIME  # message.timestamp.type
    max_message_bytes: int = 1024 * 1024 + 12  # max.message.bytes (checked by the broker)

    def __post_init__(self) -> None:
        # Kafka's lower bounds for the same settings (LogConfig's validators).
        _at_least("segment.bytes", self.segment_bytes, 14)
        # Index positions are int32, so a segment file can never pass 2 GiB.
        if self.segment_bytes > _INT32_MAX:
            raise LogConfigError(f"segment.bytes={self.segment_bytes} is above {_INT32_MAX}")
        _at_least("segment.ms", self.segment_ms, 1)
        _at_least("retention.ms", self.retention_ms, -1)
        _at_least("retention.bytes", self.retention_bytes, -1)
        _at_least("index.interval.bytes", self.index_interval_bytes, 0)
        _at_least("segment.index.bytes", self.segment_index_bytes, 4)
        _at_least("max.message.bytes", self.max_message_bytes, 0)
        if self.message_timestamp_type not in (CREATE_TIME, LOG_APPEND_TIME):
            raise LogConfigError(
                f"message.timestamp.type must be {CREATE_TIME} or {LOG_APPEND_TIME}, "
                f"not {self.message_timestamp_type!r}"
            )

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == LOG_APPEND_TIME

    @classmethod
    def from_kafka_configs(
        cls, configs: Mapping[str, str | None], base: LogConfig | None = None
    ) -> LogConfig:
        """Parse topic-level configs (CreateTopics/AlterConfigs) over `base` (default: Kafka's).

        A None value means "use the default". Raises LogConfigError for an unknown name, a
        bad value, or a cleanup.policy other than "delete" (compaction is not implemented).
        """
        base = base if base is not None else cls()
        values: dict[str, object] = {}
        for name, raw in configs.items():
            if raw is None:
                continue
            if name in _INT_FIELDS:
                values[_INT_FIELDS[name]] = _parse_int(name, raw)
            elif name == "message.timestamp.type":
                values["message_timestamp_type"] = raw.strip()
            elif name == "cleanup.policy":
                policies = {p.strip().lower() for p in raw.split(",") if p.strip()}
                if policies != {"delete"}:
                    raise LogConfigError(
                        f"cleanup.policy={raw!r} is not supported: only 'delete' is"
                    )
            elif name not in _KAFKA_TOPIC_CONFIGS_NOT_USED_BY_THE_LOG:
                raise LogConfigError(f"unknown topic config name: {name}")
        fields = {f: getattr(base, f) for f in cls.__dataclass_fields__}
        fields.update(values)
        return cls(**fields)  # type: ignore[arg-type]

    def to_kafka_configs(self) -> dict[str, str]:
        """The settings under Kafka's topic-level names, as DescribeConfigs reports them."""
        configs = {name: str(getattr(self, field)) for name, field in _INT_FIELDS.items()}
        configs["message.timestamp.type"] = self.message_timestamp_type
        configs["cleanup.policy"] = "delete"
        return dict(sorted(configs.items()))


_INT_FIELDS = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "segment.index.bytes": "segment_index_bytes",
    "max.message.bytes": "max_message_bytes",
}


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise LogConfigError(f"{name}={raw!r} is not an integer") from None


def _at_least(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LogConfigError(f"{name} must be an integer, not {value!r}")
    if value < minimum:
        raise LogConfigError(f"{name}={value} is below the minimum {minimum}")
