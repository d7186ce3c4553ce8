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

from dataclasses import dataclass

from onceflow.coordinator.schema import INT16, INT32, INT64, SchemaReader, encode_string
from onceflow.groups.offsets import OffsetAndMetadata

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1


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
    return encode_string(s, OffsetsRecordError)


def encode_offset_commit_key(group: str, topic: str, partition: int) -> bytes:
    return (
        INT16.pack(OFFSET_COMMIT_KEY_VERSION)
        + _string(group)
        + _string(topic)
        + INT32.pack(partition)
    )


def encode_group_metadata_key(group: str) -> bytes:
    return INT16.pack(GROUP_METADATA_KEY_VERSION) + _string(group)


def encode_offset_commit_value(value: OffsetAndMetadata) -> bytes:
    if value.expire_timestamp_ms is not None:
        return (
            INT16.pack(OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY)
            + INT64.pack(value.offset)
            + _string(value.metadata)
            + INT64.pack(value.commit_timestamp_ms)
            + INT64.pack(value.expire_timestamp_ms)
        )
    return (
        INT16.pack(OFFSET_COMMIT_VALUE_VERSION)
        + INT64.pack(value.offset)
        + INT32.pack(value.leader_epoch)
        + _string(value.metadata)
        + INT64.pack(value.commit_timestamp_ms)
    )


# -- decoding -------------------------------------------------------------------------------


def decode_key(key: bytes) -> OffsetsLogKey:
    """Decode the key of an offsets-log record; unknown versions raise OffsetsRecordError."""
    r = SchemaReader(key, OffsetsRecordError)
    version = r.unpack(INT16)
    if version in (0, 1):
        return OffsetCommitKey(r.string(), r.string(), r.unpack(INT32))
    if version == GROUP_METADATA_KEY_VERSION:
        return GroupMetadataKey(r.string())
    raise OffsetsRecordError(f"unsupported offsets-log key version {version}")


def decode_offset_commit_value(value: bytes) -> OffsetAndMetadata:
    r = SchemaReader(value, OffsetsRecordError)
    version = r.unpack(INT16)
    if version in (0, 2):
        return OffsetAndMetadata(
            offset=r.unpack(INT64), metadata=r.string(), commit_timestamp_ms=r.unpack(INT64)
        )
    if version == 1:
        offset, metadata = r.unpack(INT64), r.string()
        commit_ts, expire_ts = r.unpack(INT64), r.unpack(INT64)
        return OffsetAndMetadata(
            offset=offset,
            metadata=metadata,
            commit_timestamp_ms=commit_ts,
            expire_timestamp_ms=None if expire_ts == -1 else expire_ts,
        )
    if version == 3:
        return OffsetAndMetadata(
            offset=r.unpack(INT64),
            leader_epoch=r.unpack(INT32),
            metadata=r.string(),
            commit_timestamp_ms=r.unpack(INT64),
        )
    if version == 4:
        offset, epoch = r.unpack(INT64), r.unpack(INT32)
        metadata, commit_ts = r.compact_string(), r.unpack(INT64)
        r.tagged_fields()
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
