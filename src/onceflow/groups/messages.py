"""Requests and results of the group APIs, as the group coordinator sees them.

The broker's handlers translate each Kafka request version into these and back; the coordinator
never sees wire entities.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

GROUP_TYPE_CLASSIC = "classic"
GROUP_TYPE_CONSUMER = "consumer"


@dataclass(frozen=True)
class JoinGroupRequest:
    """A JoinGroup request, any version (the broker fills the fields its version has)."""

    group_id: str
    member_id: str
    protocol_type: str
    protocols: Sequence[tuple[str, bytes]]
    session_timeout_ms: int
    # v0 has none: -1 means "same as the session timeout", as Kafka does for v0.
    rebalance_timeout_ms: int = -1
    group_instance_id: str | None = None
    reason: str | None = None
    client_id: str = ""
    client_host: str = ""
    # v4+: a new dynamic member first gets MEMBER_ID_REQUIRED with its id, then rejoins (KIP-394).
    require_known_member_id: bool = False
    # v9+: a static leader rejoining a Stable group is told to skip the assignment (KIP-814).
    supports_skip_assignment: bool = False


@dataclass(frozen=True)
class JoinGroupMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    # Only the leader gets the members (with their metadata for the selected protocol).
    members: tuple[JoinGroupMember, ...] = ()


@dataclass(frozen=True)
class SyncGroupRequest:
    """A SyncGroup request, any version; the leader sends the assignments."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignments: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True)
class LeaveMember:
    """One member of a LeaveGroup request (v0-v2 carry a single member id)."""

    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class LeaveMemberResult:
    member_id: str
    group_instance_id: str | None
    error: ErrorCode


@dataclass(frozen=True)
class LeaveResult:
    """Top-level error and one result per member. For v0-v2 the broker answers the single
    member's error as the top-level error, as Kafka does."""

    error: ErrorCode
    members: tuple[LeaveMemberResult, ...] = ()


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = GROUP_TYPE_CLASSIC


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupDescription:
    """A DescribeGroups entry. An unknown group is state Dead with GROUP_ID_NOT_FOUND; brokers
    answering DescribeGroups v0-v5 turn that error into NONE, as Kafka does."""

    group_id: str
    error: ErrorCode
    state: str
    protocol_type: str = ""
    protocol_data: str = ""
    members: tuple[MemberDescription, ...] = ()
