"""Executor side of the source: read exactly the offsets [start, end) of one partition.

Aborted records (under read_committed) and transaction markers occupy offsets that are never
delivered, so the read stops on the consumer's position reaching `end`, never on a count of
records; it gives up only when nothing moves for `poll_timeout_ms`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from onceflow.spark.offset_ranges import OffsetRange
from onceflow.spark.record_columns import RecordColumns

log = logging.getLogger(__name__)

BATCH_ROWS = 10_000
"""Rows per Arrow batch handed to Spark (Spark's default maxRecordsPerBatch)."""


class RangeReadTimeout(TimeoutError):
    """The consumer made no progress towards the end of its range within the poll timeout."""


class DataLossError(RuntimeError):
    """Offsets of the planned range are gone from the log (retention, or a recreated topic)."""


def consumer_config(client: dict[str, str]) -> dict[str, object]:
    """The source's consumer: assigned partitions only, never commits, reports partition EOF."""
    return {
        "group.id": "onceflow-source",
        # fewer, bigger fetches: each costs a round trip per partition
        "max.partition.fetch.bytes": 8 * 1024 * 1024,
        # a task's consumer lives for one range: connect to the advertised broker at once
        "reconnect.backoff.ms": 10,
        **client,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # we check for lost offsets ourselves (failOnDataLoss), against the log start offset
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
    }


def read_range(
    client: dict[str, str],
    offsets: OffsetRange,
    schema: pa.Schema,
    *,
    poll_timeout_ms: int = 120_000,
    fail_on_data_loss: bool = True,
    batch_rows: int = BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of `offsets` the isolation level lets through, as Arrow batches."""
    if offsets.size == 0:
        return
    tp = TopicPartition(offsets.topic, offsets.partition, offsets.start)
    consumer = Consumer(consumer_config(client))
    try:
        consumer.assign([tp])
        columns = RecordColumns(schema, offsets.topic, offsets.partition)
        end = offsets.end
        position = offsets.start
        checked_loss = False
        last_error: KafkaError | None = None
        deadline = time.monotonic() + poll_timeout_ms / 1000.0
        while position < end:
            before = position
            eof_past_end = False
            # consume() waits its whole timeout unless `num_messages` arrive: block in poll()
            # for the first message only, then take what is already queued
            first = consumer.poll(0.2)
            messages = [] if first is None else [first]
            if first is not None and first.error() is None and first.offset() + 1 < end:
                wanted = min(batch_rows, end - first.offset() - 1)
                messages += consumer.consume(num_messages=wanted, timeout=0)
            if any(m.error() is not None for m in messages):
                data = []
                for message in messages:
                    error = message.error()
                    if error is None:
                        data.append(message)
                    elif error.code() == KafkaError._PARTITION_EOF:
                        # everything below the EOF offset has been delivered or skipped
                        eof_past_end = eof_past_end or message.offset() >= end
                    elif error.fatal():
                        raise KafkaException(error)
                    else:
                        last_error = error  # transient (broker down, ...): the client retries
                messages = data
            if messages:
                reached_end = messages[-1].offset() >= end
                if reached_end:
                    messages = [m for m in messages if m.offset() < end]
                if messages:
                    first = messages[0].offset()
                    if first < position:
                        raise DataLossError(
                            f"{offsets.topic}/{offsets.partition}: got offset {first} while "
                            f"reading from {position}: the consumer was reset"
                        )
                    if not checked_loss and first > offsets.start:
                        _check_data_loss(consumer, offsets, fail_on_data_loss)
                    checked_loss = True
                    columns.extend(messages)
                    position = max(position, messages[-1].offset() + 1)
                if reached_end:
                    position = end
            if eof_past_end:
                position = end
            if position < end:
                # markers and aborted batches move the position without delivering anything
                current = consumer.position([tp])[0].offset
                if current > position:
                    position = current
            if len(columns) >= batch_rows or (position >= end and len(columns)):
                yield columns.take()
            now = time.monotonic()
            if position > before:
                deadline = now + poll_timeout_ms / 1000.0
            elif now > deadline:
                raise RangeReadTimeout(
                    f"{offsets.topic}/{offsets.partition}: stuck at offset {position} of "
                    f"[{offsets.start}, {end}) for {poll_timeout_ms} ms"
                    + (f" (last error: {last_error})" if last_error else "")
                )
    finally:
        consumer.close()


def _check_data_loss(consumer: Consumer, offsets: OffsetRange, fail: bool) -> None:
    """A first record past `start` is normal (markers, aborted data); a log start past it is not."""
    tp = TopicPartition(offsets.topic, offsets.partition)
    low, _high = consumer.get_watermark_offsets(tp, timeout=30, cached=False)
    if low > offsets.start:
        message = (
            f"{offsets.topic}/{offsets.partition}: offsets [{offsets.start}, {low}) were "
            "planned but are no longer in the log"
        )
        if fail:
            raise DataLossError(message + " (set failOnDataLoss=false to skip them)")
        log.warning("%s; skipped (failOnDataLoss=false)", message)
