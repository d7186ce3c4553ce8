"""Sink fault tests: the output, read with read_committed, must be the exact input multiset.

Each runs with the exactly-once sink and with the plain (at-least-once) sink, which must show
duplicates under the same fault: that proves the test can see them.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.spark.at_least_once import write_at_least_once
from onceflow.spark.sink_columns import SinkColumns
from onceflow.spark.sink_target import SinkTarget
from onceflow.spark.task_transaction import (
    DoneMark,
    TaskFencedError,
    TaskTransaction,
    write_exactly_once,
)

from .copy_job import check_output, copy_stream, first_batch_done, start_copy
from .faults import fail_first_attempt, slow_down
from .kafka_io import (
    committed_batches,
    create_topic,
    forget_commit,
    produce,
    read_values,
    wait_mid_batch,
)

SINKS = pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "plain"])


def _topics(bootstrap: str, name: str, rows: int, partitions: int = 2, pad: int = 0) -> list[str]:
    create_topic(bootstrap, f"{name}-in", partitions)
    create_topic(bootstrap, f"{name}-out", partitions)
    values = [f"r{i}-" + "x" * pad for i in range(rows)]
    produce(bootstrap, f"{name}-in", values)
    return values


def read_batch(spark: SparkSession, bootstrap: str, **options: str) -> DataFrame:
    """A batch read of the onceflow source (`options`: the source's, by name)."""
    return (
        spark.read.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .options(**options)
        .load()
    )


def write_batch(df: DataFrame, bootstrap: str, options: dict[str, str] | None = None) -> None:
    """A batch write through the onceflow sink (`options`: the sink's, by name)."""
    writer = df.write.format("onceflow").option("kafka.bootstrap.servers", bootstrap)
    writer.options(**(options or {})).mode("append").save()


@SINKS
def test_task_failing_after_part_of_its_rows_is_retried(
    spark: SparkSession,
    bootstrap: str,
    topic_name: str,
    tmp_path: Path,
    small_arrow_batches: None,
    exactly_once: bool,
) -> None:
    # rows of 1 KB: Python workers flush their output every 64 KB, and the sink must receive
    # rows before the failure upstream of it
    values = _topics(bootstrap, topic_name, 400, pad=1000)
    df = copy_stream(spark, bootstrap, f"{topic_name}-in", transform=fail_first_attempt(150))
    query = start_copy(
        df, bootstrap, f"{topic_name}-out", tmp_path / "cp", exactly_once=exactly_once
    )
    query.awaitTermination(180)
    assert query.exception() is None
    output = read_values(bootstrap, f"{topic_name}-out")
    check_output(output, values, exactly_once=exactly_once)


@SINKS
def test_batch_rerun_after_sink_commit_before_commit_log(
    spark: SparkSession, bootstrap: str, topic_name: str, tmp_path: Path, exactly_once: bool
) -> None:
    values = _topics(bootstrap, topic_name, 600)
    checkpoint = tmp_path / "cp"
    df = copy_stream(spark, bootstrap, f"{topic_name}-in", max_offsets=200)
    out = f"{topic_name}-out"
    first = start_copy(df, bootstrap, out, checkpoint, exactly_once=exactly_once)
    first.awaitTermination(180)
    assert first.exception() is None
    last = committed_batches(checkpoint)[-1]
    assert last >= 2
    # as if the driver died after the sink committed batch `last` but before Spark logged it
    forget_commit(checkpoint, last)
    again = start_copy(df, bootstrap, out, checkpoint, exactly_once=exactly_once)
    again.awaitTermination(180)
    assert again.exception() is None
    assert committed_batches(checkpoint)[-1] == last
    check_output(read_values(bootstrap, out), values, exactly_once=exactly_once)


def test_broker_killed_and_restarted_mid_stream(
    spark: SparkSession,
    make_broker: Callable[..., EmbeddedBroker],
    tmp_path: Path,
    small_arrow_batches: None,
) -> None:
    broker = make_broker()
    bootstrap = broker.bootstrap
    # 1 KB rows reach the sink a few at a time (Python workers flush every 64 KB)
    values = _topics(bootstrap, "crash", 1200, pad=1000)
    create_topic(bootstrap, "crash-plain", 2)

    # Both sinks at once, from the same input, through the same broker crash; the second
    # starts after the first's first micro-batch (see copy_job.first_batch_done).
    def stream() -> DataFrame:
        return copy_stream(
            spark, bootstrap, "crash-in", transform=slow_down(10, 0.05), max_offsets=300
        )

    eos = start_copy(
        stream(), bootstrap, "crash-out", tmp_path / "eos", exactly_once=True, available_now=False
    )
    assert first_batch_done(eos), eos.exception()
    plain = start_copy(
        stream(),
        bootstrap,
        "crash-plain",
        tmp_path / "plain",
        exactly_once=False,
        available_now=False,
        # at-least-once under an outage: records time out, the task fails and is retried
        sink_options={"kafka.message.timeout.ms": "1500"},
    )
    try:
        wait_mid_batch(tmp_path / "plain", bootstrap, "crash-plain", 0, 120)
        broker.kill()
        threading.Event().wait(2.0)  # the outage outlasts the plain sink's delivery timeout
        broker.start()
        for query in (eos, plain):
            query.processAllAvailable()
            assert query.exception() is None
    finally:
        eos.stop()
        plain.stop()
    check_output(read_values(bootstrap, "crash-out"), values, exactly_once=True)
    check_output(read_values(bootstrap, "crash-plain"), values, exactly_once=False)


def _target(bootstrap: str, topic: str) -> SinkTarget:
    return SinkTarget(
        client={"bootstrap.servers": bootstrap},
        topic=topic,
        columns=SinkColumns(key=0, value=1),
        timeout_s=30,
    )


def _rows(values: list[str]) -> pa.RecordBatch:
    data = [v.encode() for v in values]
    return pa.record_batch([pa.array(data), pa.array(data)], names=["key", "value"])


def test_racing_attempts_the_loser_is_fenced(bootstrap: str, topic_name: str) -> None:
    create_topic(bootstrap, topic_name, 2)
    target = _target(bootstrap, topic_name)
    prefix = f"race-{uuid.uuid4().hex[:6]}"
    rows = [f"r{i}" for i in range(50)]

    # attempt A writes, attempt B starts (fencing A), writes and commits; A's commit then fails
    a = TaskTransaction(target, prefix, 3, 7, topic_name)
    b = TaskTransaction(target, prefix, 3, 7, topic_name)
    try:
        assert a.open() is None
        a.produce(_rows(rows))
        assert b.open() is None
        b.produce(_rows(rows))
        b.commit(len(rows))
        with pytest.raises(TaskFencedError):
            a.commit(len(rows))
    finally:
        a.close()
        b.close()
    check_output(read_values(bootstrap, topic_name), rows, exactly_once=True)
    assert len(read_values(bootstrap, topic_name, "read_uncommitted")) == 2 * len(rows)

    # a third attempt of the same (batch 7, partition 3) finds it done and writes nothing
    outcome = write_exactly_once(target, prefix, 3, 2, 7, iter([_rows(rows)]))
    assert (outcome.rows, outcome.rows_already_committed) == (0, len(rows))
    # the next batch of that partition is written
    outcome = write_exactly_once(target, prefix, 3, 0, 8, iter([_rows(["next"])]))
    assert (outcome.rows, outcome.rows_already_committed) == (1, 0)
    check_output(read_values(bootstrap, topic_name), [*rows, "next"], exactly_once=True)


def test_racing_attempts_with_the_plain_sink_duplicate(bootstrap: str, topic_name: str) -> None:
    create_topic(bootstrap, topic_name, 2)
    target = _target(bootstrap, topic_name)
    rows = [f"r{i}" for i in range(50)]
    for attempt in (0, 1):
        write_at_least_once(target, 3, attempt, 7, iter([_rows(rows)]))
    check_output(read_values(bootstrap, topic_name), rows, exactly_once=False)


def test_an_attempt_whose_input_ended_early_is_resumed(bootstrap: str, topic_name: str) -> None:
    """Spark ends a writer's input cleanly when an operator upstream fails: the rows it got are
    committed, with their count in the mark; the retry writes only the rest."""
    create_topic(bootstrap, topic_name, 1)
    target = _target(bootstrap, topic_name)
    prefix = f"cut-{uuid.uuid4().hex[:6]}"
    rows = [f"r{i}" for i in range(50)]
    cut = write_exactly_once(target, prefix, 0, 0, 4, iter([_rows(rows[:10]), _rows(rows[10:20])]))
    assert (cut.rows, cut.rows_already_committed) == (20, 0)
    retry = write_exactly_once(target, prefix, 0, 1, 4, iter([_rows(rows[:25]), _rows(rows[25:])]))
    assert (retry.rows, retry.rows_already_committed) == (30, 20)
    check_output(read_values(bootstrap, topic_name), rows, exactly_once=True)


@pytest.mark.parametrize(
    ("mark", "batch_id", "skip"),
    [
        (DoneMark(5, 0), 5, 0),
        (DoneMark(5, 120), 5, 120),
        (DoneMark(5, 120), 6, 0),
        (DoneMark(7, 3), 6, None),
        (DoneMark(2**31 - 1, 2**32 - 1), 2**31 - 1, 2**32 - 1),
    ],
)
def test_done_marks_round_trip_through_an_offset(
    mark: DoneMark, batch_id: int, skip: int | None
) -> None:
    assert DoneMark.from_offset(mark.to_offset()) == mark
    assert mark.rows_done(batch_id) == skip
    assert DoneMark.from_offset(-1001) is None


@SINKS
def test_batch_write_with_a_failing_task(
    spark: SparkSession,
    bootstrap: str,
    topic_name: str,
    small_arrow_batches: None,
    exactly_once: bool,
) -> None:
    values = _topics(bootstrap, topic_name, 400, pad=1000)
    df = read_batch(spark, bootstrap, subscribe=f"{topic_name}-in").select("key", "value")
    failing = df.mapInArrow(fail_first_attempt(150), df.schema)
    sink = {"topic": f"{topic_name}-out", "exactlyOnce": str(exactly_once).lower()}
    write_batch(failing, bootstrap, sink)
    check_output(read_values(bootstrap, f"{topic_name}-out"), values, exactly_once=exactly_once)


def test_batch_write_with_an_explicit_prefix_is_idempotent(
    spark: SparkSession, bootstrap: str, topic_name: str
) -> None:
    values = _topics(bootstrap, topic_name, 100)
    df = read_batch(spark, bootstrap, subscribe=f"{topic_name}-in").select(
        "key", "value", F.lit(f"{topic_name}-out").alias("topic")
    )
    for _ in range(2):  # the second run finds every task's rows committed
        write_batch(df, bootstrap, {"transactional.id.prefix": f"job-{topic_name}"})
    check_output(read_values(bootstrap, f"{topic_name}-out"), values, exactly_once=True)


def test_sink_columns_topic_partition_and_headers(
    spark: SparkSession, bootstrap: str, topic_name: str
) -> None:
    create_topic(bootstrap, f"{topic_name}-a", 3)
    create_topic(bootstrap, f"{topic_name}-b", 1)
    rows = [
        (f"{topic_name}-a", 2, "k1", "v1", [("h", b"1")]),
        (f"{topic_name}-b", None, None, "v2", None),
        (f"{topic_name}-a", 0, "k3", "v3", [("h", b"3"), ("i", b"x")]),
    ]
    df = spark.createDataFrame(
        rows,
        "topic string, partition int, key string, value string, "
        "headers array<struct<key: string, value: binary>>",
    )
    write_batch(df, bootstrap)
    read = read_batch(spark, bootstrap, subscribePattern=f"{topic_name}-.*", includeHeaders="true")
    got = sorted(
        (
            r.topic,
            r.partition,
            None if r.key is None else bytes(r.key).decode(),
            bytes(r.value).decode(),
            [(h.key, bytes(h.value)) for h in r.headers] if r.headers else None,
        )
        for r in read.collect()
    )
    expected = sorted((t, 0 if p is None else p, k, v, h) for t, p, k, v, h in rows)
    assert got == expected


@pytest.mark.parametrize(
    ("ddl", "options"),
    [
        ("key string", {"topic": "t"}),  # no value column
        ("value int", {"topic": "t"}),  # value of the wrong type
        ("value string", {}),  # neither a topic option nor a topic column
        ("value string, partition string", {"topic": "t"}),
    ],
)
def test_sink_refuses_bad_columns_before_writing(
    spark: SparkSession, bootstrap: str, ddl: str, options: dict[str, str]
) -> None:
    df = spark.createDataFrame([], ddl)
    with pytest.raises(Exception, match=r"OptionError|column|topic"):
        write_batch(df, bootstrap, options)
