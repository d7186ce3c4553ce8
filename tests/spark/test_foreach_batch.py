"""Update-mode word count through `exactly_once_writer` (foreachBatch), re-run after a crash."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import onceflow.spark

from .kafka_io import (
    committed_batches,
    create_topic,
    end_offsets,
    forget_commit,
    produce,
    wait_stable,
)

SENTENCES = [
    "the quick brown fox",
    "jumps over the lazy dog",
    "the dog sleeps",
    "a fox is quick",
] * 30


def _word_count(
    spark: SparkSession, bootstrap: str, source: str, out: str, checkpoint: Path, writer
):  # type: ignore[no-untyped-def]
    sentences = (
        spark.readStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "40")
        .load()
    )
    counts = (
        sentences.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"))
        .groupBy("word")
        .count()
        .select(F.col("word").alias("key"), F.col("count").cast("string").alias("value"))
    )
    return (
        counts.writeStream.outputMode("update")
        .foreachBatch(writer)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def _updates(bootstrap: str, topic: str) -> list[tuple[str, int]]:
    """(word, count) records in offset order per partition, read_committed."""
    wait_stable(bootstrap, topic)
    ends = end_offsets(bootstrap, topic, "read_committed")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "wc-check",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in ends if ends[p] > 0])
    out: list[tuple[str, int]] = []
    position = dict.fromkeys(ends, 0)
    try:
        while any(position[p] < ends[p] for p in ends):
            for msg in consumer.consume(500, timeout=0.5):
                assert msg.error() is None, msg.error()
                if msg.offset() < ends[msg.partition()]:
                    out.append((msg.key().decode(), int(msg.value())))
            for tp in consumer.position([TopicPartition(topic, p) for p in ends]):
                position[tp.partition] = max(position[tp.partition], tp.offset)
    finally:
        consumer.close()
    return out


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "plain"])
def test_update_mode_word_count_rerun_after_crash(
    spark: SparkSession, bootstrap: str, topic_name: str, tmp_path: Path, exactly_once: bool
) -> None:
    out = f"{topic_name}-counts"
    create_topic(bootstrap, topic_name, 2)
    create_topic(bootstrap, out, 2)
    produce(bootstrap, topic_name, SENTENCES)
    writer = onceflow.spark.exactly_once_writer(
        bootstrap, out, f"wc-{uuid.uuid4().hex[:8]}", exactly_once=exactly_once
    )
    checkpoint = tmp_path / "cp"
    first = _word_count(spark, bootstrap, topic_name, out, checkpoint, writer)
    first.awaitTermination(180)
    assert first.exception() is None
    last = committed_batches(checkpoint)[-1]
    assert last >= 2
    forget_commit(checkpoint, last)  # crashed after writing the batch, before logging it
    again = _word_count(spark, bootstrap, topic_name, out, checkpoint, writer)
    again.awaitTermination(180)
    assert again.exception() is None

    updates = _updates(bootstrap, out)
    truth = Counter(word for s in SENTENCES for word in s.split())
    final: dict[str, int] = {}
    for word, count in updates:  # per key, updates are in offset order (one partition per key)
        final[word] = count
    assert final == dict(truth)
    repeated = sum(n - 1 for n in Counter(updates).values() if n > 1)
    if exactly_once:
        assert repeated == 0
    else:
        assert repeated > 0
