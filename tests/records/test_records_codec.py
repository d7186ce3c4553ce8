"""Building and decoding batches: round trips, byte exactness, and corruption."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.records.batch import HEADER_SIZE, iter_batches, parse_header
from onceflow.records.builder import build_batch
from onceflow.records.compression import CompressionType
from onceflow.records.errors import (
    CorruptRecordError,
    RecordsError,
    UnsupportedCompressionError,
    UnsupportedMagicError,
)
from onceflow.records.record import Record, decode_batch, iter_decoded_batches
from onceflow.records.varint import INT64_MAX, encode_varint, encode_varlong

Frame = Callable[..., bytes]

# timestamps spread so that deltas are big and negative as well as small
timestamps = st.one_of(
    st.integers(0, 2_000_000_000_000),
    st.integers(-(1 << 40), 1 << 40),
    st.just(-1),
)
maybe_bytes = st.none() | st.binary(max_size=64)
header_keys = st.text(max_size=12)
headers = st.lists(st.tuples(header_keys, maybe_bytes), max_size=4).map(tuple)
record_tuples = st.tuples(maybe_bytes, maybe_bytes, headers, timestamps)
record_lists = st.lists(record_tuples, min_size=1, max_size=25)
producer_fields = st.one_of(
    st.just((-1, -1, -1)),
    st.tuples(st.integers(0, INT64_MAX), st.integers(0, 32767), st.integers(0, (1 << 31) - 1)),
)


@pytest.mark.parametrize("codec", list(CompressionType))
@settings(max_examples=50, deadline=None)
@given(
    records=record_lists,
    base_offset=st.integers(0, 1 << 50),
    producer=producer_fields,
    transactional=st.booleans(),
    leader_epoch=st.integers(-1, 1 << 20),
)
def test_build_then_decode(
    codec: CompressionType,
    records: list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]],
    base_offset: int,
    producer: tuple[int, int, int],
    transactional: bool,
    leader_epoch: int,
) -> None:
    producer_id, epoch, sequence = producer
    data = build_batch(
        records,
        base_offset=base_offset,
        compression=codec,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        transactional=transactional,
        partition_leader_epoch=leader_epoch,
    )
    batch = decode_batch(data)
    header = batch.header
    assert header.size == len(data)
    assert header.compression == codec
    assert header.base_offset == base_offset
    assert header.records_count == len(records)
    assert header.last_offset_delta == len(records) - 1
    assert header.base_timestamp == records[0][3]
    assert header.max_timestamp == max(r[3] for r in records)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == producer
    assert header.is_transactional == transactional
    assert not header.is_control
    assert header.partition_leader_epoch == leader_epoch
    assert [(r.key, r.value, r.headers, r.timestamp) for r in batch.records] == records
    assert [r.offset for r in batch.records] == list(range(base_offset, base_offset + len(records)))
    assert list(iter_batches(data)) == [(0, header)]


@settings(max_examples=100, deadline=None)
@given(
    records=record_lists,
    base_offset=st.integers(0, 1 << 40),
    base_timestamp=st.none() | timestamps,
    producer=producer_fields,
    timestamp_type=st.sampled_from([0, 1]),
)
def test_decode_then_build_is_byte_exact(
    records: list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]],
    base_offset: int,
    base_timestamp: int | None,
    producer: tuple[int, int, int],
    timestamp_type: int,
) -> None:
    producer_id, epoch, sequence = producer
    params = {
        "producer_id": producer_id,
        "producer_epoch": epoch,
        "base_sequence": sequence,
        "partition_leader_epoch": 7,
    }
    # LogAppendTime replaces every record's timestamp by the batch's; keep deltas recoverable
    if timestamp_type:
        records = [(k, v, h, 1000) for k, v, h, _ in records]
    original = build_batch(
        records,
        base_offset=base_offset,
        base_timestamp=base_timestamp,
        timestamp_type=timestamp_type,
        **params,
    )
    header = decode_batch(original).header
    rebuilt = build_batch(
        decode_batch(original).records,
        base_offset=header.base_offset,
        base_timestamp=header.base_timestamp,
        timestamp_type=timestamp_type,
        **params,
    )
    assert rebuilt == original


def test_records_keep_offset_deltas_and_attributes() -> None:
    records = [
        Record(offset=100, timestamp=5, key=b"a", value=b"1"),
        Record(offset=103, timestamp=4, key=None, value=None, headers=(("h", None),)),
        Record(offset=104, timestamp=9, key=b"", value=b"", attributes=0),
    ]
    data = build_batch(records, base_offset=100)
    batch = decode_batch(data)
    assert batch.records == records
    assert batch.header.last_offset_delta == 4
    assert batch.header.records_count == 3
    assert len(batch) == 3 and list(batch) == records


def test_empty_batch() -> None:
    data = build_batch([], base_offset=42, producer_id=3, producer_epoch=1, base_sequence=9)
    header = decode_batch(data).header
    assert len(data) == HEADER_SIZE
    assert header.records_count == 0
    assert header.base_timestamp == header.max_timestamp == -1
    assert decode_batch(data).records == []


def test_log_append_time_records_take_the_batch_max_timestamp() -> None:
    data = build_batch(
        [(b"k", b"v", (), 10), (b"k", b"v", (), 20)], timestamp_type=1, max_timestamp=777
    )
    batch = decode_batch(data)
    assert batch.header.is_log_append_time
    assert batch.header.max_timestamp == 777
    assert [r.timestamp for r in batch.records] == [777, 777]


def test_non_utf8_header_keys_survive_a_round_trip(frame: Frame) -> None:
    body = b"\x00" + encode_varlong(0) + encode_varint(0) + b"\x01\x01" + encode_varint(1)
    body += encode_varint(2) + b"\xff\xfe" + b"\x01"
    data = frame(encode_varint(len(body)) + body, records_count=1)
    record = decode_batch(data).records[0]
    assert record.headers[0][0].encode("utf-8", "surrogateescape") == b"\xff\xfe"
    assert build_batch(decode_batch(data).records, base_timestamp=0, max_timestamp=0) == data


def test_bad_inputs_to_the_builder() -> None:
    with pytest.raises(TypeError):
        build_batch([("key", b"v", (), 0)])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        build_batch([(b"k", 5, (), 0)])  # type: ignore[list-item]
    with pytest.raises(UnsupportedCompressionError):
        build_batch([(b"k", b"v", (), 0)], compression=5)
    with pytest.raises(ValueError):
        build_batch([(b"k", b"v", (), 0)], producer_epoch=1 << 20)
    with pytest.raises(ValueError):
        build_batch([(b"k", b"v", (), 0)], timestamp_type=2)


def test_iter_decoded_batches_reads_a_log_slice() -> None:
    first = build_batch([(b"a", b"1", (), 1)], base_offset=0)
    second = build_batch([(b"b", b"2", (), 2), (b"c", b"3", (), 3)], base_offset=1, compression=1)
    batches = list(iter_decoded_batches(first + second))
    assert [r.offset for b in batches for r in b.records] == [0, 1, 2]
    assert decode_batch(first + second, len(first)).records[1].value == b"3"
    with pytest.raises(CorruptRecordError):
        list(iter_decoded_batches(first + second[:-1]))


def _small_batch() -> bytes:
    return build_batch(
        [(b"key", b"value", (("h", b"x"), ("n", None)), 1000), (None, b"v2", (), 990)],
        producer_id=5,
        producer_epoch=1,
        base_sequence=3,
    )


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_every_single_bit_flip_after_the_crc_field_is_caught(codec: int) -> None:
    data = build_batch(
        [(b"key", b"value", (("h", b"x"), ("n", None)), 1000), (None, b"v2", (), 990)],
        compression=codec,
    )
    # from the CRC field (byte 17) to the end: the CRC covers bytes 21.., and a flip in the
    # CRC field itself makes it disagree
    for bit in range(17 * 8, len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(RecordsError):
            decode_batch(bytes(flipped))


def _record_body(
    *,
    ts_delta: bytes = b"\x00",
    offset_delta: bytes = b"\x00",
    key: bytes = b"\x02k",
    value: bytes = b"\x02v",
    headers: bytes = b"\x00",
) -> bytes:
    return b"\x00" + ts_delta + offset_delta + key + value + headers


def _with_length(body: bytes, extra: int = 0) -> bytes:
    return encode_varint(len(body) + extra) + body


@pytest.mark.parametrize(
    ("section", "count"),
    [
        (_with_length(_record_body()), 2),  # fewer records than the count
        (_with_length(_record_body()) * 2, 1),  # trailing bytes: a record more than the count
        (_with_length(_record_body()) + b"\x00", 1),  # one trailing byte
        (_with_length(_record_body(), extra=1) + b"\x00", 1),  # length claims more than read
        (_with_length(_record_body(), extra=-1), 1),  # length claims less than read
        (_with_length(_record_body(), extra=50), 1),  # length past the end
        (_with_length(_record_body(headers=b"\x01")), 1),  # header count -1
        (_with_length(_record_body(headers=b"\x03")), 1),  # header count -2
        (_with_length(_record_body(headers=b"\x02\x01\x00")), 1),  # header key length -1
        (_with_length(_record_body(headers=b"\x02\x02h\x03")), 1),  # header value length -2
        (_with_length(_record_body(headers=b"\x02\x02h\x08ab")), 1),  # header value too long
        (_with_length(_record_body(key=b"\x03")), 1),  # key length -2
        (_with_length(_record_body(key=b"\x40k")), 1),  # key past the record
        (_with_length(_record_body(value=b"\x7fv")), 1),  # value length -64
        (_with_length(_record_body(ts_delta=b"\xff" * 10 + b"\x01")), 1),  # varlong too long
        (_with_length(_record_body(offset_delta=b"\xff\xff\xff\xff\x7f")), 1),  # > int32
        (b"\x80", 1),  # truncated length varint
        (b"\x01", 1),  # negative record length
        (b"\x0c\x00\x80", 1),  # truncated timestamp varlong inside a record
        (b"", 1),
        (b"", -1),  # negative record count
        (_with_length(_record_body()), 1 << 30),  # absurd count
    ],
)
def test_inconsistent_records_are_corrupt(frame: Frame, section: bytes, count: int) -> None:
    data = frame(section, records_count=count)
    with pytest.raises(CorruptRecordError):
        decode_batch(data)


def test_hand_framed_record_decodes(frame: Frame) -> None:
    # the control for the table above: the same framing with consistent content decodes
    data = frame(_with_length(_record_body()), records_count=1, base_offset=9, base_timestamp=50)
    assert decode_batch(data).records == [Record(9, 50, b"k", b"v")]


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (lambda b: b[:30], CorruptRecordError),  # truncated header
        (lambda b: b[:-1], CorruptRecordError),  # truncated batch
        (lambda b: b[:16] + b"\x01" + b[17:], UnsupportedMagicError),
        (lambda b: b[:16] + b"\x00" + b[17:], UnsupportedMagicError),
        (lambda b: b[:16] + b"\x03" + b[17:], CorruptRecordError),
        (lambda b: b[:8] + struct.pack(">i", 20) + b[12:], CorruptRecordError),  # length < 49
        (lambda b: b[:8] + struct.pack(">i", -5) + b[12:], CorruptRecordError),
        (lambda b: b[:8] + struct.pack(">i", 1 << 30) + b[12:], CorruptRecordError),
    ],
)
def test_bad_framing(mutate: Callable[[bytes], bytes], error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_batch(mutate(_small_batch()))


def test_bytes_after_the_batch_are_not_its_business() -> None:
    data = _small_batch()
    assert decode_batch(data + b"\x00garbage").records == decode_batch(data).records


def test_crc_check_can_be_skipped_for_trusted_bytes() -> None:
    data = bytearray(_small_batch())
    data[17] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        decode_batch(bytes(data))
    assert len(decode_batch(bytes(data), verify_crc=False).records) == 2


def test_corrupt_compressed_payload_with_a_valid_crc(frame: Frame) -> None:
    data = frame(b"\x1f\x8b not really gzip", attributes=1, records_count=1)
    with pytest.raises(CorruptRecordError):
        decode_batch(data)


def test_unknown_codec_in_a_batch(frame: Frame) -> None:
    for codec in (5, 6, 7):
        with pytest.raises(UnsupportedCompressionError):
            decode_batch(frame(b"abc", attributes=codec, records_count=1))


def test_header_fields_parse_like_batch_module() -> None:
    data = _small_batch()
    assert decode_batch(data).header == parse_header(data)
