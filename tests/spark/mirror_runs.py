"""What the mirror's Spark tests share: a source written in transactions (some aborted), the
check that a target holds exactly the committed records, the mirror's positions, and the
mirror started in this process or as a driver subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.kafka_errors import coordinator_moving, retry_transient
from onceflow.librdkafka_log import QUIET
from onceflow.mirror.positions import mirror_group
from onceflow.pipelines import mirror
from tests.waiting import wait_for

from .conftest import ROOT
from .kafka_io import end_offsets, wait_stable

BASE_TIME_MS = 1_600_000_000_000


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


class Source:
    """Writes a source topic in transactions (every third aborted) and keeps what committed."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int = 2, base_time_ms: int = BASE_TIME_MS
    ) -> None:
        """`base_time_ms`: the first record's CreateTime (the mirror keeps it; Apache Kafka's
        time retention deletes records older than retention.ms, 7 days by default)."""
        self.bootstrap = bootstrap
        self.base_time_ms = base_time_ms
        self.topic = topic
        self.partitions = partitions
        self.committed: list[Record] = []
        self.written = 0
        self.transactions = 0

    def write(self, records: int, per_transaction: int = 40) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": f"writer-{self.topic}",
                "logger": QUIET,
            }
        )
        producer.init_transactions(30)
        delivered: list[Record] = []
        sent_headers: dict[bytes, tuple[tuple[str, bytes | None], ...]] = {}

        def on_delivery(err: KafkaError | None, msg: object) -> None:
            assert err is None, err
            delivered.append(
                Record(
                    msg.partition(),  # type: ignore[attr-defined]
                    msg.offset(),  # type: ignore[attr-defined]
                    msg.key(),  # type: ignore[attr-defined]
                    msg.value(),  # type: ignore[attr-defined]
                    # delivery reports carry no headers: those sent with this value
                    sent_headers[msg.value()],  # type: ignore[attr-defined]
                    msg.timestamp()[1],  # type: ignore[attr-defined]
                )
            )

        for first in range(0, records, per_transaction):
            delivered.clear()
            producer.begin_transaction()
            for _ in range(min(per_transaction, records - first)):
                i = self.written
                self.written += 1
                value = f"v{i}".encode() * 3
                headers = (("n", str(i).encode()), ("empty", None)) if i % 2 else ()
                sent_headers[value] = headers
                producer.produce(
                    self.topic,
                    value=value,
                    key=None if i % 7 == 0 else f"k{i}".encode(),
                    partition=i % self.partitions,
                    headers=list(headers) or None,
                    timestamp=self.base_time_ms + i,
                    on_delivery=on_delivery,
                )
            producer.flush(30)
            self.transactions += 1
            if self.transactions % 3 == 0:
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
                self.committed += delivered

    def expected(self) -> dict[int, list[Record]]:
        by_partition: dict[int, list[Record]] = {}
        for r in sorted(self.committed, key=lambda r: (r.partition, r.offset)):
            by_partition.setdefault(r.partition, []).append(r)
        return by_partition


def read_records(bootstrap: str, topic: str) -> dict[int, list[Record]]:
    """Everything a read_committed consumer sees in `topic`, per partition, in order."""
    wait_stable(bootstrap, topic)
    ends = {p: e for p, e in end_offsets(bootstrap, topic, "read_committed").items() if e > 0}
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "mirror-test-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "logger": QUIET,
        }
    )
    out: dict[int, list[Record]] = {p: [] for p in ends}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])

        def done() -> bool:
            for msg in consumer.consume(1000, 0.2):
                assert msg.error() is None, msg.error()
                if msg.offset() < ends[msg.partition()]:
                    kind, stamp = msg.timestamp()
                    assert kind == 1, "CreateTime kept"
                    out[msg.partition()].append(
                        Record(
                            msg.partition(),
                            msg.offset(),
                            msg.key(),
                            msg.value(),
                            tuple(msg.headers() or ()),
                            stamp,
                        )
                    )
            positions = consumer.position([TopicPartition(topic, p) for p in ends])
            return all(tp.offset >= ends[tp.partition] for tp in positions)

        wait_for(done, 60, f"reading {topic} to {ends}")
    finally:
        consumer.close()
    return out


def check_mirrored(source: Source, target_bootstrap: str, target_topic: str) -> None:
    """Each partition of the target holds exactly the committed source records, in order,
    with key, value, headers and timestamp: nothing missing, nothing twice, nothing aborted."""
    got = read_records(target_bootstrap, target_topic)
    want = source.expected()

    def fields(records: list[Record]) -> list[tuple[object, ...]]:
        return [(r.key, r.value, r.headers, r.timestamp) for r in records]

    for partition in sorted(set(got) | set(want)):
        mine, theirs = fields(got.get(partition, [])), fields(want.get(partition, []))
        assert len(mine) == len(theirs), (
            f"partition {partition}: {len(mine)} records mirrored, {len(theirs)} committed"
        )
        assert mine == theirs, f"partition {partition}: records differ"


def committed_offsets(consumer: Consumer, tps: list[TopicPartition]) -> list[TopicPartition]:
    """consumer.committed(), asked again while the group's coordinator moves (a Kafka cluster
    whose node was killed, or whose __consumer_offsets is being made)."""
    return retry_transient(
        lambda: consumer.committed(tps, 30),
        coordinator_moving,
        within_s=60,
        backoff_s=0.5,
        what="committed offsets",
    )


def positions(bootstrap: str, alias: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": mirror_group(alias),
            "isolation.level": "read_committed",
            "logger": QUIET,
        }
    )
    try:
        tps = committed_offsets(consumer, [TopicPartition(topic, p) for p in range(partitions)])
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def caught_up(source: Source, target: str, target_topic: str, alias: str = "source") -> bool:
    """The target's positions are past every committed source record."""
    last = {p: records[-1].offset + 1 for p, records in source.expected().items()}
    held = positions(target, alias, target_topic, source.partitions)
    return all(held.get(p, -1) >= offset for p, offset in last.items())


@pytest.fixture(name="clusters")
def two_clusters(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> Iterator[tuple[EmbeddedBroker, EmbeddedBroker]]:
    yield make_broker(tmp_path / "source"), make_broker(tmp_path / "target")


def start_mirror(
    spark: SparkSession, src: str, dst: str, checkpoint: Path, **kw: object
) -> StreamingQuery:
    return mirror.start(
        spark,
        checkpoint=str(checkpoint),
        source=src,
        target=dst,
        topics=kw.pop("topics", "orders.*"),
        max_offsets_per_trigger=kw.pop("max_offsets_per_trigger", 120),
        target_properties={"transaction.timeout.ms": "20000"},
        **kw,
    )


def mirror_driver(
    src: str, dst: str, checkpoint: Path, log: Path, *extra: str, topics: str = "orders"
) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "onceflow.pipelines.mirror",
            "--source-bootstrap-server",
            src,
            "--target-bootstrap-server",
            dst,
            "--topics",
            topics,
            "--checkpoint",
            str(checkpoint),
            "--max-offsets-per-trigger",
            "150",
            "--progress-interval",
            "2",
            "--target-property",
            "transaction.timeout.ms=20000",
            *extra,  # a later --target-property transaction.timeout.ms=... wins
        ],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the kill takes its JVM and Python workers too
    )


def _read_first(consumer: Consumer, topic: str, partition: int, count: int) -> list[int]:
    """The offsets of the first `count` records `consumer` reads from the partition's start."""
    consumer.assign([TopicPartition(topic, partition, 0)])
    seen: list[int] = []

    def enough() -> bool:
        for msg in consumer.consume(count - len(seen), 0.2):
            assert msg.error() is None, msg.error()
            seen.append(msg.offset())
        return len(seen) >= count

    wait_for(enough, 60, f"reading {count} records of {topic}/{partition}")
    return seen


def consume_and_commit(
    bootstrap: str, group: str, topic: str, counts: dict[int, int]
) -> dict[int, int]:
    """Group `group` reads the first counts[p] records of each partition (read_committed) and
    commits its position, as an application does; the committed offsets."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "logger": QUIET,
        }
    )
    committed: dict[int, int] = {}
    try:
        for partition, count in counts.items():
            committed[partition] = _read_first(consumer, topic, partition, count)[-1] + 1
        consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in committed.items()], asynchronous=False
        )
    finally:
        consumer.close()
    return committed


def group_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets (negative: none)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "logger": QUIET})
    try:
        tps = committed_offsets(consumer, [TopicPartition(topic, p) for p in range(partitions)])
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def resume(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, list[bytes]]:
    """What group `group` reads when it resumes from its committed offsets to the end, per
    partition (values, read_committed)."""
    ends = end_offsets(bootstrap, topic, "read_committed")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",  # no committed offset: fail, never guess
            "logger": QUIET,
        }
    )
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])  # committed

        def done() -> bool:
            for msg in consumer.consume(1000, 0.2):
                assert msg.error() is None, msg.error()
                out[msg.partition()].append(msg.value())
            return all(
                tp.offset >= ends.get(tp.partition, 0)
                for tp in consumer.position([TopicPartition(topic, p) for p in range(partitions)])
            )

        wait_for(done, 60, f"{group} resuming on {topic}")
    finally:
        consumer.close()
    return out


def after(source: Source, offsets: dict[int, int]) -> dict[int, list[bytes]]:
    """The committed source records from `offsets` on, per partition (values)."""
    return {
        p: [r.value for r in records if r.offset >= offsets.get(p, 0)]
        for p, records in source.expected().items()
    }
