"""A classic group's record in ``__consumer_offsets``: Kafka's GroupMetadataValue.

The key is GroupMetadataKey (version 2, the group id; ``offsets_record.py``). The value,
byte-compatible with Apache Kafka's generated GroupMetadataValue: int16 version, then
  protocol type (string), generation (int32), protocol (nullable string), leader (nullable
  string), current state timestamp (int64, v2+), and the members (int32 count), each:
  member id (string), group instance id (nullable string, v3+), client id (string), client
  host (string), rebalance timeout (int32, v1+), session timeout (int32), subscription
  (bytes: the member's metadata for the group's protocol), assignment (bytes).
Version 4 is flexible (compact strings and bytes, compact arrays, tagged fields after each
struct). onceflow writes version 3, as Kafka 4 does (``groupMetadataValueVersion``).
"""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.coordinator.result import Record
from onceflow.coordinator.schema import INT16, INT32, INT64, SchemaReader, encode_string
from onceflow.groups.group import ClassicGroup, GroupState, Member
from onceflow.groups.offsets_record import OffsetsRecordError, encode_group_metadata_key

GROUP_METADATA_VALUE_VERSION = 3
_MAX_VALUE_VERSION = 4


@dataclass(frozen=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int  # -1 when the record (v0) has none: the session timeout then
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int  # -1: unknown (v0-v1)
    members: tuple[MemberMetadata, ...]


# -- encoding (version 3) -------------------------------------------------------------------


def _string(s: str) -> bytes:
    return encode_string(s, OffsetsRecordError)


def _nullable_string(s: str | None) -> bytes:
    return INT16.pack(-1) if s is None else _string(s)


def _bytes(b: bytes) -> bytes:
    return INT32.pack(len(b)) + b


def encode_group_metadata_value(value: GroupMetadataValue) -> bytes:
    parts = [
        INT16.pack(GROUP_METADATA_VALUE_VERSION),
        _string(value.protocol_type),
        INT32.pack(value.generation),
        _nullable_string(value.protocol),
        _nullable_string(value.leader),
        INT64.pack(value.current_state_timestamp_ms),
        INT32.pack(len(value.members)),
    ]
    for m in value.members:
        parts += [
            _string(m.member_id),
            _nullable_string(m.group_instance_id),
            _string(m.client_id),
            _string(m.client_host),
            INT32.pack(m.rebalance_timeout_ms),
            INT32.pack(m.session_timeout_ms),
            _bytes(m.subscription),
            _bytes(m.assignment),
        ]
    return b"".join(parts)


# -- decoding (versions 0-4) ----------------------------------------------------------------


class _Fields:
    """The readers of one version: int16/int32 lengths, or compact (uvarint) ones in v4."""

    def __init__(self, r: SchemaReader, flexible: bool) -> None:
        self.r = r
        self.flexible = flexible

    def _length(self, wide: bool) -> int:
        if self.flexible:
            return self.r.uvarint() - 1
        return self.r.unpack(INT32 if wide else INT16)

    def nullable_string(self) -> str | None:
        length = self._length(wide=False)
        if length < 0:
            return None
        try:
            return self.r.take(length).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise OffsetsRecordError(f"invalid UTF-8 string: {exc}") from exc

    def string(self) -> str:
        s = self.nullable_string()
        if s is None:
            raise OffsetsRecordError("null string where a string is required")
        return s

    def bytes(self) -> bytes:
        length = self._length(wide=True)
        if length < 0:
            raise OffsetsRecordError("null bytes where bytes are required")
        return self.r.take(length)

    def count(self) -> int:
        n = self._length(wide=True)
        # Each member takes at least a few bytes: a count beyond what is left is corrupt.
        if n < 0 or n > len(self.r.buf) - self.r.pos:
            raise OffsetsRecordError(f"invalid member count {n}")
        return n

    def end_struct(self) -> None:
        if self.flexible:
            self.r.tagged_fields()


def decode_group_metadata_value(value: bytes) -> GroupMetadataValue:
    """Decode any version Kafka writes (0-4); raises OffsetsRecordError otherwise."""
    r = SchemaReader(value, OffsetsRecordError)
    version = r.unpack(INT16)
    if not 0 <= version <= _MAX_VALUE_VERSION:
        raise OffsetsRecordError(f"unsupported group metadata value version {version}")
    f = _Fields(r, flexible=version >= 4)
    protocol_type = f.string()
    generation = r.unpack(INT32)
    protocol = f.nullable_string()
    leader = f.nullable_string()
    timestamp = r.unpack(INT64) if version >= 2 else -1
    members = []
    for _ in range(f.count()):
        member_id = f.string()
        instance_id = f.nullable_string() if version >= 3 else None
        client_id, client_host = f.string(), f.string()
        rebalance_timeout = r.unpack(INT32) if version >= 1 else -1
        session_timeout = r.unpack(INT32)
        subscription, assignment = f.bytes(), f.bytes()
        f.end_struct()
        members.append(
            MemberMetadata(
                member_id,
                instance_id,
                client_id,
                client_host,
                rebalance_timeout,
                session_timeout,
                subscription,
                assignment,
            )
        )
    f.end_struct()
    return GroupMetadataValue(
        protocol_type, generation, protocol, leader, timestamp, tuple(members)
    )


# -- a classic group and its record ---------------------------------------------------------


def group_metadata_record(group: ClassicGroup, assignment: dict[str, bytes]) -> Record:
    """The group's record as Kafka's GroupCoordinatorRecordHelpers.newGroupMetadataRecord
    makes it: every member with its metadata for the group's protocol and its assignment."""
    members = tuple(
        MemberMetadata(
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            client_id=m.client_id,
            client_host=m.client_host,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            session_timeout_ms=m.session_timeout_ms,
            subscription=m.metadata(group.protocol_name),
            assignment=assignment[m.member_id],
        )
        for m in group.members.values()
    )
    value = GroupMetadataValue(
        protocol_type=group.protocol_type or "",
        generation=group.generation_id,
        protocol=group.protocol_name,
        leader=group.leader_id,
        current_state_timestamp_ms=group.state_timestamp_ms,
        members=members,
    )
    return encode_group_metadata_key(group.group_id), encode_group_metadata_value(value)


def loaded_group(group_id: str, value: GroupMetadataValue, now_ms: int) -> ClassicGroup:
    """The group a record stands for, as Kafka's replay of a GroupMetadataValue builds it:
    Stable with its members (each supporting the group's protocol only), or Empty."""
    group = ClassicGroup(
        group_id,
        created_ms=now_ms,
        state=GroupState.STABLE if value.members else GroupState.EMPTY,
        state_timestamp_ms=value.current_state_timestamp_ms,
        generation_id=value.generation,
        protocol_type=value.protocol_type or None,
        protocol_name=value.protocol,
    )
    for m in value.members:
        group.add(
            Member(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout_ms=(
                    m.session_timeout_ms if m.rebalance_timeout_ms == -1 else m.rebalance_timeout_ms
                ),
                session_timeout_ms=m.session_timeout_ms,
                protocol_type=value.protocol_type,
                protocols=[(value.protocol or "", m.subscription)],
                assignment=m.assignment,
            )
        )
    group.protocol_type = value.protocol_type or None
    group.leader_id = value.leader
    return group


__all__ = [
    "GROUP_METADATA_VALUE_VERSION",
    "GroupMetadataValue",
    "MemberMetadata",
    "decode_group_metadata_value",
    "encode_group_metadata_value",
    "group_metadata_record",
    "loaded_group",
]
