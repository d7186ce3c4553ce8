"""Golden vectors: batches written by real clients (kafka-python, librdkafka).

- kafka-python's DefaultRecordBatchBuilder and ours must give identical bytes (uncompressed);
- we decode kafka-python's batches for every codec and kafka-python decodes ours;
- we decode the batches librdkafka put in its Produce requests (captured in golden/ by
  golden/capture_librdkafka.py), and rebuild its uncompressed ones byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from onceflow.records.batch import HEADER_SIZE
from onceflow.records.builder import build_batch
from onceflow.records.compression import LZ4_FRAME_HEADER, CompressionType
from onceflow.records.record import decode_batch
from onceflow.records.validation import validate_produce

maybe_bytes = st.none() | st.binary(max_size=40)
headers = st.lists(st.tuples(st.text(max_size=8), maybe_bytes), max_size=3)
records = st.lists(
    st.tuples(maybe_bytes, maybe_bytes, headers, st.integers(0, 1 << 42)), min_size=1, max_size=20
)
producers = st.one_of(
    st.just((-1, -1, -1, False)),
    st.tuples(
        st.integers(0, 1 << 40), st.integers(0, 32767), st.integers(0, 1 << 30), st.booleans()
    ),
)

Recs = list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]


def kafka_python_batch(recs: Recs, codec: int, producer: tuple[int, int, int, bool]) -> bytes:
    producer_id, epoch, sequence, transactional = producer
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        batch_size=1 << 30,
    )
    for offset, (key, value, hdrs, ts) in enumerate(recs):
        assert builder.append(offset, ts, key, value, hdrs) is not None
    return bytes(builder.build())


def ours(recs: Recs, codec: int, producer: tuple[int, int, int, bool]) -> bytes:
    producer_id, epoch, sequence, transactional = producer
    return build_batch(
        [(k, v, tuple(h), ts) for k, v, h, ts in recs],
        compression=codec,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        transactional=transactional,
        partition_leader_epoch=0,  # kafka-python leaves 0 where Java writes -1
    )


@settings(max_examples=150, deadline=None)
@given(recs=records, producer=producers)
def test_uncompressed_bytes_identical_to_kafka_python(
    recs: Recs, producer: tuple[int, int, int, bool]
) -> None:
    assert ours(recs, 0, producer) == kafka_python_batch(recs, 0, producer)


def every_codec_both_ways(test: Callable[..., None]) -> Callable[..., None]:
    """Run `test` for every codec, over generated records and producer fields, with the codecs
    kafka-python needs to (de)compress them."""
    test = given(recs=records, producer=producers)(test)
    test = settings(max_examples=30, deadline=None)(test)
    test = pytest.mark.parametrize("codec", list(CompressionType))(test)
    return pytest.mark.usefixtures("kafka_python_codecs")(test)


def _content(recs: Recs) -> list[tuple[Any, ...]]:
    return [(k, v, tuple(h), ts) for k, v, h, ts in recs]


@every_codec_both_ways
def test_we_decode_kafka_python_batches(
    codec: CompressionType, recs: Recs, producer: tuple[int, int, int, bool]
) -> None:
    data = kafka_python_batch(recs, codec, producer)
    batch = decode_batch(data)
    assert [(r.key, r.value, r.headers, r.timestamp) for r in batch.records] == _content(recs)
    # kafka-python sends uncompressed when compression does not pay off
    assert batch.header.compression in (codec, 0)
    assert validate_produce(data, deep=True) == [(0, batch.header)]


@every_codec_both_ways
def test_kafka_python_decodes_ours(
    codec: CompressionType, recs: Recs, producer: tuple[int, int, int, bool]
) -> None:
    theirs = DefaultRecordBatch(ours(recs, codec, producer))
    assert theirs.validate_crc()
    assert theirs.compression_type == codec
    got = [(r.key, r.value, tuple(r.headers), r.timestamp) for r in theirs]
    assert got == _content(recs)


def _header_params(data: bytes) -> dict[str, Any]:
    header = decode_batch(data).header
    return {
        "base_offset": header.base_offset,
        "producer_id": header.producer_id,
        "producer_epoch": header.producer_epoch,
        "base_sequence": header.base_sequence,
        "transactional": header.is_transactional,
        "partition_leader_epoch": header.partition_leader_epoch,
        "base_timestamp": header.base_timestamp,
    }


@pytest.mark.parametrize("case", ["none", "gzip", "snappy", "lz4", "zstd", "txn_none"])
def test_librdkafka_batches_decode(
    case: str, librdkafka_batches: dict[str, list[bytes]], librdkafka_inputs: list[Any]
) -> None:
    batches = librdkafka_batches[case]
    assert batches
    got = []
    for data in batches:
        batch = decode_batch(data)
        assert batch.header.compression == CompressionType[case.removeprefix("txn_").upper()]
        assert batch.header.has_producer_id  # librdkafka 2.x is idempotent by default here
        assert batch.header.is_transactional == (case == "txn_none")
        assert validate_produce(data, deep=True) == [(0, batch.header)]
        got += [(r.key, r.value, r.headers, r.timestamp) for r in batch.records]
    assert got == librdkafka_inputs


@pytest.mark.parametrize("case", ["none", "txn_none"])
def test_librdkafka_uncompressed_batches_rebuild_byte_for_byte(
    case: str, librdkafka_batches: dict[str, list[bytes]]
) -> None:
    for data in librdkafka_batches[case]:
        assert build_batch(decode_batch(data).records, **_header_params(data)) == data


def test_librdkafka_snappy_is_raw_and_lz4_framed_like_java(
    librdkafka_batches: dict[str, list[bytes]],
) -> None:
    snappy = librdkafka_batches["snappy"][0][HEADER_SIZE:]
    assert not snappy.startswith(b"\x82SNAPPY\x00")
    lz4 = librdkafka_batches["lz4"][0][HEADER_SIZE:]
    assert lz4.startswith(LZ4_FRAME_HEADER)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_librdkafka_compressed_content_rebuilds_with_our_codecs(
    codec: int, librdkafka_batches: dict[str, list[bytes]]
) -> None:
    data = librdkafka_batches["none"][0]
    params = _header_params(data)
    rebuilt = build_batch(decode_batch(data).records, compression=codec, **params)
    assert decode_batch(rebuilt).records == decode_batch(data).records


@pytest.mark.usefixtures("kafka_python_codecs")
@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_kafka_python_compressed_batch_with_xerial_snappy(codec: int) -> None:
    recs: Recs = [
        (b"key", b"compressible value " * 50, [("h", b"1")], 1_000 + i) for i in range(30)
    ]
    data = kafka_python_batch(recs, codec, (-1, -1, -1, False))
    batch = decode_batch(data)
    assert batch.header.compression == codec  # it did compress
    if codec == CompressionType.SNAPPY:
        assert data[HEADER_SIZE:].startswith(b"\x82SNAPPY\x00")  # Java-style framing
    assert [(r.key, r.value, r.headers, r.timestamp) for r in batch.records] == _content(recs)
