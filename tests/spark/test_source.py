"""The `onceflow` source: batch and streaming reads, read_committed, planned ranges."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import DataFrame, SparkSession

from onceflow.broker.embedded import EmbeddedBroker

from .kafka_io import (
    add_partitions,
    create_topic,
    forget_commit,
    produce,
    produce_transaction,
    read_values,
)


def _reader(spark: SparkSession, bootstrap: str, topic: str, **options: str) -> DataFrame:
    reader = (
        spark.read.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _values(df: DataFrame) -> list[str]:
    return [bytes(row.value).decode() for row in df.select("value").collect()]


@pytest.fixture
def mixed_topic(bootstrap: str, topic_name: str) -> tuple[str, list[str], list[str]]:
    """A topic with plain records, committed and aborted transactions, interleaved.

    Returns (topic, committed values, aborted values).
    """
    create_topic(bootstrap, topic_name, 2)
    committed: list[str] = []
    aborted: list[str] = []
    txn_id = f"source-test-{uuid.uuid4().hex[:6]}"
    for round_ in range(3):
        plain = [f"plain-{round_}-{i}" for i in range(20)]
        produce(bootstrap, topic_name, plain)
        committed += plain
        good = [f"commit-{round_}-{i}" for i in range(30)]
        produce_transaction(bootstrap, topic_name, good, commit=True, txn_id=txn_id)
        committed += good
        bad = [f"abort-{round_}-{i}" for i in range(25)]
        produce_transaction(bootstrap, topic_name, bad, commit=False, txn_id=txn_id)
        aborted += bad
    return topic_name, committed, aborted


def test_batch_read_has_spark_kafka_columns(
    spark: SparkSession, bootstrap: str, topic_name: str
) -> None:
    create_topic(bootstrap, topic_name, 1)
    produce(bootstrap, topic_name, ["a", "b"], partition=0)
    df = _reader(spark, bootstrap, topic_name)
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]
    rows = df.orderBy("offset").collect()
    assert [(bytes(r.key), bytes(r.value), r.topic, r.partition, r.offset) for r in rows] == [
        (b"a", b"a", topic_name, 0, 0),
        (b"b", b"b", topic_name, 0, 1),
    ]
    assert all(r.timestampType == 0 and r.timestamp is not None for r in rows)
    with_headers = _reader(spark, bootstrap, topic_name, includeHeaders="true")
    assert with_headers.columns[-1] == "headers"
    assert with_headers.select("headers").collect()[0].headers is None


def test_batch_read_committed_sees_only_committed_records(
    spark: SparkSession, bootstrap: str, mixed_topic: tuple[str, list[str], list[str]]
) -> None:
    topic, committed, aborted = mixed_topic
    assert Counter(_values(_reader(spark, bootstrap, topic))) == Counter(committed)
    # split into more tasks than partitions: ranges then start and end inside transactions
    split = _reader(spark, bootstrap, topic, minPartitions="7")
    assert split.rdd.getNumPartitions() >= 7
    assert Counter(_values(split)) == Counter(committed)
    uncommitted = _reader(spark, bootstrap, topic, **{"kafka.isolation.level": "read_uncommitted"})
    assert Counter(_values(uncommitted)) == Counter(committed + aborted)


def test_batch_read_between_explicit_offsets(
    spark: SparkSession, bootstrap: str, topic_name: str
) -> None:
    create_topic(bootstrap, topic_name, 2)
    produce(bootstrap, topic_name, [f"p0-{i}" for i in range(10)], partition=0)
    produce(bootstrap, topic_name, [f"p1-{i}" for i in range(10)], partition=1)
    df = _reader(
        spark,
        bootstrap,
        topic_name,
        startingOffsets=f'{{"{topic_name}": {{"0": 2, "1": -2}}}}',
        endingOffsets=f'{{"{topic_name}": {{"0": 5, "1": -1}}}}',
    )
    assert sorted(_values(df)) == sorted(
        [f"p0-{i}" for i in range(2, 5)] + [f"p1-{i}" for i in range(10)]
    )


def _collecting_query(
    spark: SparkSession, df: DataFrame, checkpoint: Path, batches: dict[int, list[tuple]]
):  # type: ignore[no-untyped-def]
    def collect(batch: DataFrame, batch_id: int) -> None:
        batches[batch_id] = [
            (r.partition, r.offset, bytes(r.value).decode())
            for r in batch.select("partition", "offset", "value").collect()
        ]

    return (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def _stream(spark: SparkSession, bootstrap: str, topic: str, **options: str) -> DataFrame:
    reader = (
        spark.readStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_streaming_read_with_max_offsets_per_trigger(
    spark: SparkSession,
    bootstrap: str,
    mixed_topic: tuple[str, list[str], list[str]],
    tmp_path: Path,
) -> None:
    topic, committed, _aborted = mixed_topic
    batches: dict[int, list[tuple]] = {}
    query = _collecting_query(
        spark, _stream(spark, bootstrap, topic, maxOffsetsPerTrigger="60"), tmp_path / "cp", batches
    )
    query.awaitTermination(120)
    assert query.exception() is None
    # 225 records + 6 markers per partition pair... several micro-batches, each capped
    assert len(batches) >= 4
    offsets_per_batch = [len({(p, o) for p, o, _ in rows}) for rows in batches.values()]
    assert max(offsets_per_batch) <= 60 + 2
    seen = [v for rows in batches.values() for _, _, v in rows]
    assert Counter(seen) == Counter(committed)


def test_rerun_batch_reads_the_same_records(
    spark: SparkSession, bootstrap: str, topic_name: str, tmp_path: Path
) -> None:
    create_topic(bootstrap, topic_name, 2)
    produce(bootstrap, topic_name, [f"v{i}" for i in range(300)])
    checkpoint = tmp_path / "cp"
    first: dict[int, list[tuple]] = {}
    df = _stream(spark, bootstrap, topic_name, maxOffsetsPerTrigger="100")
    _collecting_query(spark, df, checkpoint, first).awaitTermination(120)
    last = max(first)
    # forget that the last batch finished; meanwhile more records arrive
    forget_commit(checkpoint, last)
    produce(bootstrap, topic_name, [f"w{i}" for i in range(50)])
    second: dict[int, list[tuple]] = {}
    query = _collecting_query(spark, df, checkpoint, second)
    query.awaitTermination(120)
    assert query.exception() is None
    assert min(second) == last
    assert sorted(second[last]) == sorted(first[last])
    later = [v for batch_id, rows in second.items() if batch_id > last for _, _, v in rows]
    assert sorted(later) == sorted(f"w{i}" for i in range(50))


def test_new_partitions_are_picked_up(
    spark: SparkSession, bootstrap: str, topic_name: str, tmp_path: Path
) -> None:
    create_topic(bootstrap, topic_name, 1)
    produce(bootstrap, topic_name, [f"old-{i}" for i in range(10)])
    query = (
        _stream(spark, bootstrap, topic_name)
        .selectExpr("CAST(value AS STRING) AS value", "partition")
        .writeStream.format("memory")
        .queryName(f"q_{topic_name.replace('-', '_')}")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        query.processAllAvailable()
        add_partitions(bootstrap, topic_name, 3)
        produce(bootstrap, topic_name, [f"new-{i}" for i in range(5)], partition=2)
        produce(bootstrap, topic_name, ["newer"], partition=1)
        query.processAllAvailable()
        rows = spark.sql(f"SELECT value, partition FROM {query.name}").collect()
    finally:
        query.stop()
    assert sorted((r.value, r.partition) for r in rows) == sorted(
        [(f"old-{i}", 0) for i in range(10)] + [(f"new-{i}", 2) for i in range(5)] + [("newer", 1)]
    )


def test_source_reads_what_a_plain_consumer_reads(
    spark: SparkSession, bootstrap: str, mixed_topic: tuple[str, list[str], list[str]]
) -> None:
    topic, _committed, _aborted = mixed_topic
    for isolation in ("read_committed", "read_uncommitted"):
        spark_values = _values(
            _reader(spark, bootstrap, topic, **{"kafka.isolation.level": isolation})
        )
        assert Counter(spark_values) == Counter(read_values(bootstrap, topic, isolation))


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_planned_offsets_deleted_by_retention(
    spark: SparkSession,
    make_broker: Callable[..., EmbeddedBroker],
    topic_name: str,
    fail_on_data_loss: bool,
) -> None:
    """Offsets planned but gone from the log (retention deleted them) fail the read, as in
    Spark's Kafka source, unless failOnDataLoss=false, which reads on from the log start."""
    broker = make_broker(settings={"log.retention.check.interval.ms": "100"})
    bootstrap = broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # Every batch rolls a segment; retention keeps only the active one.
    configs = {"segment.bytes": "400", "retention.bytes": "1"}
    admin.create_topics([NewTopic(topic_name, 1, 1, config=configs)])[topic_name].result(30)
    values = [f"v{i}-" + "x" * 100 for i in range(8)]
    for value in values:  # one batch each
        produce(bootstrap, topic_name, [value], partition=0)
    partition = TopicPartition(topic_name, 0)
    with closing(Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})) as consumer:

        def log_start() -> int:
            return consumer.get_watermark_offsets(partition, 10)[0]

        deadline = time.monotonic() + 30
        while (start := log_start()) == 0:
            assert time.monotonic() < deadline, "retention never deleted a segment"
            time.sleep(0.1)

        df = _reader(
            spark,
            bootstrap,
            topic_name,
            startingOffsets=f'{{"{topic_name}": {{"0": 0}}}}',
            failOnDataLoss=str(fail_on_data_loss).lower(),
        )
        if fail_on_data_loss:
            with pytest.raises(Exception, match="no longer in the log"):
                _values(df)
            return
        got = _values(df)
        # Retention goes on deleting while Spark reads: the read starts at the log start of
        # its own moment, at or after `start` and at or before the log start after it.
        later = log_start()
        first = len(values) - len(got)
    assert start <= first <= later and got == values[first:], (start, later, got)
