"""A member's next current assignment (Kafka's CurrentAssignmentBuilder), as a pure function.

A member moves towards the group's target assignment in steps that never let two members own
a partition at once: first it is asked to revoke the partitions it must give up and stays at
its epoch (UNREVOKED_PARTITIONS) until a heartbeat shows it no longer owns them; then it moves
to the target epoch and gets the partitions that are free; partitions still held by another
member (which has not revoked them yet) come later (UNRELEASED_PARTITIONS).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace

from onceflow.groups.consumer_group import Assignment, ConsumerGroupMember, MemberState

# (topic id, partition) -> the epoch of the member holding it, -1 when free
PartitionEpoch = Callable[[uuid.UUID, int], int]
# What the member says it owns (topic id -> partitions); None: it did not say.
Owned = Mapping[uuid.UUID, frozenset[int]] | None


class FencedMemberEpochError(Exception):
    """The member must give up all its partitions and rejoin (FENCED_MEMBER_EPOCH)."""


def _owns_any(owned: Owned, partitions: Assignment) -> bool:
    if owned is None:
        return True  # not said: assume it still owns them
    return any(owned.get(t, frozenset()) & ps for t, ps in partitions.items())


def reconcile(
    member: ConsumerGroupMember,
    target_epoch: int,
    target: Assignment,
    partition_epoch: PartitionEpoch,
    owned: Owned,
) -> ConsumerGroupMember:
    """The member after this heartbeat (the same object if nothing changes)."""
    if member.state is MemberState.STABLE:
        if member.member_epoch != target_epoch:
            return _next(member, member.member_epoch, target_epoch, target, partition_epoch, owned)
        return member
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        if _owns_any(owned, member.pending_revocation):
            return member
        return _next(member, member.member_epoch + 1, target_epoch, target, partition_epoch, owned)
    if member.state is MemberState.UNRELEASED_PARTITIONS:
        return _next(member, member.member_epoch, target_epoch, target, partition_epoch, owned)
    if owned is None or any(owned.values()):
        raise FencedMemberEpochError("the member is in an unknown state")
    return _next(member, target_epoch, target_epoch, target, partition_epoch, owned)


def _bumped(member: ConsumerGroupMember, epoch: int, **changes: object) -> ConsumerGroupMember:
    return replace(member, previous_member_epoch=member.member_epoch, member_epoch=epoch, **changes)


def _next(
    member: ConsumerGroupMember,
    member_epoch: int,
    target_epoch: int,
    target: Assignment,
    partition_epoch: PartitionEpoch,
    owned: Owned,
) -> ConsumerGroupMember:
    unreleased = False
    assigned: dict[uuid.UUID, frozenset[int]] = {}
    revoking: dict[uuid.UUID, frozenset[int]] = {}
    pending: dict[uuid.UUID, frozenset[int]] = {}
    for topic_id in set(target) | set(member.assigned):
        wanted = target.get(topic_id, frozenset())
        current = member.assigned.get(topic_id, frozenset())
        kept = current & wanted
        to_assign = wanted - kept
        free = frozenset(p for p in to_assign if partition_epoch(topic_id, p) == -1)
        unreleased = unreleased or free != to_assign
        if kept:
            assigned[topic_id] = kept
        if current - wanted:
            revoking[topic_id] = current - wanted
        if free:
            pending[topic_id] = free
    if revoking and _owns_any(owned, revoking):
        return _bumped(
            member,
            member_epoch,
            state=MemberState.UNREVOKED_PARTITIONS,
            assigned=assigned,
            pending_revocation=revoking,
        )
    for topic_id, free in pending.items():
        assigned[topic_id] = assigned.get(topic_id, frozenset()) | free
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    updated = _bumped(member, target_epoch, state=state, assigned=assigned, pending_revocation={})
    return member if updated == member else updated
