"""The consuming workload: one Consumer reads a whole topic back, on the clock."""

from __future__ import annotations

import secrets
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from rich.progress import Progress, TaskID

from onceflow.bench.errors import STALL_TIMEOUT_S, BenchError
from onceflow.bench.stats import Phase
from onceflow.tools.clients import REQUEST_TIMEOUT_S, ClientErrors, Cluster, client_config
from onceflow.tools.errors import kafka_error_text

CONSUME_BATCH = 10_000
# Read back as an application would: from the start, committed records only.
CONSUMER_SETTINGS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "max.partition.fetch.bytes": 4 * 1024 * 1024,
    "isolation.level": "read_committed",
    # librdkafka otherwise sleeps 1 s whenever its fetch queue is full (every target alike)
    "fetch.queue.backoff.ms": 10,
}


def consume_topic(
    bootstrap: str,
    topic: str,
    expected: int,
    settings: dict[str, Any],
    progress: Progress,
    task: TaskID,
    until_end: bool = False,
    uncounted: int = 0,
) -> Phase:
    """Read a whole topic with one Consumer; the clock runs until the expected-th record.

    With until_end, the consumer then reads on to the end of every partition (untimed) and
    a record beyond `expected` is a BenchError: that is how a read_committed run shows that
    no aborted record got through. `uncounted` records (the producers' empty warm-up
    records) are read on top of `expected` and left out of the figures.
    """
    expected += uncounted
    errors = ClientErrors()
    overrides = {"group.id": f"onceflow-bench-{secrets.token_hex(4)}", **settings}
    if until_end:
        overrides["enable.partition.eof"] = True
    consumer = Consumer(client_config(Cluster(bootstrap), errors, overrides))
    try:
        metadata = consumer.list_topics(topic, timeout=REQUEST_TIMEOUT_S)
        partitions = sorted(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        records = value_bytes = 0
        started = last_change = time.monotonic()
        seconds: float | None = None
        while seconds is None or (until_end and len(at_end) < len(partitions)):
            # consume() waits until it has num_messages or the timeout: ask for no more than
            # is left, or the last batch waits out the timeout on the clock.
            wanted = expected - records if seconds is None else len(partitions) - len(at_end)
            batch = consumer.consume(num_messages=max(1, min(CONSUME_BATCH, wanted)), timeout=0.5)
            for message in batch:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end.add(message.partition())
                        continue
                    raise BenchError(f"consume failed: {kafka_error_text(error)}")
                at_end.discard(message.partition())
                records += 1
                value_bytes += len(message)  # the value's length
            if seconds is None and records >= expected:
                seconds = time.monotonic() - started
            if batch:
                last_change = time.monotonic()
                progress.update(task, completed=min(records, expected))
            elif time.monotonic() - last_change > STALL_TIMEOUT_S:
                if seconds is None:
                    raise BenchError(f"consuming stalled at {records} of {expected} records")
                raise BenchError(f"no end of partition seen after {records} records")
            errors.raise_if_fatal()
    finally:
        consumer.close()
    if records != expected:
        raise BenchError(f"consumed {records} records, {expected} were produced")
    assert seconds is not None  # the loop ends only once the clock stopped
    return Phase(records - uncounted, value_bytes, seconds)
