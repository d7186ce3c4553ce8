"""Kafka helpers for the Spark tests: topics, producing (plain and transactional), reading back."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from tests.waiting import wait_for


def _client(bootstrap: str, config: Mapping[str, object] | None) -> dict[str, object]:
    """A client of `bootstrap`, with `config` (security settings, ...) on top."""
    return {"bootstrap.servers": bootstrap, **(config or {})}


def create_topic(
    bootstrap: str, name: str, partitions: int = 2, config: Mapping[str, object] | None = None
) -> None:
    admin = AdminClient(_client(bootstrap, config))
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=30)


def add_partitions(bootstrap: str, name: str, total: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(name, total)])[name].result(timeout=30)


def produce(
    bootstrap: str,
    topic: str,
    values: Iterable[str],
    partition: int | None = None,
    config: Mapping[str, object] | None = None,
) -> None:
    """Plain produce, one record per value (key = value), waiting for every delivery."""
    errors: list[KafkaError] = []
    producer = Producer({**_client(bootstrap, config), "linger.ms": 5, "acks": "all"})
    for value in values:
        kwargs = {} if partition is None else {"partition": partition}
        producer.produce(
            topic,
            value.encode(),
            value.encode(),
            on_delivery=lambda err, _m: errors.append(err) if err else None,
            **kwargs,
        )
    assert producer.flush(30) == 0
    assert errors == []


def produce_transaction(
    bootstrap: str, topic: str, values: Iterable[str], *, commit: bool, txn_id: str
) -> None:
    """One transaction of `values` spread over the topic's partitions, committed or aborted."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value.encode(), value.encode())
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)
        producer.abort_transaction(30)


def end_offsets(
    bootstrap: str, topic: str, isolation: str, config: Mapping[str, object] | None = None
) -> dict[int, int]:
    """Per partition: last stable offset (read_committed) or high watermark."""
    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import OffsetSpec

    admin = AdminClient(_client(bootstrap, config))
    metadata = admin.list_topics(topic, timeout=30)
    level = (
        IsolationLevel.READ_COMMITTED
        if isolation == "read_committed"
        else IsolationLevel.READ_UNCOMMITTED
    )
    futures = admin.list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest() for p in metadata.topics[topic].partitions},
        isolation_level=level,
        request_timeout=30,
    )
    return {tp.partition: f.result().offset for tp, f in futures.items()}


def wait_stable(
    bootstrap: str, topic: str, timeout: float = 30, config: Mapping[str, object] | None = None
) -> None:
    """Wait until no transaction is open on `topic`: last stable offsets = high watermarks."""
    wait_for(
        lambda: (
            end_offsets(bootstrap, topic, "read_committed", config)
            == end_offsets(bootstrap, topic, "read_uncommitted", config)
        ),
        timeout,
        f"every transaction on {topic} to complete (one stayed open)",
    )


def read_values(
    bootstrap: str,
    topic: str,
    isolation: str = "read_committed",
    timeout: float = 60,
    config: Mapping[str, object] | None = None,
) -> list[str]:
    """Every value visible at `isolation` up to the current end offsets, in partition order.

    Under read_committed it first waits for every transaction to be complete (last stable
    offset = high watermark): commit markers are written after commit_transaction() returns.
    """
    if isolation == "read_committed":
        wait_stable(bootstrap, topic, config=config)
    ends = end_offsets(bootstrap, topic, isolation, config)
    consumer = Consumer(
        {
            **_client(bootstrap, config),
            "group.id": "spark-tests-reader",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    wanted = {p: end for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(topic, p, 0) for p in wanted])
    values: list[str] = []
    positions = dict.fromkeys(wanted, 0)
    deadline = time.monotonic() + timeout
    try:
        while any(positions[p] < wanted[p] for p in wanted):
            assert time.monotonic() < deadline, f"read {positions} of {wanted}"
            for msg in consumer.consume(1000, timeout=0.2):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        positions[msg.partition()] = max(positions[msg.partition()], msg.offset())
                        continue
                    raise AssertionError(msg.error())
                if msg.offset() < wanted[msg.partition()]:
                    values.append(msg.value().decode())
                positions[msg.partition()] = msg.offset() + 1
            for tp in consumer.position([TopicPartition(topic, p) for p in wanted]):
                positions[tp.partition] = max(positions[tp.partition], tp.offset)
    finally:
        consumer.close()
    return values


def duplicates(values: Iterable[str]) -> int:
    """How many values appear more than once, counted as extra copies."""
    return sum(n - 1 for n in Counter(values).values() if n > 1)


def committed_batches(checkpoint: Path) -> list[int]:
    """Batch ids in a streaming checkpoint's commit log."""
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return []
    return sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit())


def forget_commit(checkpoint: Path, batch_id: int) -> None:
    """Delete a batch from the commit log (and its checksum), as a crash before writing it."""
    commits = checkpoint / "commits"
    (commits / str(batch_id)).unlink()
    (commits / f".{batch_id}.crc").unlink(missing_ok=True)


def batch_in_flight(checkpoint: Path) -> int | None:
    """The batch id planned in the offset log but not yet in the commit log, if any."""
    offsets = checkpoint / "offsets"
    if not offsets.is_dir():
        return None
    planned = sorted(int(p.name) for p in offsets.iterdir() if p.name.isdigit())
    done = set(committed_batches(checkpoint))
    pending = [b for b in planned if b not in done]
    return pending[-1] if pending else None


def output_size(bootstrap: str, topic: str) -> int:
    """Records (and markers) in a topic: the sum of its high watermarks."""
    return sum(end_offsets(bootstrap, topic, "read_uncommitted").values())


def wait_mid_batch(
    checkpoint: Path, bootstrap: str, out: str, after_batch: int, timeout: float
) -> int:
    """Wait until a batch after `after_batch` is in flight and has written part of its output.

    Returns that batch id. The moment to crash something to leave a batch half-written.
    """

    def mid_batch() -> int | None:
        batch = batch_in_flight(checkpoint)
        if batch is None or batch <= after_batch:
            return None
        start = output_size(bootstrap, out)
        deadline = time.monotonic() + 10
        while batch_in_flight(checkpoint) == batch and time.monotonic() < deadline:
            if output_size(bootstrap, out) > start:
                return batch
            time.sleep(0.02)
        return None

    return wait_for(mid_batch, timeout, f"a batch after {after_batch} part-written to {out}")
