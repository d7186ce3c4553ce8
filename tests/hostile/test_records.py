"""Hostile record batches at Produce: every record is walked, decompression is bounded.

Each test sends a batch with a valid header and CRC whose records are not what they claim,
checks Kafka's answer for that partition (INVALID_RECORD, CORRUPT_MESSAGE or
MESSAGE_TOO_LARGE), that no offset was burnt, that the broker's memory stayed bounded, and that
the broker still answers ListOffsets and a normal client afterwards.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from backports import zstd
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.records.varint import encode_varint
from tests.confluent import Deliveries, create_topic
from tests.records.batch_frames import frame_batch
from tests.wire import WAIT, WireClient, produce_request

ZSTD = 4
T0 = 1_700_000_000_000  # timestamps of the well-formed records


def rss_high_water_kib(pid: int) -> int:
    """VmHWM: the most resident memory the process ever had."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc status")


def produce_error(address: str, topic: str, batch: bytes) -> ErrorCode:
    client = WireClient(address, timeout=60)
    try:
        response = client.call(produce_request(topic, {0: batch}))
    finally:
        client.close()
    [topic_response] = response.responses
    [part] = topic_response.partition_responses
    return part.error_code


def list_offsets(address: str, topic: str, timestamp: int) -> tuple[int, int]:
    """(offset, timestamp) ListOffsets v7 answers for partition 0."""
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=(
            ListOffsetsTopic(
                name=topic,
                partitions=(
                    ListOffsetsPartition(
                        partition_index=0, current_leader_epoch=-1, timestamp=timestamp
                    ),
                ),
            ),
        ),
    )
    client = WireClient(address)
    try:
        response = client.call(request)
    finally:
        client.close()
    [part] = response.topics[0].partitions
    assert part.error_code == ErrorCode.none
    return part.offset, part.timestamp


def produce_values(
    bootstrap: str, topic: str, values: list[bytes], timestamps: list[int], **conf: str
) -> list[int]:
    """Produce with confluent-kafka (one batch per call of flush), return the offsets."""
    deliveries = Deliveries()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 50, **conf})
    for value, ts in zip(values, timestamps, strict=True):
        producer.produce(topic, value=value, partition=0, timestamp=ts, on_delivery=deliveries)
    assert producer.flush(WAIT) == 0
    assert deliveries.failed == []
    return [offset for _, _, offset, _ in deliveries.acked]


def read_all(bootstrap: str, topic: str, expected: int) -> list[bytes | None]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes | None] = []
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=WAIT)
        while len(got) < expected:
            assert datetime.datetime.now() < deadline, f"{len(got)} of {expected} read"
            for msg in consumer.consume(expected - len(got), timeout=1.0):
                assert msg.error() is None, msg.error()
                got.append(msg.value())
        return got
    finally:
        consumer.close()


def high_watermark(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=WAIT)[1]
    finally:
        consumer.close()


def record(offset_delta: int, value: bytes, timestamp_delta: int = 0) -> bytes:
    body = b"\x00" + encode_varint(timestamp_delta) + encode_varint(offset_delta)
    body += b"\x01" + encode_varint(len(value)) + value + b"\x00"  # null key, no headers
    return encode_varint(len(body)) + body


def zstd_stream(pieces: Iterator[bytes]) -> bytes:
    """Compress as a stream, so a bomb of a GiB never exists in the test's memory."""
    compressor = zstd.ZstdCompressor()
    out = [compressor.compress(piece) for piece in pieces]
    out.append(compressor.flush())
    return b"".join(out)


def zstd_batch(section: bytes, count: int) -> bytes:
    return frame_batch(
        section,
        attributes=ZSTD,
        last_offset_delta=count - 1,
        records_count=count,
        base_timestamp=T0,
        max_timestamp=T0,
    )


@pytest.fixture
def broker(make_broker: Callable[..., EmbeddedBroker]) -> EmbeddedBroker:
    return make_broker()


@pytest.fixture
def topic(broker: EmbeddedBroker, topic_name: str) -> str:
    """A topic holding 6 records at T0, T0+10, ... T0+50, in two batches."""
    create_topic(broker.bootstrap, topic_name, 1)
    stamps = [T0 + 10 * i for i in range(6)]
    values = [f"v{i}".encode() for i in range(6)]
    assert produce_values(broker.bootstrap, topic_name, values[:3], stamps[:3]) == [0, 1, 2]
    assert produce_values(broker.bootstrap, topic_name, values[3:], stamps[3:]) == [3, 4, 5]
    return topic_name


def assert_alive(broker: EmbeddedBroker, topic: str, length: int) -> None:
    """No offset burnt, ListOffsets by time and max timestamp right, a client still writes."""
    assert broker.process is not None and broker.process.poll() is None
    assert high_watermark(broker.bootstrap, topic) == length
    assert list_offsets(broker.bootstrap, topic, T0 + 15) == (2, T0 + 20)
    assert list_offsets(broker.bootstrap, topic, -3) == (5, T0 + 50)
    assert produce_values(broker.bootstrap, topic, [b"after"], [T0 + 60]) == [length]


def test_a_zstd_bomb_is_refused_in_bounded_memory(broker: EmbeddedBroker, topic: str) -> None:
    """1 GiB of zeros in 32 KB of zstd, valid header and CRC: the first record is already
    wrong, and the broker decompressed no more than a chunk to find out."""
    bomb = zstd_batch(zstd_stream(bytes(1 << 20) for _ in range(1024)), count=1000)
    assert len(bomb) < 64 * 1024
    before = rss_high_water_kib(broker.pid)
    assert produce_error(broker.bootstrap, topic, bomb) == ErrorCode.invalid_record
    assert_alive(broker, topic, 6)
    assert rss_high_water_kib(broker.pid) - before < 64 * 1024  # KiB: far below the GiB


def test_valid_records_past_the_decompressed_limit_are_message_too_large(
    broker: EmbeddedBroker, topic: str
) -> None:
    """Well-formed records that expand past message.max.decompressed.bytes (64 MiB by default):
    MESSAGE_TOO_LARGE (producers split such a batch), without holding them in memory."""
    count, value = 100_000, bytes(1000)  # ~100 MB of records
    section = zstd_stream(record(i, value) for i in range(count))
    before = rss_high_water_kib(broker.pid)
    assert produce_error(broker.bootstrap, topic, zstd_batch(section, count)) == (
        ErrorCode.message_too_large
    )
    assert_alive(broker, topic, 6)
    assert rss_high_water_kib(broker.pid) - before < 48 * 1024


def test_the_decompressed_limit_is_a_setting(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str
) -> None:
    broker = make_broker(settings={"message.max.decompressed.bytes": str(1 << 20)})
    create_topic(broker.bootstrap, topic_name, 1)
    small = zstd_batch(zstd_stream(record(i, bytes(100)) for i in range(1000)), 1000)
    large = zstd_batch(zstd_stream(record(i, bytes(100)) for i in range(20_000)), 20_000)
    assert produce_error(broker.bootstrap, topic_name, small) == ErrorCode.none
    assert produce_error(broker.bootstrap, topic_name, large) == ErrorCode.message_too_large
    assert high_watermark(broker.bootstrap, topic_name) == 1000


@pytest.mark.parametrize(
    ("section", "count"),
    [
        (b"\x00" * 40, 1),  # record length 0
        (record(0, b"v")[:-1] + b"\x02", 1),  # header count 1 with no header after it
        (record(0, b"v") + b"junk", 1),  # bytes after the last record
        (record(0, b"v") + record(0, b"w"), 2),  # offset deltas 0, 0
        (record(0, b"v"), 2),  # fewer records than the header says
    ],
    ids=["zero-length", "missing-header", "trailing-bytes", "repeated-delta", "too-few"],
)
def test_garbage_records_under_a_valid_crc_are_invalid_record(
    broker: EmbeddedBroker, topic: str, section: bytes, count: int
) -> None:
    batch = frame_batch(
        section,
        last_offset_delta=count - 1,
        records_count=count,
        base_timestamp=T0,
        max_timestamp=T0,
    )
    assert produce_error(broker.bootstrap, topic, batch) == ErrorCode.invalid_record
    assert_alive(broker, topic, 6)


def test_a_batch_claiming_int32_max_records_burns_no_offsets(
    broker: EmbeddedBroker, topic: str
) -> None:
    """70 bytes that used to take 2^31 offsets each."""
    claimed = (1 << 31) - 1
    batch = frame_batch(
        record(0, b"v"),
        last_offset_delta=claimed - 1,
        records_count=claimed,
        base_timestamp=T0,
        max_timestamp=T0,
    )
    assert len(batch) < 80
    assert produce_error(broker.bootstrap, topic, batch) == ErrorCode.invalid_record
    assert_alive(broker, topic, 6)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_batches_of_every_codec_are_accepted(
    broker: EmbeddedBroker, topic_name: str, codec: str
) -> None:
    create_topic(broker.bootstrap, topic_name, 1)
    values = [f"{codec}-{i}-".encode() * 50 for i in range(500)]
    stamps = [T0 + i for i in range(500)]
    offsets = produce_values(
        broker.bootstrap, topic_name, values, stamps, **{"compression.type": codec}
    )
    assert offsets == list(range(500))
    assert read_all(broker.bootstrap, topic_name, 500) == values
    assert list_offsets(broker.bootstrap, topic_name, T0 + 250) == (250, T0 + 250)
    assert list_offsets(broker.bootstrap, topic_name, -3) == (499, T0 + 499)
