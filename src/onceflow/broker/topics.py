"""The topic registry: names, topic ids, partition logs, topic-level configs, all durable.

`topics.json` in the data directory is the source of truth, replaced atomically; a partition
directory not named in it (a crash between creating directories and recording the topic, or
during a delete) is removed on start.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from onceflow.broker.config import BrokerConfig
from onceflow.broker.partition import Partition
from onceflow.clock import Clock
from onceflow.log.config import LogConfig

log = logging.getLogger(__name__)

_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_NAME_LENGTH = 249
INTERNAL_PREFIX = "__"

# Broker-level defaults and the topic-level settings they provide defaults for.
_BROKER_TO_TOPIC = {
    "log_segment_bytes": "segment.bytes",
    "log_roll_ms": "segment.ms",
    "log_retention_ms": "retention.ms",
    "log_retention_bytes": "retention.bytes",
    "log_index_interval_bytes": "index.interval.bytes",
    "log_message_timestamp_type": "message.timestamp.type",
    "message_max_bytes": "max.message.bytes",
}


class TopicError(Exception):
    """Base of topic registry errors; each maps to one Kafka error code."""


class TopicExistsError(TopicError):
    pass


class InvalidTopicError(TopicError):
    pass


class UnknownTopicError(TopicError):
    pass


class InvalidPartitionsError(TopicError):
    pass


class InvalidConfigError(TopicError):
    pass


class InvalidReplicationError(TopicError):
    pass


@dataclass(eq=False)
class Topic:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]
    partitions: list[Partition]


def validate_topic_name(name: str) -> None:
    if not name or name in (".", ".."):
        raise InvalidTopicError(f"topic name {name!r} is illegal")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidTopicError(f"topic name is longer than {MAX_NAME_LENGTH} characters")
    if not _LEGAL_NAME.match(name):
        raise InvalidTopicError(
            f"topic name {name!r} has characters other than ASCII alphanumerics, '.', '_', '-'"
        )
    if name.startswith(INTERNAL_PREFIX):
        raise InvalidTopicError(f"topic names starting with {INTERNAL_PREFIX!r} are internal")


class TopicRegistry:
    def __init__(self, config: BrokerConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.data_dir = config.data_dir
        self._topics: dict[str, Topic] = {}
        self._by_id: dict[uuid.UUID, Topic] = {}

    # -- configuration ---------------------------------------------------------------------

    def default_topic_configs(self) -> dict[str, str]:
        return {topic: str(getattr(self.config, attr)) for attr, topic in _BROKER_TO_TOPIC.items()}

    def effective_configs(self, overrides: dict[str, str]) -> dict[str, str]:
        """Every topic-level setting with its value: the topic's own, else the broker's."""
        return {**self.default_topic_configs(), "cleanup.policy": "delete", **overrides}

    def log_config(self, overrides: dict[str, str]) -> LogConfig:
        try:
            return LogConfig.from_kafka_configs({**self.default_topic_configs(), **overrides})
        except ValueError as e:
            raise InvalidConfigError(str(e)) from None

    # -- lifecycle --------------------------------------------------------------------------

    def load(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / "topics.json"
        stored = json.loads(path.read_text())["topics"] if path.exists() else {}
        for name, meta in stored.items():
            topic = Topic(name, uuid.UUID(meta["id"]), dict(meta["configs"]), [])
            log_config = self.log_config(topic.configs)
            for index in range(meta["partitions"]):
                topic.partitions.append(self._open_partition(name, index, log_config))
            self._add(topic)
        self._remove_orphans()

    def close(self) -> None:
        for topic in self._topics.values():
            for partition in topic.partitions:
                partition.close()

    def _open_partition(self, name: str, index: int, log_config: LogConfig) -> Partition:
        return Partition.open(
            name,
            index,
            self.data_dir / f"{name}-{index}",
            log_config,
            self.clock,
            self.config.producer_id_expiration_ms,
        )

    def _remove_orphans(self) -> None:
        known = {f"{t.name}-{p.index}" for t in self._topics.values() for p in t.partitions}
        for entry in self.data_dir.iterdir():
            if not entry.is_dir() or entry.name.startswith(INTERNAL_PREFIX):
                continue
            if re.match(r"^.+-\d+$", entry.name) and entry.name not in known:
                log.info("removing partition directory %s not in topics.json", entry.name)
                shutil.rmtree(entry, ignore_errors=True)

    def _save(self) -> None:
        payload = {
            "topics": {
                t.name: {
                    "id": str(t.topic_id),
                    "partitions": len(t.partitions),
                    "configs": t.configs,
                }
                for t in self._topics.values()
            }
        }
        tmp = self.data_dir / "topics.json.tmp"
        with tmp.open("w") as f:
            json.dump(payload, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.data_dir / "topics.json")
        fd = os.open(self.data_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _add(self, topic: Topic) -> None:
        self._topics[topic.name] = topic
        self._by_id[topic.topic_id] = topic

    # -- queries ----------------------------------------------------------------------------

    def get(self, name: str) -> Topic | None:
        return self._topics.get(name)

    def by_id(self, topic_id: uuid.UUID) -> Topic | None:
        return self._by_id.get(topic_id)

    def partition(self, name: str, index: int) -> Partition | None:
        topic = self._topics.get(name)
        if topic is None or not 0 <= index < len(topic.partitions):
            return None
        return topic.partitions[index]

    def __iter__(self) -> Iterator[Topic]:
        return iter(list(self._topics.values()))

    def __len__(self) -> int:
        return len(self._topics)

    # -- changes ----------------------------------------------------------------------------

    def validate_new(self, name: str, num_partitions: int, configs: dict[str, str]) -> LogConfig:
        validate_topic_name(name)
        if name in self._topics:
            raise TopicExistsError(f"topic {name!r} already exists")
        if num_partitions < 1:
            raise InvalidPartitionsError("number of partitions must be at least 1")
        if num_partitions > 10_000:
            raise InvalidPartitionsError("number of partitions must be at most 10000")
        return self.log_config(configs)

    def create(
        self, name: str, num_partitions: int, configs: dict[str, str] | None = None
    ) -> Topic:
        configs = dict(configs or {})
        log_config = self.validate_new(name, num_partitions, configs)
        topic = Topic(name, uuid.uuid4(), configs, [])
        for index in range(num_partitions):
            topic.partitions.append(self._open_partition(name, index, log_config))
        self._add(topic)
        self._save()
        return topic

    def delete(self, name: str) -> Topic:
        topic = self._topics.pop(name, None)
        if topic is None:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        del self._by_id[topic.topic_id]
        self._save()
        for partition in topic.partitions:
            partition.notify()
            partition.delete()
        return topic

    def add_partitions(self, name: str, total: int) -> Topic:
        topic = self._topics.get(name)
        if topic is None:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        current = len(topic.partitions)
        if total <= current:
            raise InvalidPartitionsError(
                f"topic {name!r} has {current} partitions; the new count must be larger"
            )
        if total > 10_000:
            raise InvalidPartitionsError("number of partitions must be at most 10000")
        log_config = self.log_config(topic.configs)
        for index in range(current, total):
            topic.partitions.append(self._open_partition(name, index, log_config))
        self._save()
        return topic
