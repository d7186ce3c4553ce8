"""One write task = one Kafka transaction, with its done-mark inside.

transactional.id = f"{prefix}-{partition}": each attempt of a task calls `init_transactions()`,
which bumps the producer epoch, fences every earlier attempt and aborts (or completes) what it
left open. Only then is the done-mark read, so it is stable.

The done-mark is a position, not a flag. Spark may end a task's input early without telling
the writer: when an operator upstream of the sink fails in the same task, the writer sees a
clean end of input, and commits the rows it got. So the mark records how far into its input
the task has committed: (batch id, rows) as the transactional consumer-group offset
`batch_id << 32 | rows`, committed with `send_offsets_to_transaction` for group
`onceflow-sink.{prefix}.{partition}` on partition 0 of the output topic (a partition that surely
exists: Apache Kafka refuses offsets of unknown partitions). It becomes visible exactly when
the rows do. The next attempt, or a re-run of the batch, skips the rows already committed and
writes the rest: nothing twice, nothing lost, provided each task sees its rows in the same order
on every attempt (true for the onceflow source and row-wise transformations; sort within
partitions after a shuffle).

Marks are read with a read_committed consumer: its OffsetFetch requires stable offsets, so it
waits out a transaction that is still completing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from onceflow.kafka_errors import (
    COORDINATOR_MOVING,
    coordinator_moving,
    kafka_error_code,
    retry_transient,
)
from onceflow.spark.mark_readers import discard, mark_reader
from onceflow.spark.sink_columns import produce_batch
from onceflow.spark.sink_target import SinkTarget, TaskOutcome

log = logging.getLogger(__name__)

_FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
_POSITION_BITS = 32
_POSITION_MASK = (1 << _POSITION_BITS) - 1
_COORDINATOR_BACKOFF_S = 0.5


class TaskFencedError(RuntimeError):
    """A newer attempt of the same (prefix, partition) took over: this one must stop."""


class DoneMarkError(RuntimeError):
    """The done-mark of a task could not be read, or cannot hold the task's position."""


@dataclass(frozen=True)
class DoneMark:
    """The first `rows` rows of batch `batch_id` of this task are committed."""

    batch_id: int
    rows: int

    def to_offset(self) -> int:
        if not 0 <= self.rows <= _POSITION_MASK:
            raise DoneMarkError(f"a task of {self.rows} rows is beyond what a mark can hold")
        return (self.batch_id << _POSITION_BITS) | self.rows

    @classmethod
    def from_offset(cls, offset: int) -> DoneMark | None:
        """None for "no mark" (a negative, logical offset)."""
        if offset < 0:
            return None
        return cls(offset >> _POSITION_BITS, offset & _POSITION_MASK)

    def rows_done(self, batch_id: int) -> int | None:
        """Rows of `batch_id` to skip: 0 for a new batch, None for all (a later batch is done)."""
        if self.batch_id > batch_id:
            return None
        return self.rows if self.batch_id == batch_id else 0


def transactional_id(prefix: str, partition: int) -> str:
    return f"{prefix}-{partition}"


def done_mark_group(prefix: str, partition: int) -> str:
    return f"onceflow-sink.{prefix}.{partition}"


def fenced(exc: KafkaException) -> bool:
    """The error says a newer producer with the same transactional.id took over."""
    return kafka_error_code(exc) in _FENCED


def fencing_producer(
    config: dict[str, object], transactional_id: str, topic: str, timeout: float
) -> Producer:
    """A transactional producer after `init_transactions()`: every earlier producer of
    `transactional_id` is fenced and what it left open is completed or aborted."""
    producer = Producer(
        {
            # delivery failures surface in commit_transaction(); skip per-record reports
            # unless `config` wants them (the mirror reads its records' target offsets)
            "delivery.report.only.error": True,
            **config,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": int(timeout * 1000),
        }
    )
    # Metadata twice: the second answer comes from a broker the cluster advertises (not the
    # bootstrap address), so init_transactions() finds a connection up instead of waiting
    # out librdkafka's 500 ms retry timer.
    for _ in range(2):
        producer.list_topics(topic, timeout=timeout)
    try:
        producer.init_transactions(timeout)
    except KafkaException as exc:
        if fenced(exc):
            raise TaskFencedError(f"{transactional_id}: fenced during init") from exc
        raise
    return producer


def committed_offset(
    config: dict[str, object], tp: TopicPartition, timeout: float
) -> tuple[Consumer, int]:
    """The committed offset of `tp` for the group of `config` (read_committed: it waits out a
    transaction still completing), and the (cached) consumer whose group metadata commits.

    While the group's coordinator moves (a node of a Kafka cluster killed or restarting) it is
    asked again for up to `timeout`, as Java's consumer does: failing the task instead spends
    Spark's task attempts in as many seconds, and the query with them."""
    config = {**config, "isolation.level": "read_committed"}

    def ask() -> tuple[Consumer, TopicPartition]:
        reader = mark_reader(config)
        try:
            (committed,) = reader.committed([tp], timeout=timeout)
            if committed.error is not None and committed.error.code() in COORDINATOR_MOVING:
                raise KafkaException(committed.error)
        except KafkaException:
            discard(config)  # the next ask starts from a new consumer
            raise
        return reader, committed

    reader, committed = retry_transient(
        ask,
        coordinator_moving,
        within_s=timeout,
        backoff_s=_COORDINATOR_BACKOFF_S,
        what=f"{config.get('group.id')}: reading the done-mark",
        level=logging.WARNING,
    )
    if committed.error is not None:
        discard(config)
        raise DoneMarkError(f"{config.get('group.id')}: {committed.error}")
    return reader, committed.offset


class OffsetsTransaction:
    """One transaction of records and a consumer-group offset, by a fencing producer: the
    steps the sink's tasks (done-marks) and the mirror's (source positions) share.

    fence() bumps the epoch of the transactional id; read_offset() then reads the group's
    offset, stable from now on; begin() opens the transaction on first use; commit_with() adds
    the new offset and commits.
    """

    def __init__(self, transactional_id: str, timeout_s: float) -> None:
        self.transactional_id = transactional_id
        self.timeout_s = timeout_s
        self._producer: Producer | None = None
        self._group: Consumer | None = None
        self._open = False

    def fence(self, producer_config: dict[str, object], topic: str) -> None:
        self._producer = fencing_producer(
            producer_config, self.transactional_id, topic, self.timeout_s
        )

    def read_offset(self, consumer_config: dict[str, object], tp: TopicPartition) -> int:
        self._group, offset = committed_offset(consumer_config, tp, self.timeout_s)
        return offset

    def begin(self) -> Producer:
        assert self._producer is not None, "fence() first"
        if not self._open:
            self._producer.begin_transaction()
            self._open = True
        return self._producer

    def commit_with(self, offset: TopicPartition) -> None:
        """Commit the records with `offset` for the group read by read_offset()."""
        assert self._producer is not None and self._group is not None and self._open
        try:
            self._producer.send_offsets_to_transaction(
                [offset], self._group.consumer_group_metadata(), self.timeout_s
            )
            self._producer.commit_transaction(self.timeout_s)
        except KafkaException as exc:
            if fenced(exc):
                raise TaskFencedError(
                    f"{self.transactional_id}: fenced by a newer attempt before commit"
                ) from exc
            raise
        self._open = False

    def abort(self) -> None:
        """Best effort: a transaction left open is aborted by the next attempt's init anyway."""
        if self._producer is None or not self._open:
            return
        self._open = False
        try:
            self._producer.abort_transaction(self.timeout_s)
        except KafkaException as exc:
            log.warning(
                "%s: abort failed (%s); the next attempt fences it", self.transactional_id, exc
            )

    def close(self) -> None:
        self._group = None  # shared with later tasks of this worker (mark_readers)
        self._producer = None


class TaskTransaction(OffsetsTransaction):
    """The steps of one exactly-once write task; `write_exactly_once` runs them in order.

    open() fences and reads the mark; produce() opens the transaction on first use; commit()
    adds the mark and commits. Tests drive the steps of two attempts by hand to interleave them.
    """

    def __init__(
        self, target: SinkTarget, prefix: str, partition: int, batch_id: int, mark_topic: str
    ) -> None:
        super().__init__(transactional_id(prefix, partition), target.timeout_s)
        self.target = target
        self.partition = partition
        self.batch_id = batch_id
        self.mark_topic = mark_topic
        self.group = done_mark_group(prefix, partition)
        self.rows = 0

    def open(self) -> DoneMark | None:
        """Fence earlier attempts of this task, then read its done-mark (stable from now on)."""
        self.fence(self.target.producer_config(), self.mark_topic)
        return self.read_mark()

    def read_mark(self) -> DoneMark | None:
        offset = self.read_offset(
            self.target.consumer_config(**{"group.id": self.group}),
            TopicPartition(self.mark_topic, 0),
        )
        return DoneMark.from_offset(offset)

    def produce(self, batch: pa.RecordBatch) -> int:
        n = produce_batch(self.begin(), batch, self.target.columns, self.target.topic)
        self.rows += n
        return n

    def commit(self, position: int) -> None:
        """Commit the rows with the mark "the first `position` rows of this batch are done"."""
        offset = DoneMark(self.batch_id, position).to_offset()
        self.commit_with(TopicPartition(self.mark_topic, 0, offset))


def write_exactly_once(
    target: SinkTarget,
    prefix: str,
    partition: int,
    attempt: int,
    batch_id: int,
    batches: Iterable[pa.RecordBatch],
) -> TaskOutcome:
    """Write the task's rows not yet committed, in one transaction with the new done-mark."""
    rest = iter(batches)
    first = next((b for b in rest if b.num_rows), None)
    if first is None:
        # nothing to write in any attempt: no transaction, no mark
        return TaskOutcome(batch_id=batch_id, partition=partition, attempt=attempt, rows=0)
    txn = TaskTransaction(
        target, prefix, partition, batch_id, target.columns.first_topic(first, target.topic)
    )
    position = 0
    try:
        mark = txn.open()
        skip = mark.rows_done(batch_id) if mark is not None else 0
        for batch in _chain(first, rest):
            n = batch.num_rows
            if skip is None or position + n <= skip:
                position += n  # committed by an earlier attempt; Spark wants the input drained
                continue
            if position < skip:
                batch = batch.slice(skip - position)
                position = skip
            position += txn.produce(batch)
        if txn.rows:
            txn.commit(position)
    except BaseException:
        txn.abort()
        raise
    finally:
        txn.close()
    if txn.rows == 0:
        log.info("%s: batch %d already committed, wrote nothing", txn.transactional_id, batch_id)
    return TaskOutcome(
        batch_id=batch_id,
        partition=partition,
        attempt=attempt,
        rows=txn.rows,
        rows_already_committed=position - txn.rows,
        transactional_id=txn.transactional_id,
    )


def _chain(first: pa.RecordBatch, rest: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
    yield first
    yield from rest
