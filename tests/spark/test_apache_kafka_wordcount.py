"""`onceflow run wordcount` on a 3-node Apache Kafka cluster while the leader of an input
partition, then the leader of an output partition, then the transaction coordinator of the
sink's transactional ids are SIGKILLed and restarted, and the driver is SIGKILLed once with a
batch part-written: the counts a read_committed reader ends with are the true counts of the
committed sentences, no (word, count) is written twice, and no word of an aborted input
transaction is counted.

The output topic is a plain (uncompacted) one, as in the embedded broker's word count test:
compaction would hide a count written twice."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest

from onceflow.apache_kafka import KafkaCluster
from onceflow.pipelines.topic_reader import read_topic
from onceflow.pipelines.wordcount_check import check_counts, words_of

from .apache_kafka_runs import InputWriter, PipelineRun, topic_pipeline_faults

PARTITIONS = 2


def sentence(n: int, *, aborted: bool) -> str:
    """Words shared by every sentence ("the", "fox"), words of a few dozen, and in an aborted
    transaction's sentences a word no committed sentence has."""
    middle = f"aborted{n % 5}" if aborted else f"w{n % 37} jumps {n % 11}"
    return f"the {middle} fox"


@pytest.mark.slow
# Three failovers and two Spark driver starts: 206 s here, 527 s at a load average of 35-80.
@pytest.mark.timeout(900)
def test_wordcount_stays_exact_through_leader_coordinator_and_driver_kills(
    kafka_cluster3: KafkaCluster, tmp_path: Path
) -> None:
    cluster = kafka_cluster3
    bootstrap = cluster.bootstrap_servers
    tag = uuid.uuid4().hex[:8]
    source, counts, prefix = f"sentences-{tag}", f"counts-{tag}", f"wordcount-{tag}"
    for topic in (source, counts):
        cluster.create_topic(topic, PARTITIONS)
    writer = InputWriter(bootstrap, source, f"sentences-{tag}")
    truth: Counter[str] = Counter()
    transactions = 0
    written = 0

    def write_input(more: int) -> None:
        nonlocal transactions, written
        for _ in range(more):
            transactions += 1
            aborted = transactions % 7 == 0  # some transactions aborted on purpose
            lines = [sentence(written + i, aborted=aborted) for i in range(100)]
            written += len(lines)
            values = [line.encode() for line in lines]
            if writer.write(values, partitions=(0, 1), commit=not aborted):
                truth.update(w for line in lines for w in words_of(line))

    run = PipelineRun(
        cluster=cluster,
        pipeline="wordcount",
        checkpoint=tmp_path / "checkpoint",
        output=counts,
        args=[
            *("--input", source, "--output", counts, "--prefix", prefix),
            *("--max-offsets-per-trigger", "300"),
        ],
        log=tmp_path / "driver.log",
    )
    run.through_faults(topic_pipeline_faults(cluster, source, counts, prefix), write_input)
    run.finish()
    output = read_topic(bootstrap, counts)
    report = check_counts(truth, output)
    aborted_visible = sum(1 for r in output if (r.key or b"").startswith(b"aborted"))
    assert report.exact and aborted_visible == 0, (
        f"{report.line('word count')} wrong_words={report.wrong_words} "
        f"aborted_visible={aborted_visible} ({written} sentences in {transactions} transactions)"
    )
    assert truth["the"] > 0  # the input was not all aborted: the check checked something
