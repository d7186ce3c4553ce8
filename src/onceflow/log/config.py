"""Topic-level log settings, under Kafka's names and with Kafka's defaults.

Every topic config Kafka defines is checked as Kafka's LogConfig ConfigDef checks it (its type,
then its validator), whether or not the log acts on it, so a value Kafka refuses with
INVALID_CONFIG is refused here too instead of being stored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from onceflow.log.errors import LogConfigError

CREATE_TIME = "CreateTime"
_INT32_MAX = (1 << 31) - 1
_INT32_MIN = -(1 << 31)
_INT64_MAX = (1 << 63) - 1
_INT64_MIN = -(1 << 63)
LOG_APPEND_TIME = "LogAppendTime"

# Java's parseInt/parseLong after trim(): an optional sign and ASCII digits. Python's int()
# would also take "1_000", "٣" and other spellings Kafka's clients never send.
_INTEGER = re.compile(r"[+-]?[0-9]+")
# Java's Double.parseDouble, without its hexadecimal, NaN and Infinity spellings.
_DOUBLE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?")
_THROTTLED_REPLICA = re.compile(r"[0-9]+:[0-9]+")

Check = Callable[[str, str], None]


def _java_trim(raw: str) -> str:
    # String.trim() strips every char <= U+0020, not only whitespace.
    return raw.strip("".join(map(chr, range(33))))


def _invalid(value: object, name: str, reason: str) -> LogConfigError:
    """Kafka's ConfigException(name, value, message): its message names the value and setting."""
    return LogConfigError(f"Invalid value {value} for configuration {name}: {reason}")


def _integer(name: str, raw: str, low: int, high: int, kind: str) -> int:
    text = _java_trim(raw)
    if not _INTEGER.fullmatch(text):
        raise _invalid(raw, name, f"Not a number of type {kind}")
    value = int(text)
    if not low <= value <= high:
        raise _invalid(raw, name, f"Not a number of type {kind}")
    return value


def parse_int(name: str, raw: str) -> int:
    return _integer(name, raw, _INT32_MIN, _INT32_MAX, "INT")


def parse_long(name: str, raw: str) -> int:
    return _integer(name, raw, _INT64_MIN, _INT64_MAX, "LONG")


def _at_least_check(parse: Callable[[str, str], int], minimum: int) -> Check:
    def check(name: str, raw: str) -> None:
        value = parse(name, raw)
        if value < minimum:
            raise _invalid(value, name, f"Value must be at least {minimum}")

    return check


def _between_check(minimum: int, maximum: int) -> Check:
    def check(name: str, raw: str) -> None:
        value = parse_int(name, raw)
        if not minimum <= value <= maximum:
            raise _invalid(
                value, name, f"Value must be no less than {minimum} and no more than {maximum}"
            )

    return check


def _gzip_level(name: str, raw: str) -> None:
    value = parse_int(name, raw)
    if value != -1 and not 1 <= value <= 9:
        raise _invalid(value, name, "Value must be -1 (the default) or between 1 and 9")


def _boolean(name: str, raw: str) -> None:
    if _java_trim(raw).lower() not in ("true", "false"):
        raise _invalid(raw, name, "Expected value to be either true or false")


def parse_ratio(name: str, raw: str) -> float:
    """A DOUBLE setting between 0 and 1 (ConfigDef.Range.between(0, 1))."""
    text = _java_trim(raw)
    if not _DOUBLE.fullmatch(text):
        raise _invalid(raw, name, "Not a number of type DOUBLE")
    value = float(text.rstrip("fFdD"))
    if not (math.isfinite(value) and 0 <= value <= 1):
        raise _invalid(value, name, "Value must be no less than 0 and no more than 1")
    return value


# ConfigDef's LIST parsing: the trimmed value split on commas with the blanks around them.
_LIST_SEPARATOR = re.compile(r"[ \t\n\x0b\f\r]*,[ \t\n\x0b\f\r]*")
CLEANUP_POLICIES = ("compact", "delete")


def parse_cleanup_policy(name: str, raw: str) -> tuple[str, ...]:
    """cleanup.policy as Kafka's ValidList.in("compact", "delete") accepts it: the two in any
    order and spacing, each at most once; an empty list is allowed (neither: keep everything)."""
    text = _java_trim(raw)
    policies = tuple(_LIST_SEPARATOR.split(text)) if text else ()
    if len(set(policies)) != len(policies):
        raise LogConfigError(f"Configuration '{name}' values must not be duplicated.")
    for policy in policies:
        if not policy:
            raise LogConfigError(f"Configuration '{name}' values must not be empty.")
        if policy not in CLEANUP_POLICIES:
            raise _invalid(policy, name, f"String must be one of: {', '.join(CLEANUP_POLICIES)}")
    return policies


def _one_of(*allowed: str) -> Check:
    def check(name: str, raw: str) -> None:
        # ConfigDef.ValidString is case-sensitive and sees the trimmed value.
        if _java_trim(raw) not in allowed:
            raise _invalid(raw, name, f"String must be one of: {', '.join(allowed)}")

    return check


def _throttled_replicas(name: str, raw: str) -> None:
    items = [_java_trim(item) for item in raw.split(",")] if _java_trim(raw) else []
    if items == ["*"] or all(_THROTTLED_REPLICA.fullmatch(item) for item in items):
        return
    raise _invalid(
        raw,
        name,
        "must be the literal '*' or a list of "
        "replicas in the following format: [partitionId]:[brokerId],[partitionId]:[brokerId],...",
    )


def _any_string(name: str, raw: str) -> None:
    return None


# Topic configs Kafka defines that the log does not act on: accepted (clients set them when
# creating topics) and kept, after Kafka's check of their type and range. A name outside this
# table and the ones the log parses is refused, as LogConfig.validateNames refuses it.
_KAFKA_TOPIC_CONFIGS_NOT_USED_BY_THE_LOG: dict[str, Check] = {
    "compression.type": _one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
    "compression.gzip.level": _gzip_level,
    "compression.lz4.level": _between_check(1, 17),
    "compression.zstd.level": _between_check(-131072, 22),
    "file.delete.delay.ms": _at_least_check(parse_long, 0),
    "flush.messages": _at_least_check(parse_long, 1),
    "flush.ms": _at_least_check(parse_long, 0),
    "follower.replication.throttled.replicas": _throttled_replicas,
    "leader.replication.throttled.replicas": _throttled_replicas,
    "local.retention.bytes": _at_least_check(parse_long, -2),
    "local.retention.ms": _at_least_check(parse_long, -2),
    "message.downconversion.enable": _boolean,  # removed in Kafka 4.0; kept for 3.x clients
    "message.format.version": _any_string,  # removed in Kafka 4.0; ignored by 3.x brokers
    "message.timestamp.after.max.ms": _at_least_check(parse_long, 0),
    "message.timestamp.before.max.ms": _at_least_check(parse_long, 0),
    "message.timestamp.difference.max.ms": _at_least_check(parse_long, 0),  # 3.x
    "min.insync.replicas": _at_least_check(parse_int, 1),
    "preallocate": _boolean,
    "remote.log.copy.disable": _boolean,
    "remote.log.delete.on.disable": _boolean,
    "remote.storage.enable": _boolean,
    "segment.jitter.ms": _at_least_check(parse_long, 0),
    "unclean.leader.election.enable": _boolean,
}


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
    # cleanup.policy, in the order given. Until the log cleaner runs, `compact` only makes
    # Produce refuse keyless records: retention deletes segments only when `delete` is in the
    # policy (as Kafka's), so a `compact`-only topic keeps everything, uncompacted.
    cleanup_policy: tuple[str, ...] = ("delete",)
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = _INT64_MAX  # max.compaction.lag.ms
    delete_retention_ms: int = 24 * 3600 * 1000  # delete.retention.ms (tombstones)

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
        _at_least("min.compaction.lag.ms", self.min_compaction_lag_ms, 0)
        _at_least("max.compaction.lag.ms", self.max_compaction_lag_ms, 1)
        _at_least("delete.retention.ms", self.delete_retention_ms, 0)
        if not 0 <= self.min_cleanable_dirty_ratio <= 1:
            raise LogConfigError(
                f"min.cleanable.dirty.ratio={self.min_cleanable_dirty_ratio} is not in [0, 1]"
            )
        if not set(self.cleanup_policy) <= set(CLEANUP_POLICIES):
            raise LogConfigError(f"cleanup.policy={self.cleanup_policy!r} is not Kafka's")
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            # LogConfig.validateValues: Kafka refuses the pair, not either value alone.
            raise LogConfigError(
                "conflict topic config setting min.compaction.lag.ms "
                f"({self.min_compaction_lag_ms}) > max.compaction.lag.ms "
                f"({self.max_compaction_lag_ms})"
            )
        if self.message_timestamp_type not in (CREATE_TIME, LOG_APPEND_TIME):
            raise LogConfigError(
                f"message.timestamp.type must be {CREATE_TIME} or {LOG_APPEND_TIME}, "
                f"not {self.message_timestamp_type!r}"
            )

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == LOG_APPEND_TIME

    @property
    def compact(self) -> bool:
        """Kafka's LogConfig.compact: the topic refuses keyless records (and is cleaned)."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """Kafka's LogConfig.delete: retention.ms / retention.bytes delete old segments."""
        return "delete" in self.cleanup_policy

    @classmethod
    def from_kafka_configs(
        cls, configs: Mapping[str, str | None], base: LogConfig | None = None
    ) -> LogConfig:
        """Parse topic-level configs (CreateTopics/AlterConfigs) over `base` (default: Kafka's).

        A None value means "use the default". Raises LogConfigError for an unknown name or a
        value Kafka refuses (INVALID_CONFIG at the edge).
        """
        base = base if base is not None else cls()
        values: dict[str, object] = {}
        for name, raw in configs.items():
            if raw is None:
                continue
            if name in _INT_FIELDS:
                field, parse = _INT_FIELDS[name]
                values[field] = parse(name, raw)
            elif name == "message.timestamp.type":
                values["message_timestamp_type"] = _java_trim(raw)
            elif name == "cleanup.policy":
                values["cleanup_policy"] = parse_cleanup_policy(name, raw)
            elif name == "min.cleanable.dirty.ratio":
                values["min_cleanable_dirty_ratio"] = parse_ratio(name, raw)
            elif name in _KAFKA_TOPIC_CONFIGS_NOT_USED_BY_THE_LOG:
                _KAFKA_TOPIC_CONFIGS_NOT_USED_BY_THE_LOG[name](name, raw)
            else:
                raise LogConfigError(f"Unknown topic config name: {name}")
        fields = {f: getattr(base, f) for f in cls.__dataclass_fields__}
        fields.update(values)
        return cls(**fields)  # type: ignore[arg-type]

    def to_kafka_configs(self) -> dict[str, str]:
        """The settings under Kafka's topic-level names, as DescribeConfigs reports them."""
        configs = {name: str(getattr(self, field)) for name, (field, _) in _INT_FIELDS.items()}
        configs["message.timestamp.type"] = self.message_timestamp_type
        configs["cleanup.policy"] = ",".join(self.cleanup_policy)
        configs["min.cleanable.dirty.ratio"] = str(self.min_cleanable_dirty_ratio)
        return dict(sorted(configs.items()))


# Kafka's type for each: INT settings refuse what does not fit 32 bits, LONG ones 64 bits.
_INT_FIELDS: dict[str, tuple[str, Callable[[str, str], int]]] = {
    "segment.bytes": ("segment_bytes", parse_int),
    "segment.ms": ("segment_ms", parse_long),
    "retention.ms": ("retention_ms", parse_long),
    "retention.bytes": ("retention_bytes", parse_long),
    "index.interval.bytes": ("index_interval_bytes", parse_int),
    "segment.index.bytes": ("segment_index_bytes", parse_int),
    "max.message.bytes": ("max_message_bytes", parse_int),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", parse_long),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", parse_long),
    "delete.retention.ms": ("delete_retention_ms", parse_long),
}


def _at_least(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LogConfigError(f"{name} must be an integer, not {value!r}")
    if value < minimum:
        raise LogConfigError(f"{name}={value} is below the minimum {minimum}")
