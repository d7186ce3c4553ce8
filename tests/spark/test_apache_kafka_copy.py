"""`onceflow run copy` on a 3-node Apache Kafka cluster while the leader of an input partition,
then the leader of an output partition, then the transaction coordinator of the sink's
transactional ids are SIGKILLed and restarted, and the driver is SIGKILLed once: every
committed input record is in the output once, and nothing of an aborted transaction."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest

from onceflow.apache_kafka import KafkaCluster
from tests.apache_kafka.exactly_once import read_committed

from .apache_kafka_runs import InputWriter, PipelineRun, topic_pipeline_faults

PARTITIONS = 2


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
    source, target, prefix = f"copy-in-{tag}", f"copy-out-{tag}", f"copy-{tag}"
    for topic in (source, target):
        cluster.create_topic(topic, PARTITIONS)
    writer = InputWriter(bootstrap, source, f"input-{tag}")
    committed: Counter = Counter()
    aborted: set[bytes] = set()
    written = 0

    def write_input(transactions: int) -> None:
        nonlocal written
        for _ in range(transactions):
            values = [b"r%d-" % (written + i) + b"x" * 200 for i in range(100)]
            written += len(values)
            wanted = written % 700 != 0  # some transactions aborted on purpose
            if writer.write(values, partitions=(0, 1), commit=wanted):
                committed.update(values)
            else:
                aborted.update(values)

    run = PipelineRun(
        cluster=cluster,
        pipeline="copy",
        checkpoint=tmp_path / "checkpoint",
        output=target,
        args=[
            *("--input", source, "--output", target, "--prefix", prefix),
            *("--max-offsets-per-trigger", "300"),
        ],
        log=tmp_path / "driver.log",
    )
    run.through_faults(topic_pipeline_faults(cluster, source, target, prefix), write_input)
    run.finish()
    seen = read_committed(bootstrap, target, PARTITIONS)
    lost = sum((committed - seen).values())
    duplicated = sum((seen - committed).values())
    visible_aborted = len(aborted & set(seen))
    assert (lost, duplicated, visible_aborted) == (0, 0, 0), (
        f"lost {lost}, duplicated {duplicated}, aborted visible {visible_aborted} "
        f"of {sum(committed.values())} committed"
    )
