"""The mirror's records held to the target topic's max.message.bytes: batches sized to it
(librdkafka does not split a batch the broker refuses), and a record too large even alone
stops its partition right before it, with one line naming the source topic, partition,
offset and the limit (issue 19: the error was buried in a Spark traceback)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.librdkafka_log import QUIET
from onceflow.mirror import mirror_transaction
from onceflow.mirror.mirror_transaction import (
    MirrorTarget,
    mirror_at_least_once,
    mirror_exactly_once,
)
from onceflow.mirror.offset_syncs import offset_syncs_topic
from onceflow.mirror.positions import mirror_group
from onceflow.mirror.replication_policy import ReplicationPolicy
from onceflow.mirror.target_limit import (
    close_admins,
    first_too_large,
    single_record_batch_bytes,
    sized_to,
)
from onceflow.pipelines.mirror import stopped_by
from onceflow.spark.mark_readers import close_all
from onceflow.spark.record_columns import arrow_schema, source_schema
from tests.waiting import wait_for

LIMIT = 10_000
TARGET = "source.orders"


@pytest.fixture(autouse=True)
def _fresh_clients(make_broker: Callable[..., EmbeddedBroker]) -> Iterator[None]:
    """Clients kept per process are closed before the brokers stop (set up after them)."""
    yield
    close_all()
    close_admins()


def rows(values: list[bytes], first_offset: int = 0, headers: bool = False) -> pa.RecordBatch:
    """Source rows of orders/0, as the mirror's source gives them."""
    n = len(values)
    return pa.RecordBatch.from_pylist(
        [
            {
                "key": f"k{i}".encode(),
                "value": value,
                "topic": "orders",
                "partition": 0,
                "offset": first_offset + i,
                "timestamp": None,
                "timestampType": 0,
                "headers": [{"key": "h", "value": b"x" * 100}] if headers else None,
            }
            for i, value in enumerate(values)
        ],
        schema=arrow_schema(source_schema(True)),
    ).slice(0, n)


def test_the_first_record_too_large_alone_is_found_exactly() -> None:
    fits = single_record_batch_bytes(b"k1", b"v" * 900, [])
    batch = rows([b"a", b"v" * 900, b"b"])
    assert first_too_large(batch, fits) is None
    assert first_too_large(batch, fits - 1) == (1, fits)
    assert first_too_large(batch, fits - 1, start=2) is None
    assert first_too_large(batch, None) is None
    # headers count: 100 bytes of value each, plus their framing
    with_headers = rows([b"a", b"v" * 900], headers=True)
    size = single_record_batch_bytes(b"k1", b"v" * 900, [("h", b"x" * 100)])
    assert first_too_large(with_headers, fits) == (1, size)
    assert first_too_large(with_headers, size) is None


def test_the_producer_is_sized_to_the_topic() -> None:
    assert sized_to(LIMIT, {}) == {"batch.size": LIMIT - 61, "message.max.bytes": 1_000_000}
    assert sized_to(5_000_000, {"batch.size": "65536"}) == {
        "batch.size": 65536,
        "message.max.bytes": 5_000_000,
    }
    assert sized_to(None, {}) == {}


def test_the_reason_is_found_in_sparks_error() -> None:
    text = (
        "[STREAM_FAILED] Query [id = 1] terminated with exception: [PYTHON_STREAMING_DATA_"
        "SOURCE_RUNTIME_ERROR] Failed when Python streaming data source perform commit: "
        'Traceback (most recent call last):\n  File "x.py", line 1, in commit\n'
        "onceflow.mirror.target_limit.RecordTooLargeError: the record at offset 5 of "
        "orders/0 is 20072 bytes\n SQLSTATE: 38000"
    )
    assert stopped_by(RuntimeError(text)) == "the record at offset 5 of orders/0 is 20072 bytes"
    assert stopped_by(RuntimeError("Traceback\nValueError: something else")) is None


def _target(make_broker: Callable[..., EmbeddedBroker], tmp_path: Path) -> MirrorTarget:
    broker = make_broker(tmp_path / "target")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "logger": QUIET})
    futures = admin.create_topics(
        [
            NewTopic(TARGET, 1, 1, config={"max.message.bytes": str(LIMIT)}),
            NewTopic(offset_syncs_topic("source"), 1, 1),
        ]
    )
    for future in futures.values():
        future.result(30)
    return MirrorTarget(
        {"bootstrap.servers": broker.bootstrap, "logger": QUIET}, ReplicationPolicy(), True, 20.0
    )


def _committed(target: MirrorTarget) -> tuple[list[bytes], int]:
    """The values a read_committed consumer sees in the target topic, and the position."""
    bootstrap = target.client["bootstrap.servers"]
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": mirror_group("source"),
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "logger": QUIET,
        }
    )
    try:
        (position,) = consumer.committed([TopicPartition(TARGET, 0)], 30)
        end = consumer.get_watermark_offsets(TopicPartition(TARGET, 0), 30)[1]
        consumer.assign([TopicPartition(TARGET, 0, 0)])
        values: list[bytes] = []

        def read_to_end() -> bool:
            values.extend(m.value() for m in consumer.consume(1000, 0.2) if m.error() is None)
            return consumer.position([TopicPartition(TARGET, 0)])[0].offset >= end

        if end:  # the transaction's marker is past the last record
            wait_for(read_to_end, 30, f"reading {TARGET} to offset {end}")
        return values, position.offset
    finally:
        consumer.close()


def test_small_records_fill_batches_the_topic_takes(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    """100 records of 480 bytes, none too large: librdkafka's default batches (up to 1 MB)
    were refused whole by a topic taking 10,000 bytes."""
    target = _target(make_broker, tmp_path)
    values = [b"%03d" % i + b"v" * 477 for i in range(100)]
    (outcome,) = mirror_exactly_once(target, [rows(values)])
    assert (outcome.rows, outcome.error) == (100, None)
    assert _committed(target) == (values, 100)


def test_a_record_too_large_stops_its_partition_right_before_it(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    target = _target(make_broker, tmp_path)
    values = [b"small%d" % i for i in range(5)] + [b"B" * 20_000] + [b"late"]
    (outcome,) = mirror_exactly_once(target, [rows(values, first_offset=40)])
    size = single_record_batch_bytes(b"k5", b"B" * 20_000, [])
    assert outcome.error == (
        f"the record at offset 45 of orders/0 is {size} bytes, more than {TARGET} on the "
        f"target takes (max.message.bytes={LIMIT}); raise that, then restart the mirror"
    )
    # what came before it is mirrored, and the position points at it: a restart after the
    # limit is raised goes on from there
    assert outcome.rows == 5
    assert _committed(target) == (values[:5], 45)
    # the plain mirror stops there too, with the same line
    (plain,) = mirror_at_least_once(target, [rows(values[5:], first_offset=45)])
    assert (plain.rows, plain.error) == (0, outcome.error)


def test_without_the_limit_the_refusal_is_still_one_line(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No DescribeConfigs permission on the target, say: the broker's refusal, or the
    producer's own (message.max.bytes), stops the partition with the same kind of line, and
    nothing of that transaction is committed."""
    target = _target(make_broker, tmp_path)
    monkeypatch.setattr(mirror_transaction, "max_message_bytes", lambda *_: None)
    (refused,) = mirror_exactly_once(target, [rows([b"small", b"B" * 20_000], first_offset=7)])
    assert (refused.rows, refused.error) == (
        0,
        f"records of orders/0 at offsets 7 to 8 were refused as too large by {TARGET} on the "
        "target (max.message.bytes=unknown); raise that, then restart the mirror",
    )
    (local,) = mirror_exactly_once(target, [rows([b"small", b"H" * 1_100_000], first_offset=7)])
    assert local.rows == 0 and local.error is not None
    assert local.error.startswith("the record at offset 8 of orders/0 is 1100"), local.error
    assert "the mirror's producer takes (message.max.bytes=1000000)" in local.error
    assert _committed(target) == ([], -1001)
