"""`onceflow run copy` on a 3-node Apache Kafka cluster while the leader of an input partition,
then the leader of an output partition, then the transaction coordinator of the sink's
transactional ids are SIGKILLed and restarted, and the driver is SIGKILLed once: every
committed input record is in the output once, and nothing of an aborted transaction."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from onceflow.apache_kafka import KafkaCluster
from tests.apache_kafka.exactly_once import (
    read_committed,
    transactional_producer,
    write_transaction,
)
from tests.waiting import wait_for

from .conftest import ROOT
from .kafka_io import end_offsets, wait_mid_batch

PARTITIONS = 2


def start_driver(cluster: KafkaCluster, names: dict[str, str], log: Path, *extra: str) -> Any:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [
        sys.executable,
        "-m",
        "onceflow.cli.main",
        "run",
        "copy",
        "--bootstrap-server",
        cluster.bootstrap_servers,
        "--input",
        names["input"],
        "--output",
        names["output"],
        "--checkpoint",
        names["checkpoint"],
        "--prefix",
        names["prefix"],
        "--max-offsets-per-trigger",
        "300",
        *extra,
    ]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        # its own process group: the kill takes its JVM and Python workers down with it
        start_new_session=True,
    )


@pytest.mark.slow
# Three failovers (the controller fences a killed node after 9 s, then its restart) and two
# Spark driver starts: about 4 minutes on the shared 2-core machine, over the 300 s default.
@pytest.mark.timeout(900)
def test_copy_stays_exact_through_leader_coordinator_and_driver_kills(
    kafka_cluster3: KafkaCluster, tmp_path: Path
) -> None:
    cluster = kafka_cluster3
    bootstrap = cluster.bootstrap_servers
    tag = uuid.uuid4().hex[:8]
    names = {
        "input": f"copy-in-{tag}",
        "output": f"copy-out-{tag}",
        "checkpoint": str(tmp_path / "checkpoint"),
        "prefix": f"copy-{tag}",
    }
    for topic in (names["input"], names["output"]):
        cluster.create_topic(topic, PARTITIONS)
    writer = transactional_producer(bootstrap, f"input-{tag}")
    committed: Counter = Counter()
    aborted: set[bytes] = set()
    written = 0

    def write_input(transactions: int) -> None:
        nonlocal written
        for _ in range(transactions):
            values = [b"r%d-" % (written + i) + b"x" * 200 for i in range(100)]
            written += len(values)
            wanted = written % 700 != 0  # some transactions aborted on purpose
            if write_transaction(writer, names["input"], values, partitions=(0, 1), commit=wanted):
                committed.update(values)
            else:
                aborted.update(values)

    log = tmp_path / "driver.log"
    write_input(10)
    driver = start_driver(cluster, names, log)
    try:
        wait_for(
            lambda: sum(end_offsets(bootstrap, names["output"], "read_committed").values()) > 0,
            240,
            lambda: f"the copy's first output\n{log.read_text()[-3000:]}",
        )
        faults = [
            ("the leader of an input partition", lambda: cluster.leader(names["input"], 0)),
            ("the leader of an output partition", lambda: cluster.leader(names["output"], 1)),
            (
                "the coordinator of the sink's transactional id",
                lambda: cluster.transaction_coordinator(f"{names['prefix']}-0"),
            ),
        ]
        for what, node_of in faults:
            victim = node_of()
            cluster.kill(victim)
            write_input(5)  # the pipeline reads and writes while the node is down
            cluster.restart(victim)
            write_input(5)
            assert driver.poll() is None, (
                f"the driver died after {what} was killed:\n" + log.read_text()[-5000:]
            )
        # The driver SIGKILLed with a batch part-written (its input written meanwhile).
        write_input(10)
        wait_mid_batch(Path(names["checkpoint"]), bootstrap, names["output"], -1, 180)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)

    finish = start_driver(cluster, names, log, "--until-caught-up")
    try:
        assert finish.wait(300) == 0, log.read_text()[-5000:]
    finally:
        if finish.poll() is None:
            os.killpg(finish.pid, signal.SIGKILL)
    seen = read_committed(bootstrap, names["output"], PARTITIONS)
    lost = sum((committed - seen).values())
    duplicated = sum((seen - committed).values())
    visible_aborted = len(aborted & set(seen))
    assert (lost, duplicated, visible_aborted) == (0, 0, 0), (
        f"lost {lost}, duplicated {duplicated}, aborted visible {visible_aborted} "
        f"of {sum(committed.values())} committed"
    )
