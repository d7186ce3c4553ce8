"""`onceflow run mirror`: two brokers, a source written by transactional producers that also
abort, mirrored exactly once through SIGKILLs of either broker and of the driver, and after
the checkpoint is deleted; the same check catches the plain at-least-once mirror."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.librdkafka_log import QUIET
from onceflow.mirror.mirror_transaction import runs
from onceflow.mirror.positions import mirror_group
from onceflow.mirror.progress import MirrorProgress, lag_per_topic, rows_since
from onceflow.mirror.replication_policy import (
    ReplicationPolicy,
    ReplicationPolicyError,
    subscription_pattern,
)
from onceflow.pipelines import mirror
from tests.waiting import wait_for

from .conftest import ROOT
from .kafka_io import add_partitions, create_topic, end_offsets, wait_stable

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

    def __init__(self, bootstrap: str, topic: str, partitions: int = 2) -> None:
        self.bootstrap = bootstrap
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
                    timestamp=BASE_TIME_MS + i,
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
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 30)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def caught_up(source: Source, target: str, target_topic: str, alias: str = "source") -> bool:
    """The target's positions are past every committed source record."""
    last = {p: records[-1].offset + 1 for p, records in source.expected().items()}
    held = positions(target, alias, target_topic, source.partitions)
    return all(held.get(p, -1) >= offset for p, offset in last.items())


@pytest.fixture
def clusters(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> Iterator[tuple[EmbeddedBroker, EmbeddedBroker]]:
    yield make_broker(tmp_path / "source"), make_broker(tmp_path / "target")


def _start(
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


def test_mirror_through_both_brokers_killed_then_without_checkpoint(
    spark: SparkSession, clusters: tuple[EmbeddedBroker, EmbeddedBroker], tmp_path: Path
) -> None:
    source_broker, target_broker = clusters
    src, dst = source_broker.bootstrap, target_broker.bootstrap
    admin = AdminClient({"bootstrap.servers": src})
    # a topic config of its own, which the target topic must get
    admin.create_topics([NewTopic("orders", 2, 1, config={"retention.ms": "86400000"})])[
        "orders"
    ].result(30)
    orders = Source(src, "orders")
    orders.write(400)
    checkpoint = tmp_path / "checkpoint"

    query = _start(spark, src, dst, checkpoint)
    try:
        wait_for(
            lambda: positions(dst, "source", "source.orders", 2).get(0, -1) > 0,
            120,
            "a first transaction on the target",
        )
        target_broker.kill()
        threading.Event().wait(1.0)
        target_broker.start()
        orders.write(200)
        source_broker.kill()
        threading.Event().wait(1.0)
        source_broker.start()
        orders.write(200)
        wait_for(lambda: caught_up(orders, dst, "source.orders"), 180, "the mirror to catch up")
        assert query.exception() is None
    finally:
        query.stop()
    check_mirrored(orders, dst, "source.orders")
    # the target topic was made like the source's: partitions and its own configs
    configs = AdminClient({"bootstrap.servers": dst})
    target = ConfigResource(ResourceType.TOPIC, "source.orders")
    assert configs.describe_configs([target])[target].result(30)["retention.ms"].value == "86400000"

    # No checkpoint: the target says where to start. A new topic and a new partition too.
    shutil.rmtree(checkpoint)
    orders.write(200)
    add_partitions(src, "orders", 3)
    orders.partitions = 3
    orders.write(120)
    create_topic(src, "orders-eu", 1)
    eu = Source(src, "orders-eu", 1)
    eu.write(90)
    query = _start(spark, src, dst, checkpoint)
    try:
        wait_for(
            lambda: (
                caught_up(orders, dst, "source.orders") and caught_up(eu, dst, "source.orders-eu")
            ),
            180,
            "the mirror to catch up without its checkpoint",
        )
        assert query.exception() is None
    finally:
        query.stop()
    check_mirrored(orders, dst, "source.orders")
    check_mirrored(eu, dst, "source.orders-eu")


def test_at_least_once_mirror_fails_the_same_check(
    spark: SparkSession, clusters: tuple[EmbeddedBroker, EmbeddedBroker], tmp_path: Path
) -> None:
    """The plain mirror keeps its position only in the checkpoint: losing it repeats all."""
    src, dst = clusters[0].bootstrap, clusters[1].bootstrap
    create_topic(src, "orders", 2)
    orders = Source(src, "orders")
    orders.write(120)
    checkpoint = tmp_path / "checkpoint"
    for _ in range(2):
        query = _start(spark, src, dst, checkpoint, policy="identity", exactly_once=False)
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        shutil.rmtree(checkpoint)
    with pytest.raises(AssertionError, match="records mirrored"):
        check_mirrored(orders, dst, "orders")


def _driver(src: str, dst: str, checkpoint: Path, log: Path, *extra: str) -> subprocess.Popen:
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
            "orders",
            "--checkpoint",
            str(checkpoint),
            "--max-offsets-per-trigger",
            "150",
            "--progress-interval",
            "2",
            "--target-property",
            "transaction.timeout.ms=20000",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the kill takes its JVM and Python workers too
    )


@pytest.mark.slow
def test_driver_sigkilled_mid_stream_then_restarted(
    clusters: tuple[EmbeddedBroker, EmbeddedBroker], tmp_path: Path
) -> None:
    src, dst = clusters[0].bootstrap, clusters[1].bootstrap
    create_topic(src, "orders", 2)
    orders = Source(src, "orders")
    orders.write(1500, per_transaction=50)
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"

    driver = _driver(src, dst, checkpoint, log)
    try:
        wait_for(
            lambda: (
                sum(max(o, 0) for o in positions(dst, "source", "source.orders", 2).values()) > 300
            ),
            180,
            lambda: f"the mirror to get going:\n{log.read_text()[-3000:]}",
        )
        assert driver.poll() is None
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
    assert not caught_up(orders, dst, "source.orders"), "killed too late to test anything"
    orders.write(100)
    again = _driver(src, dst, checkpoint, log, "--until-caught-up")
    try:
        assert again.wait(240) == 0, log.read_text()[-3000:]
    finally:
        if again.poll() is None:
            os.killpg(again.pid, signal.SIGKILL)
    check_mirrored(orders, dst, "source.orders")
    assert "records/s, lag: orders=" in log.read_text()


def test_bad_regex_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        mirror.main(
            [
                "--source-bootstrap-server",
                "a:1",
                "--target-bootstrap-server",
                "b:1",
                "--topics",
                "orders(",
                "--checkpoint",
                "/nonexistent",
            ]
        )
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--topics 'orders(' is not a regex" in err


def test_unreachable_cluster_is_one_line(
    bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        mirror.main(
            [
                "--source-bootstrap-server",
                bootstrap,
                "--target-bootstrap-server",
                "127.0.0.1:1",
                "--topics",
                "orders",
                "--checkpoint",
                "/nonexistent",
            ]
        )
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and "the target cluster at 127.0.0.1:1 is unreachable" in err[0]


def test_replication_policies_name_target_topics() -> None:
    assert ReplicationPolicy("default", "east").target_topic("orders") == "east.orders"
    assert ReplicationPolicy("identity", "east").target_topic("orders") == "orders"
    with pytest.raises(ReplicationPolicyError, match="--replication-policy"):
        ReplicationPolicy("prefix")
    with pytest.raises(ReplicationPolicyError, match="--source-alias"):
        ReplicationPolicy("default", "a.b")


def test_subscription_leaves_out_internal_topics() -> None:
    pattern = subscription_pattern(".*")
    names = ["orders", "__consumer_offsets", "mm2-offsets.internal", "x-internal", "a.replica"]
    assert [n for n in names if re.fullmatch(pattern, n)] == ["orders"]
    assert re.fullmatch(subscription_pattern("orders|pay.*"), "payments")
    assert not re.fullmatch(subscription_pattern("orders"), "orders-eu")


def test_runs_split_a_batch_by_source_partition() -> None:
    batch = pa.RecordBatch.from_pydict(
        {"topic": ["a", "a", "b", "b", "a"], "partition": [0, 0, 0, 0, 0]}
    )
    assert list(runs(batch)) == [("a", 0, 0, 2), ("b", 0, 2, 4), ("a", 0, 4, 5)]


def test_lag_and_rate_figures() -> None:
    latest = {("a", 0): 10, ("a", 1): 5, ("b", 0): 7}
    assert lag_per_topic(latest, {("a", 0): 4, ("b", 0): 9}) == {"a": 11, "b": 0}
    progress = [{"batchId": 1, "numInputRows": 5}, {"batchId": 2, "numInputRows": 7}]
    assert rows_since(progress, 1) == (7, 2)
    assert mirror.trigger_ms("500ms") == 500 and mirror.trigger_ms("2s") == 2000
    with pytest.raises(mirror.MirrorArgumentError):
        mirror.trigger_ms("soon")


def test_progress_line_of_the_plain_mirror_has_no_lag() -> None:
    """The plain mirror keeps no position in the target: records/s only."""
    line = MirrorProgress(None, None).line([{"batchId": 0, "numInputRows": 10}])  # type: ignore[arg-type]
    assert line.startswith("mirror: ") and line.endswith(" records/s")
