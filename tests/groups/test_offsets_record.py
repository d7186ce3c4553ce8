"""The offsets-log record format: Kafka's bytes, versions, round trips, malformed input."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.groups.offsets import OffsetAndMetadata
from onceflow.groups.offsets_record import (
    GroupMetadataKey,
    OffsetCommitKey,
    OffsetsRecordError,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_offset_commit_key,
    encode_offset_commit_value,
)


def test_key_bytes_match_kafka() -> None:
    # int16 version 1, int16-length strings, int32 partition.
    assert encode_offset_commit_key("g", "t", 3) == (
        b"\x00\x01" + b"\x00\x01g" + b"\x00\x01t" + b"\x00\x00\x00\x03"
    )
    assert encode_group_metadata_key("grp") == b"\x00\x02\x00\x03grp"


def test_value_v3_bytes_match_kafka() -> None:
    value = OffsetAndMetadata(offset=42, leader_epoch=5, metadata="md", commit_timestamp_ms=7)
    assert encode_offset_commit_value(value) == (
        b"\x00\x03"
        + struct.pack(">q", 42)
        + struct.pack(">i", 5)
        + b"\x00\x02md"
        + struct.pack(">q", 7)
    )


def test_value_with_expiry_is_v1() -> None:
    value = OffsetAndMetadata(10, metadata="", commit_timestamp_ms=1, expire_timestamp_ms=99)
    raw = encode_offset_commit_value(value)
    assert raw[:2] == b"\x00\x01"
    decoded = decode_offset_commit_value(raw)
    assert decoded.expire_timestamp_ms == 99 and decoded.leader_epoch == -1


def test_decodes_older_and_flexible_versions() -> None:
    v0 = b"\x00\x00" + struct.pack(">q", 5) + b"\x00\x01m" + struct.pack(">q", 9)
    assert decode_offset_commit_value(v0) == OffsetAndMetadata(
        5, metadata="m", commit_timestamp_ms=9
    )
    v2 = b"\x00\x02" + v0[2:]
    assert decode_offset_commit_value(v2) == OffsetAndMetadata(
        5, metadata="m", commit_timestamp_ms=9
    )
    # v4: compact string (length + 1 as uvarint) and a tagged-field section with one field.
    v4 = (
        b"\x00\x04"
        + struct.pack(">q", 5)
        + struct.pack(">i", 2)
        + b"\x03md"
        + struct.pack(">q", 9)
        + b"\x01\x00\x02xy"
    )
    assert decode_offset_commit_value(v4) == OffsetAndMetadata(5, 2, "md", 9)
    # Key version 0 is the same layout as version 1.
    assert decode_key(b"\x00\x00\x00\x01g\x00\x01t\x00\x00\x00\x01") == OffsetCommitKey("g", "t", 1)


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x00", b"\x00\x09\x00\x00", b"\x00\x01\x00\x05ab", b"\x00\x01\xff\xff"],
)
def test_malformed_keys_raise(raw: bytes) -> None:
    with pytest.raises(OffsetsRecordError):
        decode_key(raw)


@pytest.mark.parametrize(
    "raw", [b"", b"\x00\x03\x00", b"\x00\x07" + b"\x00" * 30, b"\x00\x03" + b"\x00" * 12 + b"\x80"]
)
def test_malformed_values_raise(raw: bytes) -> None:
    with pytest.raises(OffsetsRecordError):
        decode_offset_commit_value(raw)


int64 = st.integers(-(2**63), 2**63 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
text = st.text(max_size=40)


@given(group=text, topic=text, partition=int32)
def test_key_round_trip(group: str, topic: str, partition: int) -> None:
    assert decode_key(encode_offset_commit_key(group, topic, partition)) == OffsetCommitKey(
        group, topic, partition
    )
    assert decode_key(encode_group_metadata_key(group)) == GroupMetadataKey(group)


@given(
    offset=int64,
    epoch=int32,
    metadata=text,
    ts=int64,
    expire=st.one_of(st.none(), st.integers(0, 2**62)),
)
def test_value_round_trip(
    offset: int, epoch: int, metadata: str, ts: int, expire: int | None
) -> None:
    value = OffsetAndMetadata(offset, epoch, metadata, ts, expire)
    decoded = decode_offset_commit_value(encode_offset_commit_value(value))
    if expire is None:
        assert decoded == value
    else:  # v1 has no leader epoch
        assert decoded == OffsetAndMetadata(offset, -1, metadata, ts, expire)


@given(st.binary(max_size=64))
def test_decoding_garbage_raises_only_offsets_record_error(raw: bytes) -> None:
    for decode in (decode_key, decode_offset_commit_value):
        with contextlib.suppress(OffsetsRecordError):
            decode(raw)
