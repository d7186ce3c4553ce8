"""The KIP-848 consumer group's records in ``__consumer_offsets``, byte-compatible with Kafka's.

A key is an int16 record type, then the key's fields (non-flexible: int16-length strings):
  3 ConsumerGroupMetadataKey (group), 5 ConsumerGroupMemberMetadataKey (group, member),
  6 ConsumerGroupTargetAssignmentMetadataKey (group), 7 ConsumerGroupTargetAssignmentMemberKey
  (group, member), 8 ConsumerGroupCurrentMemberAssignmentKey (group, member),
  9 ConsumerGroupRegularExpressionKey (group, regular expression).
A value is an int16 version (0), then the value's fields in Kafka's flexible encoding (compact
strings and arrays, uuids, tagged fields). A value of None is a tombstone. Type 4
(ConsumerGroupPartitionMetadata, Kafka 4.0) is read and ignored: the subscribed topics' metadata
is kept as a hash in the group's record (tagged field 0, as Kafka 4.1+ writes it).

Each record is a whole value (an upsert), so replaying one twice is harmless.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from onceflow.coordinator.schema import (
    INT8,
    INT16,
    INT32,
    INT64,
    SchemaReader,
    encode_compact_string,
    encode_string,
    encode_tagged_field,
    encode_uvarint,
)
from onceflow.groups.offsets_record import OffsetsRecordError

CONSUMER_GROUP_METADATA = 3
CONSUMER_GROUP_PARTITION_METADATA = 4
CONSUMER_GROUP_MEMBER_METADATA = 5
CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA = 6
CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER = 7
CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT = 8
CONSUMER_GROUP_REGULAR_EXPRESSION = 9
RECORD_TYPES = frozenset(range(3, 10))

# topic id -> partitions
Assignment = Mapping[uuid.UUID, frozenset[int]]


class ConsumerGroupRecordError(OffsetsRecordError):
    """A consumer group record that cannot be decoded (an offsets-log record error)."""


@dataclass(frozen=True)
class GroupMetadataValue:
    epoch: int
    metadata_hash: int = 0


@dataclass(frozen=True)
class MemberMetadataValue:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    # A member using the classic protocol in a consumer group (tagged field 0 of version 0).
    classic: ClassicMemberMetadata | None = None


@dataclass(frozen=True)
class ClassicMemberMetadata:
    """A classic member's session timeout and its JoinGroup protocols (name, metadata)."""

    session_timeout_ms: int
    supported_protocols: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class CurrentAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned: Assignment
    pending_revocation: Assignment


@dataclass(frozen=True)
class RegularExpressionValue:
    topics: tuple[str, ...]
    version: int
    timestamp_ms: int


@dataclass(frozen=True)
class ConsumerGroupKey:
    record_type: int
    group_id: str
    # The member id (types 5, 7, 8) or the regular expression (type 9); "" otherwise.
    name: str = ""


# -- encoding -------------------------------------------------------------------------------


def _string(s: str) -> bytes:
    return encode_string(s, ConsumerGroupRecordError)


def _nullable_compact(s: str | None) -> bytes:
    return b"\x00" if s is None else encode_compact_string(s)


def _compact_array(items: Sequence[bytes]) -> bytes:
    return encode_uvarint(len(items) + 1) + b"".join(items)


def _no_tags() -> bytes:
    return b"\x00"


def _topic_partitions(assignment: Assignment) -> bytes:
    items = []
    for topic_id in sorted(assignment, key=str):
        partitions = sorted(assignment[topic_id])
        items.append(
            topic_id.bytes + _compact_array([INT32.pack(p) for p in partitions]) + _no_tags()
        )
    return _compact_array(items)


def encode_key(key: ConsumerGroupKey) -> bytes:
    out = INT16.pack(key.record_type) + _string(key.group_id)
    if key.record_type in (
        CONSUMER_GROUP_MEMBER_METADATA,
        CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
        CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT,
        CONSUMER_GROUP_REGULAR_EXPRESSION,
    ):
        out += _string(key.name)
    return out


def encode_group_metadata(value: GroupMetadataValue) -> bytes:
    tags = encode_uvarint(1) + encode_tagged_field(0, INT64.pack(value.metadata_hash))
    return INT16.pack(0) + INT32.pack(value.epoch) + tags


def encode_member_metadata(value: MemberMetadataValue) -> bytes:
    return (
        INT16.pack(0)
        + _nullable_compact(value.instance_id)
        + _nullable_compact(value.rack_id)
        + encode_compact_string(value.client_id)
        + encode_compact_string(value.client_host)
        + _compact_array([encode_compact_string(t) for t in value.subscribed_topic_names])
        + _nullable_compact(value.subscribed_topic_regex)
        + INT32.pack(value.rebalance_timeout_ms)
        + _nullable_compact(value.server_assignor)
        + _member_tags(value.classic)
    )


def _member_tags(classic: ClassicMemberMetadata | None) -> bytes:
    if classic is None:
        return _no_tags()
    protocols = [
        encode_compact_string(name) + encode_uvarint(len(metadata) + 1) + metadata + _no_tags()
        for name, metadata in classic.supported_protocols
    ]
    body = INT32.pack(classic.session_timeout_ms) + _compact_array(protocols) + _no_tags()
    return encode_uvarint(1) + encode_tagged_field(0, body)


def _decode_classic(data: bytes) -> ClassicMemberMetadata:
    r = SchemaReader(data, ConsumerGroupRecordError)
    session = r.unpack(INT32)
    protocols = []
    for _ in range(_read_count(r)):
        name = r.compact_string()
        length = r.uvarint() - 1
        if length < 0:
            raise ConsumerGroupRecordError("null protocol metadata")
        protocols.append((name, r.take(length)))
        r.tagged_fields()
    r.tagged_fields()
    return ClassicMemberMetadata(session, tuple(protocols))


def encode_target_assignment_metadata(assignment_epoch: int) -> bytes:
    return INT16.pack(0) + INT32.pack(assignment_epoch) + _no_tags()


def encode_target_assignment_member(assignment: Assignment) -> bytes:
    return INT16.pack(0) + _topic_partitions(assignment) + _no_tags()


def encode_current_assignment(value: CurrentAssignmentValue) -> bytes:
    return (
        INT16.pack(0)
        + INT32.pack(value.member_epoch)
        + INT32.pack(value.previous_member_epoch)
        + INT8.pack(value.state)
        + _topic_partitions(value.assigned)
        + _topic_partitions(value.pending_revocation)
        + _no_tags()
    )


def encode_regular_expression(value: RegularExpressionValue) -> bytes:
    return (
        INT16.pack(0)
        + _compact_array([encode_compact_string(t) for t in value.topics])
        + INT64.pack(value.version)
        + INT64.pack(value.timestamp_ms)
        + _no_tags()
    )


# -- decoding -------------------------------------------------------------------------------


def record_type(key: bytes) -> int:
    """The record type (the key's version) of any ``__consumer_offsets`` key; -1 if too short."""
    return INT16.unpack(key[:2])[0] if len(key) >= 2 else -1


def decode_key(key: bytes) -> ConsumerGroupKey:
    r = SchemaReader(key, ConsumerGroupRecordError)
    kind = r.unpack(INT16)
    if kind not in RECORD_TYPES:
        raise ConsumerGroupRecordError(f"not a consumer group record type: {kind}")
    group_id = r.string()
    name = ""
    if kind in (
        CONSUMER_GROUP_MEMBER_METADATA,
        CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
        CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT,
        CONSUMER_GROUP_REGULAR_EXPRESSION,
    ):
        name = r.string()
    return ConsumerGroupKey(kind, group_id, name)


def _reader(value: bytes) -> SchemaReader:
    r = SchemaReader(value, ConsumerGroupRecordError)
    version = r.unpack(INT16)
    if version != 0:
        raise ConsumerGroupRecordError(f"unsupported consumer group value version {version}")
    return r


def _read_nullable_compact(r: SchemaReader) -> str | None:
    length = r.uvarint() - 1
    if length < 0:
        return None
    return r.take(length).decode("utf-8", errors="replace")


def _read_count(r: SchemaReader) -> int:
    count = r.uvarint() - 1
    if count < 0 or count > len(r.buf):
        raise ConsumerGroupRecordError(f"bad array length {count}")
    return count


def _read_strings(r: SchemaReader) -> tuple[str, ...]:
    return tuple(r.compact_string() for _ in range(_read_count(r)))


def _read_topic_partitions(r: SchemaReader) -> dict[uuid.UUID, frozenset[int]]:
    out: dict[uuid.UUID, frozenset[int]] = {}
    for _ in range(_read_count(r)):
        topic_id = uuid.UUID(bytes=r.take(16))
        partitions = frozenset(r.unpack(INT32) for _ in range(_read_count(r)))
        r.tagged_fields()
        if partitions:
            out[topic_id] = partitions
    return out


def decode_group_metadata(value: bytes) -> GroupMetadataValue:
    r = _reader(value)
    epoch = r.unpack(INT32)
    tags = r.tagged_fields()
    metadata_hash = INT64.unpack(tags[0])[0] if len(tags.get(0, b"")) == 8 else 0
    return GroupMetadataValue(epoch, metadata_hash)


def decode_member_metadata(value: bytes) -> MemberMetadataValue:
    r = _reader(value)
    instance_id = _read_nullable_compact(r)
    rack_id = _read_nullable_compact(r)
    client_id = r.compact_string()
    client_host = r.compact_string()
    topics = _read_strings(r)
    regex = _read_nullable_compact(r)
    rebalance_timeout_ms = r.unpack(INT32)
    assignor = _read_nullable_compact(r)
    tags = r.tagged_fields()
    classic = _decode_classic(tags[0]) if 0 in tags else None
    return MemberMetadataValue(
        instance_id,
        rack_id,
        client_id,
        client_host,
        topics,
        regex,
        rebalance_timeout_ms,
        assignor,
        classic,
    )


def decode_target_assignment_metadata(value: bytes) -> int:
    r = _reader(value)
    return r.unpack(INT32)


def decode_target_assignment_member(value: bytes) -> dict[uuid.UUID, frozenset[int]]:
    return _read_topic_partitions(_reader(value))


def decode_current_assignment(value: bytes) -> CurrentAssignmentValue:
    r = _reader(value)
    epoch, previous, state = r.unpack(INT32), r.unpack(INT32), r.unpack(INT8)
    assigned = _read_topic_partitions(r)
    pending = _read_topic_partitions(r)
    return CurrentAssignmentValue(epoch, previous, state, assigned, pending)


def decode_regular_expression(value: bytes) -> RegularExpressionValue:
    r = _reader(value)
    topics = _read_strings(r)
    return RegularExpressionValue(topics, r.unpack(INT64), r.unpack(INT64))
