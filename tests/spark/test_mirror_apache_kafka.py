"""`onceflow run mirror` with the 3-node Apache Kafka cluster on either side, exact through a
SIGKILL of the driver and of the target's leader.

onceflow -> Kafka is the migration path: a topic written in transactions (some aborted) and a
consumer group that stands mid-topic move from the embedded broker to the cluster; the group's
offsets are translated, and its consumer, failed over to the cluster, reads exactly the records
after its committed position while the mirror keeps copying what is still produced at the source.
Kafka -> onceflow: the onceflow broker (its own process) is the target's leader, SIGKILLed and
restarted on its data."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

from onceflow.apache_kafka import KafkaCluster
from onceflow.broker.embedded import EmbeddedBroker
from tests.confluent import QUIET
from tests.process_group import kill_process_group
from tests.waiting import wait_for

from .kafka_io import end_offsets
from .mirror_runs import (
    Source,
    after,
    caught_up,
    check_mirrored,
    consume_and_commit,
    group_offsets,
    mirror_driver,
    positions,
    resume,
)

# Longer than a Kafka leader's failover (broker.session.timeout.ms 9 s, then the election):
# a mirror transaction open on a killed leader is not timed out before it can commit.
KAFKA_TARGET = ("--target-property", "transaction.timeout.ms=60000")
# A driver's start (a Spark JVM, its Python workers) took 2.5 minutes on the shared 2-core
# machine with 20 JVMs running; the waits that include one are this generous.
DRIVER_DEADLINE_S = 600


def now_ms() -> int:
    """CreateTimes of now: the mirror keeps them, and Kafka's time retention (retention.ms, 7
    days by default) would delete copies of older records from the cluster."""
    return int(time.time() * 1000)


def driver_log(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:]


def kill_driver(driver: subprocess.Popen) -> None:
    """SIGKILL the driver with its JVM and Python workers (its own process group)."""
    kill_process_group(driver)


def mirrored(dst: str, alias: str, topic: str, partitions: int) -> int:
    """Source records the target holds a position past, over all partitions."""
    return sum(max(o, 0) for o in positions(dst, alias, topic, partitions).values())


def wait_mirrored(dst: str, alias: str, topic: str, above: int, log: Path, what: str) -> None:
    wait_for(
        lambda: mirrored(dst, alias, topic, 2) > above,
        DRIVER_DEADLINE_S,
        lambda: f"{what}:\n{driver_log(log)}",
    )


def fail_over(
    bootstrap: str, group: str, topic: str, partitions: int
) -> tuple[Consumer, dict[int, list[bytes]]]:
    """The application's consumer, moved to the target: group `group`, read_committed, from its
    committed offsets (none: an error, never a guess); what it reads, per partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            **QUIET,
        }
    )
    consumer.subscribe([topic])
    return consumer, {p: [] for p in range(partitions)}


def joined(consumer: Consumer, read: dict[int, list[bytes]]) -> bool:
    """Poll (keeping what is read) until the group has assigned the consumer its partitions."""
    read_on(consumer, read, dict)
    return len(consumer.assignment()) == len(read)


def read_on(consumer: Consumer, read: dict[int, list[bytes]], ends: Callable[[], dict]) -> bool:
    """Read what there is; True once the consumer's position is at `ends()` everywhere."""
    for msg in consumer.consume(500, 0.5):
        assert msg.error() is None, msg.error()
        read[msg.partition()].append(msg.value())
    assignment = consumer.assignment()
    if len(assignment) < len(read):
        return False
    want = ends()
    return all(tp.offset >= want.get(tp.partition, 0) for tp in consumer.position(assignment))


@pytest.mark.slow
# Two driver starts and a leader failover: 310 s on the shared 2-core machine (load 50).
@pytest.mark.timeout(1800)
def test_migration_from_onceflow_to_apache_kafka_with_group_fail_over(
    kafka_cluster3: KafkaCluster, make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    cluster = kafka_cluster3
    src, dst = make_broker(tmp_path / "source").bootstrap, cluster.bootstrap_servers
    tag = uuid.uuid4().hex[:8]
    # the identity policy, as the migration recipe: the topic keeps its name on the cluster
    topic, alias, group = f"orders-{tag}", f"embedded{tag}", f"app-{tag}"
    target = topic
    source_admin = AdminClient({"bootstrap.servers": src, **QUIET})
    made = source_admin.create_topics([NewTopic(topic, 2, 1, config={"retention.ms": "86400000"})])
    made[topic].result(30)
    orders = Source(src, topic, base_time_ms=now_ms())
    orders.write(300, per_transaction=20)  # every third transaction aborted
    # the application stands mid-transaction on partition 0, after a marker on partition 1
    app = consume_and_commit(src, group, topic, {0: 37, 1: 50})
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"
    args = (
        *("--replication-policy", "identity", "--source-alias", alias),
        *("--groups", group, "--sync-group-offsets-interval", "1s"),
    )

    driver = mirror_driver(src, dst, checkpoint, log, *args, *KAFKA_TARGET, topics=topic)
    try:
        wait_mirrored(dst, alias, target, 0, log, "a first transaction on the cluster")
        # the target's leader SIGKILLed while the mirror writes to it
        victim = cluster.leader(target, 0)
        cluster.kill(victim)
        orders.write(100)
        cluster.restart(victim)
        wait_mirrored(dst, alias, target, 250, log, "the mirror to go on after the failover")
        assert driver.poll() is None, driver_log(log)
        orders.write(200)  # the driver SIGKILLed with this to copy
    finally:
        kill_driver(driver)
    assert not caught_up(orders, dst, target, alias), "killed too late to test anything"

    driver = mirror_driver(src, dst, checkpoint, log, *args, *KAFKA_TARGET, topics=topic)
    consumer = None
    try:
        wait_for(
            lambda: min(group_offsets(dst, group, target, 2).values()) >= 0,
            DRIVER_DEADLINE_S,
            lambda: f"{group}'s offsets translated onto the cluster:\n{driver_log(log)}",
        )
        # the application fails over: its consumer joins the group on the cluster, while the
        # source goes on taking writes and the mirror goes on copying them
        consumer, read = fail_over(dst, group, target, 2)
        wait_for(lambda: joined(consumer, read), 60, f"{group}'s consumer joining on the cluster")
        orders.write(100)
        wait_for(
            lambda: caught_up(orders, dst, target, alias),
            DRIVER_DEADLINE_S,
            lambda: f"the mirror to catch up:\n{driver_log(log)}",
        )
        wait_for(
            lambda: read_on(consumer, read, lambda: end_offsets(dst, target, "read_committed")),
            60,
            f"{group} reading to the end on the cluster",
        )
        assert driver.poll() is None, driver_log(log)
    finally:
        if consumer is not None:
            consumer.close()
        kill_driver(driver)
    want = after(orders, app)
    for partition in sorted(want):
        mine, theirs = read[partition], want[partition]
        assert mine == theirs, (
            f"partition {partition}: the failed-over consumer read {len(mine)} records, "
            f"{len(theirs)} committed after its position: "
            f"{len(set(theirs) - set(mine))} skipped, {len(mine) - len(set(mine))} repeated, "
            f"{len(set(mine) - set(theirs))} not committed after it"
        )
    check_mirrored(orders, dst, target)
    # the target topic made as a production cluster makes it: replicated 3, the source's config
    assert len(cluster.replicas(target, 0)) == 3
    resource = ConfigResource(ResourceType.TOPIC, target)
    target_admin = AdminClient({"bootstrap.servers": dst, **QUIET})
    configs = target_admin.describe_configs([resource])
    assert configs[resource].result(30)["retention.ms"].value == "86400000"


@pytest.mark.slow
# Two driver starts and the target's restart: 266 s on the shared 2-core machine (load 50).
@pytest.mark.timeout(1800)
def test_mirror_from_apache_kafka_to_onceflow_through_target_and_driver_kills(
    kafka_cluster3: KafkaCluster, make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    cluster = kafka_cluster3
    onceflow = make_broker(tmp_path / "target")
    src, dst = cluster.bootstrap_servers, onceflow.bootstrap
    tag = uuid.uuid4().hex[:8]
    topic, alias, group = f"orders-{tag}", "kafka", f"app-{tag}"
    target = f"{alias}.{topic}"
    # a config of its own, copied; min.insync.replicas describes the cluster: not copied
    cluster.create_topic(topic, 2, config={"retention.ms": "86400000", "min.insync.replicas": "2"})
    orders = Source(src, topic, base_time_ms=now_ms())
    orders.write(300, per_transaction=20)
    app = consume_and_commit(src, group, topic, {0: 41, 1: 60})
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"
    args = ("--source-alias", alias, "--groups", group, "--sync-group-offsets-interval", "1s")

    driver = mirror_driver(src, dst, checkpoint, log, *args, topics=topic)
    try:
        wait_mirrored(dst, alias, target, 0, log, "a first transaction on onceflow")
        onceflow.kill()  # the target's leader: its only broker
        orders.write(100)
        onceflow.start()
        wait_mirrored(dst, alias, target, 250, log, "the mirror to go on after the restart")
        assert driver.poll() is None, driver_log(log)
        orders.write(200)
    finally:
        kill_driver(driver)
    assert not caught_up(orders, dst, target, alias), "killed too late to test anything"

    orders.write(100)
    driver = mirror_driver(src, dst, checkpoint, log, *args, "--until-caught-up", topics=topic)
    try:
        assert driver.wait(DRIVER_DEADLINE_S) == 0, driver_log(log)
    finally:
        kill_driver(driver)
    check_mirrored(orders, dst, target)
    assert resume(dst, group, target, 2) == after(orders, app), f"{group} skipped or repeated"
    resource = ConfigResource(ResourceType.TOPIC, target)
    target_admin = AdminClient({"bootstrap.servers": dst, **QUIET})
    configs = target_admin.describe_configs([resource])[resource].result(30)
    assert configs["retention.ms"].value == "86400000"
    copied = configs.get("min.insync.replicas")
    assert copied is None or copied.source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
