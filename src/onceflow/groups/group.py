"""One classic group: its members and its membership state machine (Kafka's ClassicGroup).

The states and their valid previous states are data (``VALID_PREVIOUS_STATES``); every change
of state goes through :meth:`ClassicGroup.transition_to`, which refuses any other move.

Membership is not persisted: it lives in memory only and clients rejoin after a restart
(the JoinGroup/SyncGroup dance is cheap, and a restart drops their connections anyway). Only
committed offsets are written to the offsets log.

This module holds data and the rules that need nothing but the group; the membership manager
(``membership.py``) drives it: it answers requests, runs the timers and hands out responses.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    def __str__(self) -> str:
        return self.value


# state -> the states a group may be in just before entering it (Kafka's ClassicGroupState).
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(
        {
            GroupState.STABLE,
            GroupState.PREPARING_REBALANCE,
            GroupState.COMPLETING_REBALANCE,
            GroupState.EMPTY,
            GroupState.DEAD,
        }
    ),
}


class InvalidStateTransition(Exception):
    """A move the state table does not allow: a bug in the coordinator, never a client error."""

    def __init__(self, group_id: str, current: GroupState, target: GroupState) -> None:
        allowed = ", ".join(sorted(s.value for s in VALID_PREVIOUS_STATES[target]))
        super().__init__(
            f"group {group_id!r} must be in one of [{allowed}] to move to {target}, "
            f"but it is {current}"
        )
        self.group_id = group_id
        self.current = current
        self.target = target


Protocols = list[tuple[str, bytes]]
# Callbacks are typed loosely here; the coordinator knows the concrete result classes.
Responder = Callable[[Any], None]


@dataclass(eq=False)
class Member:
    """One member of a classic group."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    assignment: bytes = b""
    awaiting_join: Responder | None = None
    awaiting_sync: Responder | None = None
    # A member added by this rebalance: its JoinGroup may time out (it cannot heartbeat yet).
    is_new: bool = False
    # When the coordinator gives up on this member unless it hears from it (None: no deadline).
    heartbeat_deadline_ms: int | None = None

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def matches(self, protocols: Protocols) -> bool:
        return list(protocols) == list(self.protocols)

    def metadata(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")


@dataclass(eq=False)
class ClassicGroup:
    """Membership state of one group. Not thread-safe; the coordinator serialises access."""

    group_id: str
    created_ms: int
    state: GroupState = GroupState.EMPTY
    state_timestamp_ms: int = -1
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)
    # Member ids handed out with MEMBER_ID_REQUIRED, with the time they expire if not used.
    pending_join_members: dict[str, int] = field(default_factory=dict)
    pending_sync_members: set[str] = field(default_factory=set)
    # Set when a member joins a new group during its initial delay: the delay is extended.
    new_member_added: bool = False
    # The rebalance in progress: when it completes at the latest, and whether it is the
    # initial delay of a new group (which never completes early).
    join_deadline_ms: int | None = None
    join_is_initial: bool = False
    join_remaining_ms: int = 0
    join_delay_ms: int = 0
    # Members must send SyncGroup before this deadline (for the generation recorded with it).
    sync_deadline_ms: int | None = None
    sync_generation_id: int = -1

    def __post_init__(self) -> None:
        if self.state_timestamp_ms < 0:
            self.state_timestamp_ms = self.created_ms

    # -- state ------------------------------------------------------------------------------

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    def transition_to(self, target: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS_STATES[target]:
            raise InvalidStateTransition(self.group_id, self.state, target)
        self.state = target
        self.state_timestamp_ms = now_ms

    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS_STATES[GroupState.PREPARING_REBALANCE]

    # -- members ----------------------------------------------------------------------------

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

    def is_pending_member(self, member_id: str) -> bool:
        return member_id in self.pending_join_members

    def add(self, member: Member) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise ValueError(
                    f"static member {member.group_instance_id!r} is already in {self.group_id!r}"
                )
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.pending_join_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> Member | None:
        removed = self.members.pop(member_id, None)
        instance_id = None if removed is None else removed.group_instance_id
        if instance_id is not None and self.static_members.get(instance_id) == member_id:
            del self.static_members[instance_id]
        if self.is_leader(member_id):
            # As Kafka: the next member in iteration order (insertion order here) leads.
            self.leader_id = next(iter(self.members), None)
        self.pending_join_members.pop(member_id, None)
        self.pending_sync_members.discard(member_id)
        return removed

    def replace_static_member(
        self, group_instance_id: str, old_member_id: str, new_member_id: str
    ) -> tuple[Member, Member]:
        """Give a known static member a new member id; returns (old, new) members.

        The caller answers whatever the old member id was waiting for with FENCED_INSTANCE_ID.
        """
        old = self.members.pop(old_member_id)
        new = Member(
            member_id=new_member_id,
            group_instance_id=old.group_instance_id,
            client_id=old.client_id,
            client_host=old.client_host,
            rebalance_timeout_ms=old.rebalance_timeout_ms,
            session_timeout_ms=old.session_timeout_ms,
            protocol_type=old.protocol_type,
            protocols=old.protocols,
            assignment=old.assignment,
        )
        self.members[new_member_id] = new
        if self.is_leader(old_member_id):
            self.leader_id = new_member_id
        self.static_members[group_instance_id] = new_member_id
        if old_member_id in self.pending_sync_members:
            self.pending_sync_members.discard(old_member_id)
            self.pending_sync_members.add(new_member_id)
        return old, new

    def static_member_id(self, group_instance_id: str) -> str | None:
        return self.static_members.get(group_instance_id)

    def validate_member(self, member_id: str, group_instance_id: str | None) -> ErrorCode | None:
        """The instance id (if any) maps to this member id, and the member exists."""
        if group_instance_id is not None:
            current = self.static_members.get(group_instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            if current != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        return None

    def validate_offset_commit(
        self,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        *,
        transactional: bool,
    ) -> ErrorCode | None:
        """May this member commit offsets now (OffsetCommit, or TxnOffsetCommit's KIP-447
        fencing with ``transactional``)? Kafka's ClassicGroup.validateOffsetCommit."""
        if self.is_in(GroupState.DEAD):
            return ErrorCode.coordinator_not_available
        if generation_id < 0 and self.is_in(GroupState.EMPTY):
            # Generation -1: a commit outside group management, fine while nobody is a member.
            return None
        if generation_id >= 0 or member_id != "" or group_instance_id is not None:
            error = self.validate_member(member_id, group_instance_id)
            if error is not None:
                return error
            if generation_id != self.generation_id:
                return ErrorCode.illegal_generation
        elif not transactional and not self.is_in(GroupState.EMPTY):
            # Only members commit for a group with members. TxnOffsetCommit v0-v2 carry no
            # member information, so this does not apply to them.
            return ErrorCode.unknown_member_id
        if not transactional and self.is_in(GroupState.COMPLETING_REBALANCE):
            # The member has its new generation but not its assignment yet.
            return ErrorCode.rebalance_in_progress
        return None

    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join is not None)

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join() and not self.pending_join_members

    def not_yet_rejoined_members(self) -> list[Member]:
        return [m for m in self.members.values() if m.awaiting_join is None]

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else pick a member that did; False if none did."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join is not None:
            return True
        for member in self.members.values():
            if member.awaiting_join is not None:
                self.leader_id = member.member_id
                return True
        return False

    # -- protocols --------------------------------------------------------------------------

    def _protocol_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for member in self.members.values():
            for name in set(member.protocol_names):
                counts[name] = counts.get(name, 0) + 1
        return counts

    def candidate_protocols(self) -> set[str]:
        n = len(self.members)
        return {name for name, count in self._protocol_counts().items() if count == n}

    def supports_protocols(self, protocol_type: str, protocol_names: Iterable[str]) -> bool:
        """Could a member with this protocol type and these protocols join?"""
        names = set(protocol_names)
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        if self.protocol_type != protocol_type:
            return False
        # Kafka's count: a protocol every member supports, which any protocol is while the
        # group rebalances without members (the last one expired, a pending one rejoins).
        counts, n = self._protocol_counts(), len(self.members)
        return any(counts.get(name, 0) == n for name in names)

    def select_protocol(self) -> str:
        """The protocol every member supports that most members prefer (Kafka's vote)."""
        if not self.members:
            raise ValueError(f"cannot select a protocol for empty group {self.group_id!r}")
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = member.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name])

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync_members.clear()

    # -- consumer protocol ------------------------------------------------------------------

    @property
    def uses_consumer_protocol(self) -> bool:
        return self.protocol_type == CONSUMER_PROTOCOL_TYPE

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer groups only); None when unknown."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return set()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            parsed = parse_subscription_topics(member.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics.update(parsed)
        return topics

    def is_subscribed_to_topic(self, topic: str) -> bool:
        topics = self.subscribed_topics()
        if topics is None:
            # Unknown: assume subscribed for a consumer group, as Kafka does.
            return self.uses_consumer_protocol
        return topic in topics


def parse_subscription_topics(metadata: bytes) -> list[str] | None:
    """Topics of a ConsumerProtocolSubscription (its v0 prefix, common to every version)."""
    try:
        pos = 2  # int16 version
        (count,) = struct.unpack_from(">i", metadata, pos)
        pos += 4
        if count < 0 or count > len(metadata):
            return None
        topics = []
        for _ in range(count):
            (length,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if length < 0 or pos + length > len(metadata):
                return None
            topics.append(metadata[pos : pos + length].decode("utf-8"))
            pos += length
        return topics
    except (struct.error, UnicodeDecodeError):
        return None
