"""Spark Kafka option names, parsed into what the onceflow source and sinks need.

Options keep the names of Spark's Kafka connector (`kafka.bootstrap.servers`, `subscribe`,
`startingOffsets`, ...): `kafka.`-prefixed ones go to the client (librdkafka, whose names match
the Java client's for everything a pipeline normally sets). Spark hands Python data sources
their options with lower-cased keys, so every look-up here is case-insensitive.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from onceflow.spark.offset_ranges import (
    EARLIEST,
    LATEST,
    OffsetSpecError,
    PartitionOffsets,
    TopicPartitionKey,
    from_spark_json,
)

CLIENT_PREFIX = "kafka."

# Settings the source or sink owns, or that only mean something to the Java client.
_SOURCE_OWNED = ("enable.auto.commit", "auto.offset.reset")
_JAVA_ONLY = (
    "key.deserializer",
    "value.deserializer",
    "key.serializer",
    "value.serializer",
    "interceptor.classes",
)


class OptionError(ValueError):
    """An option is missing, unknown in that position, or malformed."""


def option(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """The value of `name`, matched without regard to case (Spark lower-cases keys)."""
    wanted = name.lower()
    for key, value in options.items():
        if key.lower() == wanted:
            return value
    return default


def _int_option(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = option(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise OptionError(f"option {name!r} must be an integer, got {raw!r}") from exc
    if value < 0:
        raise OptionError(f"option {name!r} must not be negative, got {value}")
    return value


def _bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = option(options, name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"option {name!r} must be true or false, got {raw!r}")
    return lowered == "true"


def client_config(options: Mapping[str, str], *, owned: tuple[str, ...] = ()) -> dict[str, str]:
    """The `kafka.`-prefixed options with the prefix removed: the client's configuration."""
    conf = {
        key[len(CLIENT_PREFIX) :].lower(): value
        for key, value in options.items()
        if key.lower().startswith(CLIENT_PREFIX)
    }
    if not conf.get("bootstrap.servers"):
        raise OptionError("option 'kafka.bootstrap.servers' is required")
    for name in (*owned, *_JAVA_ONLY):
        if name in conf:
            raise OptionError(
                f"option 'kafka.{name}' is not supported: onceflow sets it itself "
                "(or it only applies to the Java client)"
            )
    return conf


@dataclass(frozen=True)
class Subscription:
    """Which partitions a source reads: exactly one of subscribe, subscribePattern, assign."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartitionKey, ...] = ()

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            # Java's Pattern.matches, as Spark uses: the whole name must match
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Subscription:
        given = {
            name: option(options, name)
            for name in ("subscribe", "subscribePattern", "assign")
            if option(options, name) is not None
        }
        if len(given) != 1:
            raise OptionError(
                "exactly one of the options 'subscribe', 'subscribePattern' or 'assign' "
                f"is required, got {sorted(given) or 'none'}"
            )
        name, value = next(iter(given.items()))
        assert value is not None
        if name == "subscribe":
            topics = tuple(t.strip() for t in value.split(",") if t.strip())
            if not topics:
                raise OptionError("option 'subscribe' names no topic")
            return cls(topics=topics)
        if name == "subscribePattern":
            try:
                re.compile(value)
            except re.error as exc:
                raise OptionError(f"option 'subscribePattern' is not a regex: {exc}") from exc
            return cls(pattern=value)
        try:
            parsed = json.loads(value)
            assigned = tuple(sorted((str(t), int(p)) for t, parts in parsed.items() for p in parts))
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            raise OptionError(
                f"option 'assign' must look like {{\"topicA\": [0, 1]}}, got {value!r}"
            ) from exc
        if not assigned:
            raise OptionError("option 'assign' names no partition")
        return cls(assigned=assigned)


OffsetSpec = str | PartitionOffsets
"""'earliest', 'latest', or explicit offsets per partition (-2 earliest, -1 latest)."""


def _offset_spec(
    options: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]
) -> OffsetSpec:
    raw = (option(options, name) or default).strip()
    if raw.lower() in allowed:
        return raw.lower()
    try:
        spec = from_spark_json(raw)
    except OffsetSpecError as exc:
        raise OptionError(f"option {name!r}: {exc}") from exc
    for (topic, partition), offset in spec.items():
        if offset < EARLIEST or (offset == EARLIEST and "earliest" not in allowed):
            raise OptionError(f"option {name!r}: offset {offset} of {topic}/{partition}")
        if offset == LATEST and "latest" not in allowed:
            raise OptionError(f"option {name!r}: offset {offset} of {topic}/{partition}")
    return spec


@dataclass(frozen=True)
class SourceOptions:
    client: dict[str, str]
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000
    fetch_offset_retries: int = 3
    fetch_offset_retry_interval_ms: int = 1_000
    request_timeout_s: float = 30.0
    # Kafka's default.api.timeout.ms: how long one attempt of a look-up waits out a
    # restarting broker (Spark's source asks the Java AdminClient, which retries so long)
    api_timeout_s: float = 60.0

    @property
    def isolation_level(self) -> str:
        return self.client.get("isolation.level", "read_committed")

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        client = client_config(options, owned=_SOURCE_OWNED)
        client.setdefault("isolation.level", "read_committed")
        if client["isolation.level"] not in ("read_committed", "read_uncommitted"):
            raise OptionError(
                "option 'kafka.isolation.level' must be read_committed or read_uncommitted"
            )
        if streaming and option(options, "endingOffsets") is not None:
            raise OptionError("option 'endingOffsets' is for batch reads only (as in Spark)")
        min_partitions = _int_option(options, "minPartitions", None)
        if min_partitions == 0:
            raise OptionError("option 'minPartitions' must be positive")
        max_offsets = _int_option(options, "maxOffsetsPerTrigger", None)
        if max_offsets == 0:
            raise OptionError("option 'maxOffsetsPerTrigger' must be positive")
        return cls(
            client=client,
            subscription=Subscription.parse(options),
            # Spark's defaults: streams start at latest, batch reads at earliest
            starting=_offset_spec(
                options,
                "startingOffsets",
                "latest" if streaming else "earliest",
                ("earliest", "latest"),
            ),
            ending=_offset_spec(options, "endingOffsets", "latest", ("latest",)),
            max_offsets_per_trigger=max_offsets,
            min_partitions=min_partitions,
            include_headers=_bool_option(options, "includeHeaders", False),
            fail_on_data_loss=_bool_option(options, "failOnDataLoss", True),
            poll_timeout_ms=_int_option(options, "kafkaConsumer.pollTimeoutMs", 120_000) or 1,
            fetch_offset_retries=_int_option(options, "fetchOffset.numRetries", 3) or 0,
            fetch_offset_retry_interval_ms=_int_option(options, "fetchOffset.retryIntervalMs", 1000)
            or 0,
        )


@dataclass(frozen=True)
class SinkOptions:
    client: dict[str, str]
    topic: str | None
    prefix: str | None
    exactly_once: bool
    timeout_s: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        client = client_config(options)
        if "transactional.id" in client:
            raise OptionError(
                "option 'kafka.transactional.id' is not supported: each write task derives "
                "its own from 'transactional.id.prefix'"
            )
        prefix = option(options, "transactional.id.prefix")
        if prefix is not None and not prefix.strip():
            raise OptionError("option 'transactional.id.prefix' is empty")
        timeout_ms = _int_option(options, "kafka.transaction.timeout.ms", 60_000) or 60_000
        return cls(
            client=client,
            topic=option(options, "topic"),
            prefix=prefix,
            exactly_once=_bool_option(options, "exactlyOnce", True),
            # a blocking client call waits at most this long: the broker would abort the
            # transaction at its timeout anyway
            timeout_s=timeout_ms / 1000.0,
        )
