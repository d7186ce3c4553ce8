"""Record format of the ``__consumer_offsets`` log, byte-compatible with Apache Kafka's.

Key: int16 version, then
  - versions 0 and 1, OffsetCommitKey: group (string), topic (string), partition (int32);
  - version 2, GroupMetadataKey: group (string).
Value of an OffsetCommitKey: int16 version, then
  - v0, v2: offset int64, metadata string, commit timestamp int64;
  - v1: offset int64, metadata string, commit timestamp int64, expire timestamp int64;
  - v3: offset int64, leader epoch int32, metadata string, commit timestamp int64;
  - v4 (flexible): as v3 with a compact string and trailing tagged fields.
A value of None is a tombstone. Strings are int16-length-prefixed UTF-8 (uvarint length + 1
in v4). onceflow writes key v1 and value v3 (v1 when an expire timestamp is set), as Kafka does.

Group membership is not persisted: a GroupMetadataKey is written only as a tombstone when a
group is deleted, and a GroupMetadataValue read from a Kafka-written log is ignored (clients
rejoin after a restart).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from onceflow.groups.offsets import OffsetAndMetadata

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class OffsetsRecordError(ValueError):
    """A record of the offsets log that cannot be decoded (truncated, bad version...)."""


@dataclass(frozen=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True)
class GroupMetadataKey:
    group: str


OffsetsLogKey = OffsetCommitKey | GroupMetadataKey


# -- encoding -------------------------------------------------------------------------------


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    if len(raw) > 0x7FFF:
        raise OffsetsRecordError(f"string of {len(raw)} bytes does not fit an int16 length")
    return _I16.pack(len(raw)) + raw


def encode_offset_commit_key(group: str, topic: str, partition: int) -> bytes:
    return (
        _I16.pack(OFFSET_COMMIT_KEY_VERSION)
        + _string(group)
        + _string(topic)
        + _I32.pack(partition)
    )


def encode_group_metadata_key(group: str) -> bytes:
    return _I16.pack(GROUP_METADATA_KEY_VERSION) + _string(group)


def encode_offset_commit_value(value: OffsetAndMetadata) -> bytes:
    if value.expire_timestamp_ms is not None:
        return (
            _I16.pack(OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY)
            + _I64.pack(value.offset)
            + _string(value.metadata)
            + _I64.pack(value.commit_timestamp_ms)
            + _I64.pack(value.expire_timestamp_ms)
        )
    return (
        _I16.pack(OFFSET_COMMIT_VALUE_VERSION)
        + _I64.pack(value.offset)
        + _I32.pack(value.leader_epoch)
        + _string(value.metadata)
        + _I64.pack(value.commit_timestamp_ms)
    )


# -- decoding -------------------------------------------------------------------------------


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise OffsetsRecordError(f"record truncated at byte {self.pos} (wanted {n} more)")
        chunk = self.buf[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def i16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def uvarint(self) -> int:
        result = shift = 0
        while True:
            byte = self._take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 28:
                raise OffsetsRecordError("unsigned varint longer than 5 bytes")

    def string(self) -> str:
        n = self.i16()
        if n < 0:
            raise OffsetsRecordError("null string where a string is required")
        return self._decode(self._take(n))

    def compact_string(self) -> str:
        n = self.uvarint()
        if n == 0:
            raise OffsetsRecordError("null compact string where a string is required")
        return self._decode(self._take(n - 1))

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self._take(self.uvarint())

    @staticmethod
    def _decode(raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise OffsetsRecordError(f"invalid UTF-8 in string: {exc}") from exc


def decode_key(key: bytes) -> OffsetsLogKey:
    """Decode the key of an offsets-log record; unknown versions raise OffsetsRecordError."""
    r = _Reader(key)
    version = r.i16()
    if version in (0, 1):
        return OffsetCommitKey(r.string(), r.string(), r.i32())
    if version == GROUP_METADATA_KEY_VERSION:
        return GroupMetadataKey(r.string())
    raise OffsetsRecordError(f"unsupported offsets-log key version {version}")


def decode_offset_commit_value(value: bytes) -> OffsetAndMetadata:
    r = _Reader(value)
    version = r.i16()
    if version in (0, 2):
        return OffsetAndMetadata(offset=r.i64(), metadata=r.string(), commit_timestamp_ms=r.i64())
    if version == 1:
        offset, metadata, commit_ts, expire_ts = r.i64(), r.string(), r.i64(), r.i64()
        return OffsetAndMetadata(
            offset=offset,
            metadata=metadata,
            commit_timestamp_ms=commit_ts,
            expire_timestamp_ms=None if expire_ts == -1 else expire_ts,
        )
    if version == 3:
        return OffsetAndMetadata(
            offset=r.i64(), leader_epoch=r.i32(), metadata=r.string(), commit_timestamp_ms=r.i64()
        )
    if version == 4:
        offset, epoch, metadata, commit_ts = r.i64(), r.i32(), r.compact_string(), r.i64()
        r.skip_tagged_fields()
        return OffsetAndMetadata(
            offset=offset, leader_epoch=epoch, metadata=metadata, commit_timestamp_ms=commit_ts
        )
    raise OffsetsRecordError(f"unsupported offset-commit value version {version}")


__all__ = [
    "GroupMetadataKey",
    "OffsetCommitKey",
    "OffsetsLogKey",
    "OffsetsRecordError",
    "decode_key",
    "decode_offset_commit_value",
    "encode_group_metadata_key",
    "encode_offset_commit_key",
    "encode_offset_commit_value",
]
