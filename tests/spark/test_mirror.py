"""`onceflow run mirror`: two brokers, a source written by transactional producers that also
abort, mirrored exactly once through SIGKILLs of either broker and of the driver, and after
the checkpoint is deleted; the same check catches the plain at-least-once mirror."""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from pyspark.sql import SparkSession

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.librdkafka_log import QUIET
from onceflow.mirror.mirror_transaction import runs
from onceflow.mirror.progress import MirrorProgress, lag_per_topic, rows_since
from onceflow.mirror.replication_policy import (
    ReplicationPolicy,
    ReplicationPolicyError,
    subscription_pattern,
)
from onceflow.pipelines import mirror
from tests.process_group import kill_process_group
from tests.waiting import wait_for

from .kafka_io import add_partitions, create_topic
from .mirror_runs import (
    Source,
    after,
    caught_up,
    check_mirrored,
    consume_and_commit,
    mirror_driver,
    positions,
    resume,
    start_mirror,
    two_clusters,  # noqa: F401 (the fixture `clusters`)
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

    query = start_mirror(spark, src, dst, checkpoint)
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
    query = start_mirror(spark, src, dst, checkpoint)
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
        query = start_mirror(spark, src, dst, checkpoint, policy="identity", exactly_once=False)
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        shutil.rmtree(checkpoint)
    with pytest.raises(AssertionError, match="records mirrored"):
        check_mirrored(orders, dst, "orders")


@pytest.mark.slow
@pytest.mark.timeout(600)  # its own waits add up to 450 s (two driver processes start)
def test_driver_sigkilled_mid_stream_then_restarted(
    clusters: tuple[EmbeddedBroker, EmbeddedBroker], tmp_path: Path
) -> None:
    src, dst = clusters[0].bootstrap, clusters[1].bootstrap
    create_topic(src, "orders", 2)
    orders = Source(src, "orders")
    orders.write(1500, per_transaction=50)
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"
    # an application's group on the source, to fail over to the target at the end
    app = consume_and_commit(src, "app", "orders", {0: 200, 1: 333})
    groups = ("--groups", "app", "--sync-group-offsets-interval", "1s")

    driver = mirror_driver(src, dst, checkpoint, log, *groups)
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
        kill_process_group(driver)
    assert not caught_up(orders, dst, "source.orders"), "killed too late to test anything"
    orders.write(100)
    again = mirror_driver(src, dst, checkpoint, log, "--until-caught-up", *groups)
    try:
        assert again.wait(240) == 0, log.read_text()[-3000:]
    finally:
        kill_process_group(again)
    check_mirrored(orders, dst, "source.orders")
    assert "records/s, lag: orders=" in log.read_text()
    # translated by the killed driver or the final pass of the new one (its index rebuilt from
    # the offset syncs): either way the group resumes on the target exactly where it stood
    assert "mirror: groups: app: source.orders/" in log.read_text()
    assert resume(dst, "app", "source.orders", 2) == after(orders, app)


def test_default_policy_onto_the_same_cluster_copies_each_topic_once(
    spark: SparkSession, make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    """One cluster as source and target: orders becomes source.orders, and source.orders, the
    mirror's own copy, is not mirrored again (no source.source.orders, and so on without end);
    the identity policy there is refused before any query starts."""
    bootstrap = make_broker(tmp_path / "data").bootstrap
    create_topic(bootstrap, "orders", 2)
    orders = Source(bootstrap, "orders")
    orders.write(120)
    checkpoint = tmp_path / "checkpoint"
    query = start_mirror(spark, bootstrap, bootstrap, checkpoint, topics=".*")
    try:
        wait_for(lambda: caught_up(orders, bootstrap, "source.orders"), 120, "the copy")
        orders.write(80)  # more triggers, each of which lists the topics again
        wait_for(lambda: caught_up(orders, bootstrap, "source.orders"), 120, "the copy")
        assert query.exception() is None
    finally:
        query.stop()
    names = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics
    assert sorted(n for n in names if not n.startswith("__") and "internal" not in n) == [
        "orders",
        "source.orders",
    ]
    check_mirrored(orders, bootstrap, "source.orders")
    with pytest.raises(mirror.MirrorLoopError, match="identity"):
        start_mirror(spark, bootstrap, bootstrap, checkpoint, topics=".*", policy="identity")


def test_a_record_too_large_for_the_target_stops_the_driver_in_one_line(
    clusters: tuple[EmbeddedBroker, EmbeddedBroker], tmp_path: Path
) -> None:
    """The target topic takes 10,000-byte batches; the source's sixth record is 20,000 bytes.
    The mirror copies the five before it, then stops with one line naming the record and the
    limit (it was the last line of a Spark traceback, after four futile task attempts)."""
    src, dst = clusters[0].bootstrap, clusters[1].bootstrap
    create_topic(src, "orders", 1)
    target = AdminClient({"bootstrap.servers": dst, "logger": QUIET})
    topic = NewTopic("source.orders", 1, 1, config={"max.message.bytes": "10000"})
    target.create_topics([topic])["source.orders"].result(30)
    producer = Producer({"bootstrap.servers": src, "logger": QUIET})
    for value in [b"small"] * 5 + [b"B" * 20_000, b"after"]:
        producer.produce("orders", value, partition=0)
    assert producer.flush(30) == 0
    log = tmp_path / "driver.log"
    driver = mirror_driver(src, dst, tmp_path / "checkpoint", log, "--until-caught-up")
    try:
        assert driver.wait(300) == 1, log.read_text()[-3000:]
    finally:
        kill_process_group(driver)
    output = log.read_text()
    last = output.strip().splitlines()[-1]
    assert re.fullmatch(
        r"mirror: error: the record at offset 5 of orders/0 is 200\d\d bytes, more than "
        r"source.orders on the target takes \(max.message.bytes=10000\); raise that, then "
        r"restart the mirror",
        last,
    ), output[-3000:]
    assert "StreamingQueryException" not in output, output[-3000:]
    assert positions(dst, "source", "source.orders", 1) == {0: 5}


@pytest.mark.parametrize(
    ("regexes", "message"),
    [
        (["--topics", "orders("], "--topics 'orders(' is not a regex"),
        (["--topics", "orders", "--groups", "app("], "--groups 'app(' is not a regex"),
    ],
)
def test_bad_regex_is_one_line(
    regexes: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    addresses = ["--source-bootstrap-server", "a:1", "--target-bootstrap-server", "b:1"]
    with pytest.raises(SystemExit) as exit_:
        mirror.main([*addresses, *regexes, "--checkpoint", "/nonexistent"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err


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
