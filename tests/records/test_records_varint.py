"""Zig-zag varints: round trips, Kafka's known encodings, and malformed input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.record.util import encode_varint as kafka_python_encode

from onceflow.records.errors import CorruptRecordError
from onceflow.records.varint import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    decode_varint,
    decode_varlong,
    encode_varint,
    encode_varlong,
    size_of_varint,
)

int32s = st.integers(INT32_MIN, INT32_MAX)
int64s = st.integers(INT64_MIN, INT64_MAX)


@given(int32s)
def test_varint_round_trip(value: int) -> None:
    encoded = encode_varint(value)
    assert decode_varint(encoded) == (value, len(encoded))
    assert len(encoded) == size_of_varint(value) <= 5


@given(int64s)
def test_varlong_round_trip(value: int) -> None:
    encoded = encode_varlong(value)
    assert decode_varlong(encoded) == (value, len(encoded))
    assert len(encoded) == size_of_varint(value) <= 10


@given(int64s)
def test_varlong_matches_kafka_python(value: int) -> None:
    out = bytearray()
    kafka_python_encode(value, out.append)
    assert encode_varlong(value) == bytes(out)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (-1, "01"),
        (1, "02"),
        (63, "7e"),
        (-64, "7f"),
        (64, "8001"),
        (8191, "fe7f"),
        (8192, "808001"),
        (INT32_MAX, "feffffff0f"),
        (INT32_MIN, "ffffffff0f"),
    ],
)
def test_known_varint_encodings(value: int, encoded: str) -> None:
    assert encode_varint(value).hex() == encoded
    assert decode_varint(bytes.fromhex(encoded)) == (value, len(encoded) // 2)


def test_int64_extremes() -> None:
    assert encode_varlong(INT64_MAX).hex() == "feffffffffffffffff01"
    assert encode_varlong(INT64_MIN).hex() == "ffffffffffffffffff01"


@pytest.mark.parametrize("value", [INT32_MAX + 1, INT32_MIN - 1])
def test_varint_out_of_range_is_refused(value: int) -> None:
    with pytest.raises(ValueError):
        encode_varint(value)


@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1])
def test_varlong_out_of_range_is_refused(value: int) -> None:
    with pytest.raises(ValueError):
        encode_varlong(value)


@pytest.mark.parametrize(
    "raw",
    [
        "",  # nothing
        "80",  # continuation, then the end
        "ffffff",  # truncated
        "8080808000",  # 5 bytes is the limit, fine below; 6 bytes is over
        "ffffffff7f",  # 35 bits: out of the int32 range
        "ffffffff1f",  # 33 bits
    ],
)
def test_malformed_varint(raw: str) -> None:
    data = bytes.fromhex(raw)
    if raw == "8080808000":
        assert decode_varint(data) == (0, 5)  # non-minimal but legal, as in Kafka
        data = bytes.fromhex("808080808000")
    with pytest.raises(CorruptRecordError):
        decode_varint(data)


@pytest.mark.parametrize(
    "raw",
    ["", "80", "ffffffffffffffffff", "8080808080808080808000", "ffffffffffffffffff7f"],
)
def test_malformed_varlong(raw: str) -> None:
    with pytest.raises(CorruptRecordError):
        decode_varlong(bytes.fromhex(raw))


def test_decoding_stops_at_end() -> None:
    data = encode_varint(300) + b"\x00"
    with pytest.raises(CorruptRecordError):
        decode_varint(data, 0, 1)
    assert decode_varint(data, 0, 2) == (300, 2)
    assert decode_varint(memoryview(data), 2) == (0, 3)


@given(st.binary(max_size=12), st.integers(0, 12))
def test_arbitrary_bytes_decode_or_raise_corrupt(data: bytes, pos: int) -> None:
    for decode in (decode_varint, decode_varlong):
        try:
            value, end = decode(data, pos)
        except CorruptRecordError:
            continue
        assert pos < end <= len(data)
        assert INT64_MIN <= value <= INT64_MAX
