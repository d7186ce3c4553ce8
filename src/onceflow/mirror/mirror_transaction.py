"""One mirror write task: per source partition, one Kafka transaction on the target holding
the records and the mirror's new position in the source (KIP-656).

The position plays the part of the sink's done-mark, but it is a source offset, not a
(Spark batch id, row count): it means the same thing whatever Spark batch re-runs it, and
without any checkpoint at all. After `init_transactions()` (which fences any earlier attempt
and completes or aborts what it left open) the task reads the position; rows below it are
already in the target and are skipped, the rest are written with the new position.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from onceflow.kafka_errors import kafka_error_code
from onceflow.mirror.offset_syncs import OffsetSync, offset_syncs, offset_syncs_topic, runs_of
from onceflow.mirror.positions import mirror_group, mirror_transactional_id
from onceflow.mirror.replication_policy import ReplicationPolicy
from onceflow.mirror.target_limit import (
    DEFAULT_MESSAGE_MAX_BYTES,
    RecordTooLargeError,
    first_too_large,
    max_message_bytes,
    record_too_large,
    sized_to,
)
from onceflow.spark.at_least_once import DeliveryError
from onceflow.spark.sink_columns import produce_when_room
from onceflow.spark.sink_target import consumer_config, producer_config
from onceflow.spark.task_transaction import OffsetsTransaction

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MirrorTarget:
    """What every mirror write task needs; decided on the driver, pickled to executors."""

    client: dict[str, str]
    policy: ReplicationPolicy
    exactly_once: bool = True
    timeout_s: float = 60.0


@dataclass(frozen=True)
class PartitionOutcome:
    topic: str
    partition: int
    rows: int
    skipped: int
    error: str | None = None  # why the mirror must stop at this partition (a record too large)


class MirrorTransaction(OffsetsTransaction):
    """The transaction of one source partition: open(), produce() runs of its rows, commit()."""

    def __init__(self, target: MirrorTarget, source_topic: str, partition: int) -> None:
        topic = target.policy.target_topic(source_topic)
        super().__init__(
            mirror_transactional_id(target.policy.alias, topic, partition), target.timeout_s
        )
        self.target = target
        self.source_topic = source_topic
        self.topic = topic
        self.partition = partition
        self.rows = 0
        self.skipped = 0
        self.next_offset = -1
        self.position = -1
        self._sources: list[int] = []  # source offsets of the rows produced, in order
        self._ends: list[int] = []  # target offsets of the first and last row of each run
        self._marked = 0  # delivery reports asked for
        self._failed: list[KafkaError] = []
        self.limit: int | None = None  # the target topic's max.message.bytes
        self.message_max_bytes = DEFAULT_MESSAGE_MAX_BYTES
        self.broken = False  # a produce failed part-way: abort, never commit

    def open(self) -> int:
        """Fence earlier attempts, then read the position (stable from now on); -1 for none."""
        # reports for the rows that ask (on_delivery): the first and last of each produce()
        config = producer_config(self.target.client, **{"delivery.report.only.error": False})
        self.limit = max_message_bytes(self.target.client, self.topic, self.target.timeout_s)
        config.update(sized_to(self.limit, config))
        self.message_max_bytes = int(str(config.get("message.max.bytes", self.message_max_bytes)))
        self.fence(config, self.topic)
        group = {"group.id": mirror_group(self.target.policy.alias)}
        self.position = self.read_offset(
            consumer_config(self.target.client, **group),
            TopicPartition(self.topic, self.partition),
        )
        return self.position

    def _delivered(self, error: KafkaError | None, message: Any) -> None:
        if error is not None:
            self._failed.append(error)
        else:
            self._ends.append(message.offset())

    def produce(self, batch: pa.RecordBatch, start: int, stop: int) -> None:
        """Rows [start, stop) of `batch` (all of this partition, not yet in the target). A row
        the target topic cannot take: the rows before it, then RecordTooLargeError (the
        transaction can still commit them)."""
        too_large = first_too_large(batch, self.limit, start, stop)
        if too_large is not None:
            row, size = too_large
            if row > start:
                self.produce(batch, start, row)
            raise record_too_large(
                self.source_topic,
                self.partition,
                batch.column("offset")[row].as_py(),
                size,
                f"{self.topic} on the target",
                f"max.message.bytes={self.limit}",
            )
        try:
            produce_rows(
                self.begin(),
                batch.slice(start, stop - start),
                self.topic,
                self.partition,
                ends_delivered=self._delivered,
                message_max_bytes=self.message_max_bytes,
            )
        except BaseException:
            self.broken = True
            raise
        self._marked += 1 if stop - start == 1 else 2
        self.rows += stop - start
        self._sources += batch.column("offset").slice(start, stop - start).to_pylist()
        self.next_offset = self._sources[-1] + 1

    def commit(self) -> None:
        """Commit the rows with their offset sync and the new position (the offset after the
        last row written)."""
        if self.rows:
            producer, topic = self.begin(), offset_syncs_topic(self.target.policy.alias)
            for sync in self.offset_syncs():
                producer.produce(topic, sync.value(), sync.key(), partition=0)
            self.commit_with(TopicPartition(self.topic, self.partition, self.next_offset))

    def offset_syncs(self) -> list[OffsetSync]:
        """The target offsets of the rows, from the delivery reports of the first and last row
        of each produce(): the rows fill [first, last] when nobody else wrote to the partition
        meanwhile (one idempotent producer keeps its order). Else a sync without runs: the
        range is covered but group offsets inside it are not translated (never guessed)."""
        undelivered = self.begin().flush(self.target.timeout_s)
        if any(e.code() == KafkaError.MSG_SIZE_TOO_LARGE for e in self._failed):
            # refused by the broker though the rows were checked: the limit was not readable
            # or was lowered meanwhile
            self.broken = True
            raise RecordTooLargeError(
                f"records of {self.source_topic}/{self.partition} at offsets "
                f"{self._sources[0]} to {self._sources[-1]} were refused as too large by "
                f"{self.topic} on the target (max.message.bytes="
                f"{self.limit if self.limit is not None else 'unknown'}); raise that, then "
                "restart the mirror"
            )
        if undelivered or self._failed or len(self._ends) != self._marked:
            raise DeliveryError(
                f"{self.transactional_id}: {len(self._ends)} of {self._marked} delivery "
                f"reports, {undelivered} records pending"
                + (f" (first error: {self._failed[0]})" if self._failed else "")
            )
        start = self.position if self.position >= 0 else self._sources[0]
        first, last = min(self._ends), max(self._ends)
        if last - first + 1 != len(self._sources):
            log.warning(
                "%s/%d: another producer wrote between the mirror's records; group offsets "
                "within source offsets [%d, %d) will not be translated",
                self.topic,
                self.partition,
                start,
                self.next_offset,
            )
            return [OffsetSync(self.topic, self.partition, start, self.next_offset, ())]
        targets = range(first, last + 1)
        return offset_syncs(self.topic, self.partition, start, runs_of(self._sources, targets))


def produce_rows(
    producer: Any,
    batch: pa.RecordBatch,
    topic: str,
    partition: int,
    ends_delivered: Callable[[KafkaError | None, Any], None] | None = None,
    message_max_bytes: int = DEFAULT_MESSAGE_MAX_BYTES,
) -> None:
    """Each row as the source had it: same partition, key, value, headers and timestamp;
    `ends_delivered` gets the delivery reports of the first and the last row. A row larger
    than the producer takes (`message_max_bytes`): RecordTooLargeError."""
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    # Spark's timestamps are microseconds; Kafka's CreateTime is milliseconds (exact: x1000)
    stamps = pc.divide(batch.column("timestamp").cast(pa.int64()), 1000).to_pylist()
    names = batch.schema.names
    headers = batch.column("headers").to_pylist() if "headers" in names else [None] * len(keys)
    ends = {0, len(keys) - 1} if ends_delivered is not None else set()
    rows = zip(keys, values, stamps, headers, strict=True)
    for i, (key, value, stamp, row_headers) in enumerate(rows):
        kwargs: dict[str, Any] = {"partition": partition}
        if i in ends:
            kwargs["on_delivery"] = ends_delivered
        if stamp is not None and stamp >= 0:
            kwargs["timestamp"] = stamp
        if row_headers:
            kwargs["headers"] = [(h["key"], h["value"]) for h in row_headers]
        try:
            try:
                producer.produce(topic, value, key, **kwargs)
            except BufferError:
                produce_when_room(producer, topic, value, key, **kwargs)
        except KafkaException as exc:
            if kafka_error_code(exc) != KafkaError.MSG_SIZE_TOO_LARGE:
                raise
            size = len(key or b"") + len(value or b"")
            raise record_too_large(
                batch.column("topic")[i].as_py(),
                batch.column("partition")[i].as_py(),
                batch.column("offset")[i].as_py(),
                size + sum(len(k) + len(v or b"") for k, v in kwargs.get("headers", ())),
                "the mirror's producer",
                f"message.max.bytes={message_max_bytes}",
            ) from None
    producer.poll(0)


def runs(batch: pa.RecordBatch) -> Iterator[tuple[str, int, int, int]]:
    """(topic, partition, start, stop) of each run of rows of one source partition."""
    topics = batch.column("topic").to_pylist()
    partitions = batch.column("partition").to_pylist()
    start = 0
    for i in range(1, len(topics) + 1):
        if i == len(topics) or (topics[i], partitions[i]) != (topics[start], partitions[start]):
            yield topics[start], partitions[start], start, i
            start = i


def mirror_exactly_once(
    target: MirrorTarget, batches: Iterable[pa.RecordBatch]
) -> list[PartitionOutcome]:
    """Write a task's rows, one transaction per source partition it holds (one, normally: the
    mirror plans one range per partition and does not shuffle)."""
    txns: dict[tuple[str, int], tuple[MirrorTransaction, int]] = {}
    # A record too large for the target stops its partition there: what comes before it is
    # committed, and the driver stops the mirror with the reason (retrying cannot help).
    stopped: dict[tuple[str, int], str] = {}
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            offsets = batch.column("offset").to_pylist()
            for topic, partition, start, stop in runs(batch):
                if (topic, partition) in stopped:
                    continue
                if (topic, partition) not in txns:
                    txn = MirrorTransaction(target, topic, partition)
                    txns[(topic, partition)] = (txn, txn.open())
                txn, position = txns[(topic, partition)]
                # rows below the target's position were committed by an earlier attempt or run
                first = next((i for i in range(start, stop) if offsets[i] >= position), stop)
                txn.skipped += first - start
                if first < stop:
                    try:
                        txn.produce(batch, first, stop)
                    except RecordTooLargeError as exc:
                        stopped[(topic, partition)] = str(exc)
        for key, (txn, _) in txns.items():
            if txn.broken:
                txn.abort()
                txn.rows = 0
                continue
            try:
                txn.commit()
            except RecordTooLargeError as exc:
                stopped[key] = str(exc)
                txn.abort()
                txn.rows = 0
    except BaseException:
        for txn, _ in txns.values():
            txn.abort()
        raise
    finally:
        for txn, _ in txns.values():
            txn.close()
    return [
        PartitionOutcome(t.source_topic, t.partition, t.rows, t.skipped, stopped.get(key))
        for key, (t, _) in txns.items()
    ]


def mirror_at_least_once(
    target: MirrorTarget, batches: Iterable[pa.RecordBatch]
) -> list[PartitionOutcome]:
    """The plain mirror, for comparison: produce and flush; the position lives only in Spark's
    checkpoint, so a retried task or a lost checkpoint writes records again."""
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            errors.append(error)

    # sized to the first target topic's limit (a task holds one source partition, normally)
    producer: Producer | None = None
    limits: dict[str, int | None] = {}
    counts: dict[tuple[str, int], int] = {}
    stopped: dict[tuple[str, int], str] = {}
    for batch in batches:
        for topic, partition, start, stop in runs(batch):
            if (topic, partition) in stopped:
                continue
            name = target.policy.target_topic(topic)
            if name not in limits:
                limits[name] = max_message_bytes(target.client, name, target.timeout_s)
            if producer is None:
                config = producer_config(
                    target.client,
                    **{
                        "acks": "all",
                        "on_delivery": on_delivery,
                        "delivery.report.only.error": True,
                    },
                )
                producer = Producer({**config, **sized_to(limits[name], config)})
            too_large = first_too_large(batch, limits[name], start, stop)
            end = stop if too_large is None else too_large[0]
            if end > start:
                produce_rows(producer, batch.slice(start, end - start), name, partition)
                counts[(topic, partition)] = counts.get((topic, partition), 0) + end - start
            if too_large is not None:
                offset = batch.column("offset")[too_large[0]].as_py()
                limit = f"max.message.bytes={limits[name]}"
                taker = f"{name} on the target"
                stopped[(topic, partition)] = str(
                    record_too_large(topic, partition, offset, too_large[1], taker, limit)
                )
    undelivered = producer.flush(target.timeout_s) if producer is not None else 0
    if undelivered or errors:
        raise DeliveryError(
            f"{undelivered} records undelivered after {target.timeout_s:.0f} s, "
            f"{len(errors)} failed" + (f" (first: {errors[0]})" if errors else "")
        )
    return [
        PartitionOutcome(t, p, counts.get((t, p), 0), 0, stopped.get((t, p)))
        for t, p in {**counts, **stopped}
    ]
