"""One KIP-848 consumer group and its members (Kafka's ConsumerGroup, ConsumerGroupMember).

The group epoch counts changes of what the assignment depends on (members, subscriptions, the
subscribed topics' partitions); the target assignment is computed for an epoch (the assignment
epoch); each member reconciles towards it at its own pace (its member epoch), giving up the
partitions it must revoke before they are handed to their new owner.

Everything here changes only by replaying records (``consumer_groups.py``); the deadlines
(session, rebalance timeout) are in memory and restart after a load, as in Kafka.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from onceflow.groups.consumer_records import ClassicMemberMetadata

Assignment = Mapping[uuid.UUID, frozenset[int]]

# A member epoch of -2 in a current-assignment record: a static member that left and may come
# back (with the same instance id) within its session timeout.
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2
LEAVE_GROUP_MEMBER_EPOCH = -1


class MemberState(enum.IntEnum):
    """Kafka's MemberState, with its record values."""

    UNREVOKED_PARTITIONS = 0
    UNRELEASED_PARTITIONS = 1
    STABLE = 2
    UNKNOWN = 127


class ConsumerGroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True)
class ConsumerGroupMember:
    member_id: str
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    # Set for a member that uses the classic protocol (JoinGroup/SyncGroup/Heartbeat).
    classic: ClassicMemberMetadata | None = None

    @property
    def uses_classic_protocol(self) -> bool:
        return self.classic is not None

    def session_timeout_ms(self, consumer_session_timeout_ms: int) -> int:
        """A classic member's own session timeout; the group's for a consumer member."""
        if self.classic is None:
            return consumer_session_timeout_ms
        return self.classic.session_timeout_ms

    def is_reconciled_to(self, assignment_epoch: int) -> bool:
        return self.state is MemberState.STABLE and self.member_epoch == assignment_epoch

    def same_subscription(self, other: ConsumerGroupMember) -> bool:
        return (
            self.subscribed_topic_names == other.subscribed_topic_names
            and self.subscribed_topic_regex == other.subscribed_topic_regex
            and self.server_assignor == other.server_assignor
            and self.rack_id == other.rack_id
        )

    def same_metadata(self, other: ConsumerGroupMember) -> bool:
        return self.same_subscription(other) and (
            self.instance_id,
            self.client_id,
            self.client_host,
            self.rebalance_timeout_ms,
            self.classic,
        ) == (
            other.instance_id,
            other.client_id,
            other.client_host,
            other.rebalance_timeout_ms,
            other.classic,
        )


@dataclass
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    metadata_hash: int = 0
    members: dict[str, ConsumerGroupMember] = field(default_factory=dict)
    target_assignment: dict[str, Assignment] = field(default_factory=dict)
    # instance id -> member id
    static_members: dict[str, str] = field(default_factory=dict)
    # (topic id, partition) -> epoch of the member holding it (assigned or pending revocation)
    partition_epochs: dict[tuple[uuid.UUID, int], int] = field(default_factory=dict)
    # regular expression -> the topics it resolved to
    resolved_regexes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    regex_refreshed_ms: int = -1
    # In memory only: when each member's session and its revocation (rebalance timeout) end.
    session_deadlines: dict[str, int] = field(default_factory=dict)
    rebalance_deadlines: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Classic members only: they must rejoin (after REBALANCE_IN_PROGRESS) and sync (after
    # their JoinGroup) within their rebalance timeout, or they are fenced, as in Kafka.
    join_deadlines: dict[str, int] = field(default_factory=dict)
    sync_deadlines: dict[str, int] = field(default_factory=dict)

    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        if any(not m.is_reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def is_empty(self) -> bool:
        return not self.members

    def num_classic_members(self) -> int:
        return sum(1 for m in self.members.values() if m.uses_classic_protocol)

    def supports_classic_protocols(self, protocol_type: str, names: set[str]) -> bool:
        """Kafka's supportsClassicProtocols: the joining member's protocol type is "consumer"
        and one of its protocols is supported by every classic member already in."""
        if protocol_type != "consumer":
            return False
        classic = [m.classic for m in self.members.values() if m.classic is not None]
        if not self.members:
            return bool(names)
        return any(
            all(name in {n for n, _ in c.supported_protocols} for c in classic) for name in names
        )

    def waiting_on_unreleased_partition(self, member: ConsumerGroupMember) -> bool:
        """The member waits for a partition of its target that another member still holds."""
        if member.state is not MemberState.UNRELEASED_PARTITIONS:
            return False
        for topic_id, partitions in self.target_assignment.get(member.member_id, {}).items():
            held = member.assigned.get(topic_id, frozenset())
            for p in partitions:
                if p not in held and self.current_partition_epoch(topic_id, p) != -1:
                    return True
        return False

    def current_partition_epoch(self, topic_id: uuid.UUID, partition: int) -> int:
        return self.partition_epochs.get((topic_id, partition), -1)

    def static_member(self, instance_id: str) -> ConsumerGroupMember | None:
        member_id = self.static_members.get(instance_id)
        return None if member_id is None else self.members.get(member_id)

    # -- replay ---------------------------------------------------------------------------

    def put_member(self, member: ConsumerGroupMember) -> None:
        old = self.members.get(member.member_id)
        if old is not None:
            self._release(old)
            if old.instance_id is not None and old.instance_id != member.instance_id:
                self.static_members.pop(old.instance_id, None)
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id
        self._hold(member)

    def remove_member(self, member_id: str) -> None:
        old = self.members.pop(member_id, None)
        if old is None:
            return
        self._release(old)
        if old.instance_id is not None and self.static_members.get(old.instance_id) == member_id:
            del self.static_members[old.instance_id]
        self.session_deadlines.pop(member_id, None)
        self.rebalance_deadlines.pop(member_id, None)
        self.join_deadlines.pop(member_id, None)
        self.sync_deadlines.pop(member_id, None)

    def _hold(self, member: ConsumerGroupMember) -> None:
        for assignment in (member.assigned, member.pending_revocation):
            for topic_id, partitions in assignment.items():
                for p in partitions:
                    self.partition_epochs[(topic_id, p)] = member.member_epoch

    def _release(self, member: ConsumerGroupMember) -> None:
        for assignment in (member.assigned, member.pending_revocation):
            for topic_id, partitions in assignment.items():
                for p in partitions:
                    if self.partition_epochs.get((topic_id, p)) == member.member_epoch:
                        del self.partition_epochs[(topic_id, p)]
