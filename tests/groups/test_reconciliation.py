"""A member's reconciliation towards its target (Kafka's CurrentAssignmentBuilder)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.groups.consumer_group import ConsumerGroupMember, MemberState
from onceflow.groups.reconciliation import FencedMemberEpochError, reconcile

T = uuid.UUID(int=7)


def free(topic_id: uuid.UUID, partition: int) -> int:
    return -1


def test_stable_member_moves_to_a_new_target_when_nothing_is_revoked() -> None:
    member = ConsumerGroupMember("m", member_epoch=1, assigned={T: frozenset({0})})
    after = reconcile(member, 2, {T: frozenset({0, 1})}, free, None)
    assert after.state is MemberState.STABLE
    assert (after.member_epoch, after.previous_member_epoch) == (2, 1)
    assert after.assigned == {T: frozenset({0, 1})}


def test_revocation_comes_before_the_new_epoch() -> None:
    member = ConsumerGroupMember("m", member_epoch=1, assigned={T: frozenset({0, 1})})
    asked = reconcile(member, 2, {T: frozenset({0})}, free, {T: frozenset({0, 1})})
    assert asked.state is MemberState.UNREVOKED_PARTITIONS
    assert asked.member_epoch == 1  # stays at its epoch until it revoked
    assert asked.assigned == {T: frozenset({0})}
    assert asked.pending_revocation == {T: frozenset({1})}
    # Still owns partition 1: nothing changes.
    assert reconcile(asked, 2, {T: frozenset({0})}, free, {T: frozenset({0, 1})}) is asked
    # Not said (None): assumed still owned.
    assert reconcile(asked, 2, {T: frozenset({0})}, free, None) is asked
    done = reconcile(asked, 2, {T: frozenset({0})}, free, {T: frozenset({0})})
    assert done.state is MemberState.STABLE and done.member_epoch == 2
    assert done.pending_revocation == {}


def test_partitions_another_member_holds_wait() -> None:
    member = ConsumerGroupMember("m", member_epoch=1)

    def held(topic_id: uuid.UUID, partition: int) -> int:
        return 1 if partition == 1 else -1

    after = reconcile(member, 2, {T: frozenset({0, 1})}, held, {})
    assert after.state is MemberState.UNRELEASED_PARTITIONS
    assert after.member_epoch == 2 and after.assigned == {T: frozenset({0})}
    released = reconcile(after, 2, {T: frozenset({0, 1})}, free, {T: frozenset({0})})
    assert released.state is MemberState.STABLE and released.assigned == {T: frozenset({0, 1})}


def test_unknown_state_is_fenced_unless_the_member_owns_nothing() -> None:
    member = ConsumerGroupMember("m", member_epoch=1, state=MemberState.UNKNOWN)
    with pytest.raises(FencedMemberEpochError):
        reconcile(member, 2, {}, free, {T: frozenset({0})})
    assert reconcile(member, 2, {}, free, {}).state is MemberState.STABLE


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.frozensets(st.integers(0, 7), max_size=8),  # member a's new target
            st.booleans(),  # a heartbeat from a (else from b)
            st.booleans(),  # the member reports its owned partitions
        ),
        min_size=1,
        max_size=30,
    )
)
def test_no_partition_is_ever_owned_by_two_members(steps) -> None:
    """Two members and targets that move partitions between them: whatever the order of
    heartbeats, a partition is given to a member only once the other no longer holds it."""
    everything = frozenset(range(8))
    members = {
        "a": ConsumerGroupMember("a", member_epoch=1, assigned={T: everything}),
        "b": ConsumerGroupMember("b", member_epoch=1),
    }
    # What each client really owns (it drops revoked partitions at once, reports on heartbeat).
    owns = {"a": set(everything), "b": set()}
    epoch = 1
    targets = {"a": everything, "b": frozenset()}
    for target_a, from_a, reports in steps:
        epoch += 1
        targets = {"a": target_a, "b": everything - target_a}
        name = "a" if from_a else "b"
        other = "b" if from_a else "a"
        member = members[name]
        other_member = members[other]

        def holder(topic_id, partition, other_member=other_member):
            held = other_member.assigned.get(topic_id, frozenset()) | (
                other_member.pending_revocation.get(topic_id, frozenset())
            )
            return other_member.member_epoch if partition in held else -1

        owned = {T: frozenset(owns[name])} if reports else None
        updated = reconcile(member, epoch, {T: targets[name]}, holder, owned)
        members[name] = updated
        # The client applies the answer: it owns what it is assigned, nothing pending revocation.
        owns[name] = set(updated.assigned.get(T, frozenset()))
        assert not owns["a"] & owns["b"], (owns, members)
