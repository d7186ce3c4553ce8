"""The topic registry: names, topic ids, partition logs, topic-level configs, all durable.

`topics.json` in the data directory is the source of truth, replaced atomically. Beside the
topics it holds a journal, `pending_removal`: the partition directories a change in progress
may leave behind (a CreateTopics' new directories, a DeleteTopics' doomed ones). A change
first writes the journal, then does its file work, then writes the outcome with the journal
cleared; a crash anywhere leaves either the change or nothing, and on start only directories
the journal names are removed. Nothing else in the data directory is ever deleted.

Changes run one at a time (in arrival order) and their file work (directories, segment files,
fsyncs, the topics.json writes) runs on a worker thread, so a request for 10,000 partitions
never stalls the event loop; the new topics are registered on the loop once durable.

Opening (recovering), creating and closing many partitions is file work that mostly waits on
fsync: it runs on `num.recovery.threads.per.data.dir` threads, as Kafka recovers and closes its
logs, so the fsyncs of different partitions are in flight together.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar, cast

from onceflow.broker.config import BrokerConfig
from onceflow.broker.partition import Partition
from onceflow.broker.storage_failure import halt_on_storage_error
from onceflow.clock import Clock
from onceflow.fault_points import crash_point, raise_point
from onceflow.log.config import LogConfig
from onceflow.log.errors import LogError, LogStorageError
from onceflow.log.sync_barrier import SyncBarrier

log = logging.getLogger(__name__)

_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_NAME_LENGTH = 249
MAX_PARTITIONS = 10_000
INTERNAL_PREFIX = "__"
TOPICS_FILE = "topics.json"

# Broker-level defaults and the topic-level settings they provide defaults for.
_BROKER_TO_TOPIC = {
    "log_segment_bytes": "segment.bytes",
    "log_roll_ms": "segment.ms",
    "log_retention_ms": "retention.ms",
    "log_retention_bytes": "retention.bytes",
    "log_index_interval_bytes": "index.interval.bytes",
    "log_message_timestamp_type": "message.timestamp.type",
    "message_max_bytes": "max.message.bytes",
    "log_cleanup_policy": "cleanup.policy",
    "log_cleaner_min_cleanable_ratio": "min.cleanable.dirty.ratio",
    "log_cleaner_delete_retention_ms": "delete.retention.ms",
    "log_cleaner_min_compaction_lag_ms": "min.compaction.lag.ms",
    "log_cleaner_max_compaction_lag_ms": "max.compaction.lag.ms",
}

# Kafka's broker setting names of those fields (log.retention.ms, message.max.bytes, ...).
_BROKER_NAMES = {f.name: f.metadata["kafka"] for f in fields(BrokerConfig) if "kafka" in f.metadata}

# A topic's new configs from its current ones (AlterConfigs' whole set, IncrementalAlterConfigs'
# operations); raises InvalidConfigError. Applied under the registry's change lock, so two
# concurrent alterations of one topic never lose each other's changes.
ConfigUpdate = Callable[[dict[str, str]], dict[str, str]]

T = TypeVar("T")
R = TypeVar("R")


class TopicError(Exception):
    """Base of topic registry errors; each maps to one Kafka error code."""


class TopicExistsError(TopicError):
    pass


class InvalidTopicError(TopicError):
    pass


class UnknownTopicError(TopicError):
    pass


class UnknownTopicIdError(TopicError):
    pass


class InvalidPartitionsError(TopicError):
    pass


class InvalidConfigError(TopicError):
    pass


class InvalidReplicationError(TopicError):
    pass


class TopicStorageError(TopicError):
    """The topic's files could not be made (KAFKA_STORAGE_ERROR); nothing of it was kept."""


@dataclass(eq=False)
class Topic:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]
    partitions: list[Partition]


@dataclass(frozen=True)
class NewTopic:
    name: str
    num_partitions: int
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(eq=False)
class _Plan:
    """Partitions [first, total) of one topic to make on the worker thread."""

    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]
    first: int
    total: int
    log_config: LogConfig
    opened: list[Partition] = field(default_factory=list)
    error: TopicError | None = None

    @property
    def dirs(self) -> list[str]:
        return [partition_dir_name(self.name, i) for i in range(self.first, self.total)]


def partition_dir_name(topic: str, index: int) -> str:
    return f"{topic}-{index}"


def validate_topic_name(name: str) -> None:
    check_legal_topic_name(name)
    if name.startswith(INTERNAL_PREFIX):
        raise InvalidTopicError(f"topic names starting with {INTERNAL_PREFIX!r} are internal")


def check_legal_topic_name(name: str) -> None:
    """Kafka's Topic.validate: what any topic name, internal ones included, must be (with
    Kafka's messages, which tools and clients show as they are)."""
    reason = None
    if not name:
        reason = "the empty string is not allowed"
    elif name in (".", ".."):
        reason = f"'{name}' is not allowed"
    elif len(name) > MAX_NAME_LENGTH:
        reason = f"the length of '{name}' is longer than the max allowed length {MAX_NAME_LENGTH}"
    # fullmatch: with match and `$`, "ok\n" passed (`$` matches before a final newline).
    elif not _LEGAL_NAME.fullmatch(name):
        reason = (
            f"'{name}' contains one or more characters other than ASCII alphanumerics, "
            "'.', '_' and '-'"
        )
    if reason is not None:
        raise InvalidTopicError(f"Topic name is invalid: {reason}")


def collision_key(name: str) -> str:
    """Kafka's Topic.hasCollision: names equal once '.' reads as '_' (metric names) collide."""
    return name.replace(".", "_")


class TopicRegistry:
    def __init__(self, config: BrokerConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.data_dir = config.data_dir
        self._topics: dict[str, Topic] = {}
        self._by_id: dict[uuid.UUID, Topic] = {}
        self._by_collision_key: dict[str, str] = {}
        # Directories a failed removal left: kept in the journal, retried on the next start.
        self._pending_removal: set[str] = set()
        self._changes = asyncio.Lock()
        self._worker: ThreadPoolExecutor | None = None
        self._jobs: set[asyncio.Task[Any]] = set()

    # -- configuration ---------------------------------------------------------------------

    def default_topic_configs(self) -> dict[str, str]:
        return {topic: str(getattr(self.config, attr)) for attr, topic in _BROKER_TO_TOPIC.items()}

    def effective_configs(self, overrides: dict[str, str]) -> dict[str, str]:
        """Every topic-level setting with its value: the topic's own, else the broker's."""
        return {**self.default_topic_configs(), **overrides}

    def topic_defaults_set_on_broker(self) -> set[str]:
        """Topic-level names whose broker default was set (file or flags), not Kafka's default:
        DescribeConfigs reports those as STATIC_BROKER_CONFIG, the others as DEFAULT_CONFIG."""
        kafka_defaults = BrokerConfig()
        return {
            topic
            for attr, topic in _BROKER_TO_TOPIC.items()
            if getattr(self.config, attr) != getattr(kafka_defaults, attr)
        }

    def broker_synonym(self, topic_config: str) -> tuple[str, str, bool] | None:
        """The broker setting a topic-level config defaults to (Kafka's synonym): its name,
        its value, and whether it was set on the broker rather than left at Kafka's default;
        None for a config without one."""
        for attr, topic in _BROKER_TO_TOPIC.items():
            if topic == topic_config:
                name = _BROKER_NAMES[attr]
                value = getattr(self.config, attr)
                return name, str(value), value != getattr(BrokerConfig(), attr)
        return None

    def log_config(self, overrides: dict[str, str]) -> LogConfig:
        try:
            return LogConfig.from_kafka_configs({**self.default_topic_configs(), **overrides})
        except ValueError as e:
            raise InvalidConfigError(str(e)) from None

    # -- lifecycle --------------------------------------------------------------------------

    def load(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / TOPICS_FILE
        state = json.loads(path.read_text()) if path.exists() else {}
        stored = state.get("topics", {})
        known = {
            partition_dir_name(name, i)
            for name, meta in stored.items()
            for i in range(meta["partitions"])
        }
        # A change cut short by a crash: its directories go, its topics.json never named them.
        journal = [d for d in state.get("pending_removal", []) if d not in known]
        self._pending_removal = _remove_dirs(self.data_dir, journal)
        topics = [Topic(n, uuid.UUID(m["id"]), dict(m["configs"]), []) for n, m in stored.items()]
        wanted = [
            (topic, index, self.log_config(topic.configs))
            for topic, meta in zip(topics, stored.values(), strict=True)
            for index in range(meta["partitions"])
        ]
        # The fsyncs the opening owes are made together, before anything is served.
        barrier = SyncBarrier()
        opened = self._each(
            lambda w: self._open_partition(w[0].name, w[1], w[2], barrier=barrier), wanted
        )
        _raise_first(opened)
        barrier.sync()
        for (topic, _, _), partition in zip(wanted, opened, strict=True):
            topic.partitions.append(cast(Partition, partition))
        for topic in topics:
            self._add(topic)
        if journal:
            self._write_state(self._payload(), sorted(self._pending_removal))

    def close(self) -> None:
        if self._worker is not None:
            # A change still on the worker finishes its file work; it is recorded or journaled.
            self._worker.shutdown(wait=True)
            self._worker = None
        partitions = [p for topic in self._topics.values() for p in topic.partitions]
        # Every partition is closed (and marked clean) even if one fails; then that one raises.
        # The clean-shutdown markers, each written once its log is durable, are synced at once.
        barrier = SyncBarrier()
        closed = self._each(lambda p: p.close(barrier), partitions)
        try:
            barrier.sync()
        except OSError as e:
            raise LogStorageError(f"syncing the clean-shutdown markers failed: {e}") from e
        _raise_first(closed)

    def _each(self, fn: Callable[[T], R], items: list[T]) -> list[R | BaseException]:
        """`fn` of each item on num.recovery.threads.per.data.dir threads: each result, or
        the exception it raised, in order."""
        threads = min(self.config.num_recovery_threads_per_data_dir, len(items))
        if threads <= 1:
            return [_result_or_error(fn, item) for item in items]
        with ThreadPoolExecutor(threads, thread_name_prefix="log-recovery") as pool:
            return list(pool.map(lambda item: _result_or_error(fn, item), items))

    def _open_partition(
        self,
        name: str,
        index: int,
        log_config: LogConfig,
        *,
        sync_parent: bool = True,
        barrier: SyncBarrier | None = None,
    ) -> Partition:
        return Partition.open(
            name,
            index,
            self.data_dir / partition_dir_name(name, index),
            log_config,
            self.clock,
            self.config.producer_id_expiration_ms,
            sync_parent=sync_parent,
            barrier=barrier,
        )

    def _payload(self) -> dict[str, Any]:
        """What topics.json records of the registered topics (taken on the loop)."""
        return {
            t.name: {"id": str(t.topic_id), "partitions": len(t.partitions), "configs": t.configs}
            for t in self._topics.values()
        }

    def _write_state(self, topics: dict[str, Any], pending_removal: list[str]) -> None:
        """Replace topics.json durably (worker thread, or the loop before serving)."""
        payload = {"topics": topics, "pending_removal": pending_removal}
        tmp = self.data_dir / (TOPICS_FILE + ".tmp")
        with tmp.open("w") as f:
            json.dump(payload, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.data_dir / TOPICS_FILE)
        _fsync_dir(self.data_dir)

    def _add(self, topic: Topic) -> None:
        self._topics[topic.name] = topic
        self._by_id[topic.topic_id] = topic
        self._by_collision_key[collision_key(topic.name)] = topic.name

    def _remove(self, topic: Topic) -> None:
        del self._topics[topic.name]
        del self._by_id[topic.topic_id]
        self._by_collision_key.pop(collision_key(topic.name), None)

    async def _unstoppable(self, job: Coroutine[Any, Any, T]) -> T:
        """Run a change to its end even when its requester goes away: cancelled half-way, a
        change would leave its files made but its topics unregistered (and later unrecorded)."""
        task = asyncio.ensure_future(job)
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
        return await asyncio.shield(task)

    async def _off_loop(self, fn: Callable[[], T]) -> T:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="topics")
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn)

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

    # -- validation -------------------------------------------------------------------------

    def validate_new(
        self,
        name: str,
        num_partitions: int,
        configs: dict[str, str],
        also: dict[str, str] | None = None,
    ) -> LogConfig:
        """Check a topic to create; `also` holds collision keys of topics created before it in
        the same request (Kafka checks each against those too)."""
        validate_topic_name(name)
        if name in self._topics:
            raise TopicExistsError(f"Topic '{name}' already exists.")
        key = collision_key(name)
        existing = self._by_collision_key.get(key) or (also or {}).get(key)
        if existing is not None:
            raise InvalidTopicError(f"Topic '{name}' collides with existing topic: {existing}")
        if num_partitions < 1:
            raise InvalidPartitionsError("number of partitions must be at least 1")
        if num_partitions > MAX_PARTITIONS:
            raise InvalidPartitionsError(f"number of partitions must be at most {MAX_PARTITIONS}")
        return self.log_config(configs)

    # -- changes (one at a time, file work off the loop) -------------------------------------

    async def create_topics(self, wanted: list[NewTopic]) -> list[Topic | TopicError]:
        """Create each topic whole or not at all; one topics.json write per call."""
        return await self._unstoppable(self._create_topics(wanted))

    async def _create_topics(self, wanted: list[NewTopic]) -> list[Topic | TopicError]:
        async with self._changes:
            results: dict[int, Topic | TopicError] = {}
            plans: dict[int, _Plan] = {}
            batch_keys: dict[str, str] = {}
            for i, new in enumerate(wanted):
                try:
                    log_config = self.validate_new(
                        new.name, new.num_partitions, new.configs, batch_keys
                    )
                except TopicError as e:
                    results[i] = e
                    continue
                batch_keys[collision_key(new.name)] = new.name
                plans[i] = _Plan(
                    new.name, uuid.uuid4(), dict(new.configs), 0, new.num_partitions, log_config
                )
            if plans:
                await self._make_partitions(list(plans.values()), self._payload())
            for i, plan in plans.items():
                if plan.error is not None:
                    results[i] = plan.error
                    continue
                topic = Topic(plan.name, plan.topic_id, plan.configs, plan.opened)
                self._add(topic)
                results[i] = topic
            return [results[i] for i in range(len(wanted))]

    async def alter_configs(
        self, updates: dict[str, ConfigUpdate], validate_only: bool = False
    ) -> dict[str, TopicError | None]:
        """Change the configs of existing topics (AlterConfigs, IncrementalAlterConfigs): each
        topic's change is checked whole, then every valid one is recorded in one topics.json
        write and only then applied to the live partitions (retention.ms at the next retention
        pass, segment.bytes at the next roll). Returns each topic's error, None if changed."""
        return await self._unstoppable(self._alter_configs(updates, validate_only))

    async def _alter_configs(
        self, updates: dict[str, ConfigUpdate], validate_only: bool
    ) -> dict[str, TopicError | None]:
        async with self._changes:
            results: dict[str, TopicError | None] = {}
            changed: dict[str, tuple[Topic, dict[str, str], LogConfig]] = {}
            for name, update in updates.items():
                try:
                    topic = self._topics.get(name)
                    if topic is None:
                        check_legal_topic_name(name)
                        raise UnknownTopicError(f"The topic '{name}' does not exist.")
                    configs = update(dict(topic.configs))
                    changed[name] = (topic, configs, self.log_config(configs))
                    results[name] = None
                except TopicError as e:
                    results[name] = e
            if validate_only or not changed:
                return results
            committed = self._payload()
            for name, (_, configs, _) in changed.items():
                committed[name] = {**committed[name], "configs": configs}
            journal = sorted(self._pending_removal)
            try:
                await self._off_loop(lambda: self._write_state(committed, journal))
            except OSError as e:
                halt_on_storage_error(e)
                log.error("recording topic configs in %s failed: %s", TOPICS_FILE, e)
                for name in changed:
                    results[name] = TopicStorageError(f"recording configs of {name!r} failed: {e}")
                return results
            for topic, configs, log_config in changed.values():
                topic.configs = configs
                for partition in topic.partitions:
                    partition.update_config(log_config)
            return results

    async def add_partitions(self, name: str, total: int) -> Topic:
        """CreatePartitions: the new partitions all exist, or none does."""
        return await self._unstoppable(self._add_partitions(name, total))

    async def _add_partitions(self, name: str, total: int) -> Topic:
        async with self._changes:
            topic = self._topics.get(name)
            if topic is None:
                raise UnknownTopicError(f"topic {name!r} does not exist")
            current = len(topic.partitions)
            if total <= current:
                raise InvalidPartitionsError(
                    f"Topic currently has {current} partitions, which is higher than or equal "
                    f"to the requested {total}."
                )
            if total > MAX_PARTITIONS:
                raise InvalidPartitionsError(
                    f"number of partitions must be at most {MAX_PARTITIONS}"
                )
            plan = _Plan(
                name, topic.topic_id, topic.configs, current, total, self.log_config(topic.configs)
            )
            await self._make_partitions([plan], self._payload())
            if plan.error is not None:
                raise plan.error
            topic.partitions.extend(plan.opened)
            return topic

    async def delete_topics(self, wanted: list[str | uuid.UUID]) -> list[Topic | TopicError]:
        """Unregister at once (no client sees them after the answer), then remove the files.
        Each is a name or a topic id."""
        return await self._unstoppable(self._delete_topics(wanted))

    async def _delete_topics(self, wanted: list[str | uuid.UUID]) -> list[Topic | TopicError]:
        async with self._changes:
            results: list[Topic | TopicError] = []
            doomed: list[tuple[str, str]] = []
            for key in wanted:
                if isinstance(key, uuid.UUID):
                    topic = self._by_id.get(key)
                    if topic is None:
                        results.append(UnknownTopicIdError(f"topic id {key} does not exist"))
                        continue
                else:
                    topic = self._topics.get(key)
                    if topic is None:
                        results.append(UnknownTopicError(f"topic {key!r} does not exist"))
                        continue
                self._remove(topic)
                for partition in topic.partitions:
                    partition.notify()
                    _release(partition)
                    original = partition_dir_name(topic.name, partition.index)
                    # Kafka's rename: the name is free for a new topic at once, and what the
                    # journal then names can only be this topic's.
                    doomed.append((original, f"{original}.{topic.topic_id.hex}-delete"))
                results.append(topic)
            if doomed:
                committed = self._payload()
                await self._off_loop(lambda: self._delete_files(doomed, committed))
            return results

    # -- file work on the worker thread ----------------------------------------------------

    def _make_partitions(self, plans: list[_Plan], committed: dict[str, Any]) -> Any:
        return self._off_loop(lambda: self._make_partitions_now(plans, committed))

    def _make_partitions_now(self, plans: list[_Plan], committed: dict[str, Any]) -> None:
        for plan in plans:
            taken = [d for d in plan.dirs if os.path.lexists(self.data_dir / d)]
            if taken:
                # Not ours (the journal removes ours): never open, let alone remove, it.
                plan.error = TopicStorageError(
                    f"cannot create topic {plan.name!r}: {self.data_dir / taken[0]} already exists"
                )
        todo = [p for p in plans if p.error is None]
        if not todo:
            return
        journal = sorted(self._pending_removal | {d for p in todo for d in p.dirs})
        try:
            self._write_state(committed, journal)
        except OSError as e:
            halt_on_storage_error(e)
            for plan in todo:  # nothing made yet: the request fails, the broker goes on
                plan.error = TopicStorageError(f"cannot create topic {plan.name!r}: {e}")
            return
        for plan in todo:

            def make(index: int, plan: _Plan = plan) -> Partition:
                raise_point("topics.open-partition")
                # The data directory is synced once below, not once per new partition.
                return self._open_partition(plan.name, index, plan.log_config, sync_parent=False)

            made = self._each(make, list(range(plan.first, plan.total)))
            plan.opened = [p for p in made if isinstance(p, Partition)]
            error = next((e for e in made if isinstance(e, BaseException)), None)
            if isinstance(error, (OSError, LogError)):
                log.warning("creating partitions of %r failed, rolling back: %s", plan.name, error)
                plan.error = TopicStorageError(f"creating topic {plan.name!r} failed: {error}")
                self._roll_back(plan)
            elif error is not None:
                self._roll_back(plan)
                raise error
        crash_point("topics.before-record")
        done = [p for p in todo if p.error is None]
        outcome = dict(committed)
        for plan in done:
            outcome[plan.name] = {
                "id": str(plan.topic_id),
                "partitions": plan.total,
                "configs": plan.configs,
            }
        failed = [d for p in todo if p.error is not None for d in p.dirs]
        self._pending_removal |= {d for d in failed if os.path.lexists(self.data_dir / d)}
        self._pending_removal -= {d for p in done for d in p.dirs}
        try:
            # The new directories' entries are durable before topics.json names them.
            _fsync_dir(self.data_dir)
            self._write_state(outcome, sorted(self._pending_removal))
        except OSError as e:
            # Not recorded: the journal removes every new directory on the next start.
            log.error("recording new topics in %s failed, rolling back: %s", TOPICS_FILE, e)
            for plan in done:
                plan.error = TopicStorageError(f"recording topic {plan.name!r} failed: {e}")
                self._roll_back(plan)

    def _roll_back(self, plan: _Plan) -> None:
        """Close what was opened first (that frees the descriptors), then remove the dirs."""
        for partition in plan.opened:
            _release(partition)
        plan.opened.clear()
        _remove_dirs(self.data_dir, plan.dirs)

    def _delete_files(self, doomed: list[tuple[str, str]], committed: dict[str, Any]) -> None:
        journal = self._pending_removal | {d for pair in doomed for d in pair}
        self._write_state(committed, sorted(journal))
        for original, renamed in doomed:
            try:
                os.rename(self.data_dir / original, self.data_dir / renamed)
            except FileNotFoundError:
                continue
            except OSError as e:
                log.error("could not rename %s for deletion, removing it in place: %s", original, e)
        _fsync_dir(self.data_dir)
        crash_point("topics.after-delete-rename")
        self._pending_removal = _remove_dirs(self.data_dir, sorted(journal))
        self._write_state(committed, sorted(self._pending_removal))


def _result_or_error(fn: Callable[[T], R], item: T) -> R | BaseException:
    try:
        return fn(item)
    except Exception as e:
        return e


def _raise_first(results: list[Any]) -> None:
    error = next((r for r in results if isinstance(r, BaseException)), None)
    if error is not None:
        raise error


def _release(partition: Partition) -> None:
    """Drop a partition's descriptors without flushing: its files are about to go."""
    partition.abandon()


def _remove_dirs(data_dir: Path, names: list[str]) -> set[str]:
    """Remove these directories of the data directory; returns those that could not be."""
    left = set()
    for name in names:
        path = data_dir / name
        if not os.path.lexists(path):
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError as e:
            log.error("could not remove %s (kept in the journal, retried on start): %s", path, e)
            left.add(name)
    return left


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
