"""Spark on compacted topics: the word count's output as a changelog table.

The bundled word count writes (word, running count) records; on a topic with
`cleanup.policy=compact` the cleaner keeps the last count of every word, so the topic becomes
the table itself, materialised exactly-once. The broker is killed between two runs; once the
cleaner has removed superseded counts, the table read back is exact, and the `onceflow` source
reads the compacted topic across its gaps (the same records at the same offsets as a plain
consumer).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.pipelines.topic_reader import read_topic
from onceflow.pipelines.wordcount_check import check_counts, words_of
from tests.spark.kafka_io import committed_batches, create_topic
from tests.spark.word_count_runs import sentences, word_count_across_a_broker_kill
from tests.waiting import wait_for

TABLE_CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": "2048",  # many closed segments for the cleaner
    "min.cleanable.dirty.ratio": "0.01",
}


def test_word_count_table_on_a_compacted_topic(
    spark: SparkSession, make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    broker = make_broker(settings={"log.cleaner.backoff.ms": "200"})
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "sentences")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("counts", 1, 1, config=TABLE_CONFIG)])["counts"].result(30)
    written = sentences(400)
    word_count_across_a_broker_kill(
        spark, broker, written, tmp_path / "cp", prefix="wc-table", max_offsets_per_trigger=40
    )

    # Every micro-batch wrote a new count of "the" (every sentence has it): the cleaner
    # removes those in closed segments, all but the last.
    batches = len(committed_batches(tmp_path / "cp"))
    assert batches >= 8
    wait_for(
        lambda: Counter(r.key for r in read_topic(bootstrap, "counts"))[b"the"] < batches,
        60,
        "the cleaner removes superseded counts",
    )
    table = read_topic(bootstrap, "counts")
    truth = Counter(w for s in written for w in words_of(s))
    report = check_counts(truth, table)
    assert report.exact, report

    via_spark = (
        spark.read.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "counts")
        .load()
        .orderBy("offset")
        .collect()
    )
    assert [(r.offset, bytes(r.key), bytes(r.value)) for r in via_spark] == [
        (r.offset, r.key, r.value) for r in sorted(table, key=lambda r: r.offset)
    ]
