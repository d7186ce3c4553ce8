"""`onceflow run mirror` refuses, in one line and before Spark starts, a mirror that would
never end: the identity policy from a cluster onto itself (issue 19, item 6: it grew a topic
from 30 to 1,530 records in 120 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.librdkafka_log import QUIET

DEADLINE_S = 90.0  # the fixed command answers in seconds; a started mirror loops by then


def _write(bootstrap: str, topic: str, count: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": QUIET})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "logger": QUIET})
    for i in range(count):
        producer.produce(topic, f"v{i}".encode())
    assert producer.flush(30) == 0


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "logger": QUIET})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), 30)[1]
    finally:
        consumer.close()


def test_identity_mirror_onto_the_same_cluster_is_refused_in_one_line(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    broker = make_broker(tmp_path / "data")
    _write(broker.bootstrap, "orders", 30)
    # the same cluster under another address: the cluster id tells, not the address
    other_address = f"localhost:{broker.port}"
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "onceflow.cli.main",
            "run",
            "mirror",
            "--source-bootstrap-server",
            broker.bootstrap,
            "--target-bootstrap-server",
            other_address,
            "--topics",
            "orders",
            "--replication-policy",
            "identity",
            "--checkpoint",
            str(tmp_path / "checkpoint"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # a mirror that did start: its JVM goes with the kill
    )
    try:
        _, err = child.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        raise AssertionError(
            f"the mirror still ran after {DEADLINE_S:.0f} s; orders grew from 30 to "
            f"{_end_offset(broker.bootstrap, 'orders')} records"
        ) from None
    lines = [line for line in err.splitlines() if line.strip()]
    assert child.returncode == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("mirror: error: the source and target are the same cluster"), err
    assert "--replication-policy identity" in lines[0], err
    assert _end_offset(broker.bootstrap, "orders") == 30
