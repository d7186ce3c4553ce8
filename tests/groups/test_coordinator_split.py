"""The group coordinator split along Kafka's line: one result type, the timers' order."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.clock import ManualClock
from onceflow.coordinator.result import CoordinatorResult
from onceflow.groups.coordinator import GroupCoordinator
from onceflow.groups.deadlines import (
    Deadline,
    TimerKind,
    due_deadlines,
    next_deadline,
    still_set,
)
from onceflow.groups.group import ClassicGroup
from onceflow.groups.offsets import OffsetAndMetadata
from onceflow.txn.coordinator import TransactionCoordinator


def test_group_and_transaction_coordinators_return_the_one_result_type() -> None:
    # One driver can run both coordinators only if they answer with the same type.
    clock = ManualClock()
    groups = GroupCoordinator(clock)
    commit = groups.commit_offsets("g", -1, "", None, {("t", 0): OffsetAndMetadata(5)})
    txn = TransactionCoordinator(clock).init_producer_id("tx", 60_000)

    assert type(commit) is CoordinatorResult
    assert type(txn) is CoordinatorResult
    assert commit.response == {("t", 0): ErrorCode.none}
    assert len(commit.records) == 1
    assert commit.markers is None


def test_group_deletion_composes_offset_and_group_tombstones() -> None:
    clock = ManualClock()
    groups = GroupCoordinator(clock)
    offsets = {("b", 1): OffsetAndMetadata(1), ("a", 0): OffsetAndMetadata(2)}
    for key, value in groups.commit_offsets("g", -1, "", None, offsets).records:
        groups.replay(key, value)

    result = groups.delete_groups(["g", "missing"])

    assert result.response == {"g": ErrorCode.none, "missing": ErrorCode.group_id_not_found}
    # Offsets first (sorted), the group last: replaying them in order removes all of it.
    assert [value for _, value in result.records] == [None, None, None]
    for key, value in result.records:
        groups.replay(key, value)
    assert groups.group("g") is None
    assert groups.fetch_offsets("g", None) == {}


def test_due_deadlines_fire_by_time_then_kind() -> None:
    group = ClassicGroup("g", created_ms=0)
    group.join_deadline_ms = 100
    group.sync_deadline_ms = 50
    group.pending_join_members["p"] = 100

    assert next_deadline([group]) == 50
    assert due_deadlines([group], 60) == [Deadline(50, TimerKind.SYNC, "g")]
    assert due_deadlines([group], 100) == [
        Deadline(50, TimerKind.SYNC, "g"),
        Deadline(100, TimerKind.JOIN, "g"),
        Deadline(100, TimerKind.PENDING_MEMBER, "g", "p"),
    ]


def test_a_deadline_moved_by_an_earlier_one_is_not_fired() -> None:
    group = ClassicGroup("g", created_ms=0)
    group.join_deadline_ms = 100
    due = due_deadlines([group], 100)

    group.join_deadline_ms = 200  # what firing an earlier deadline may do

    assert not still_set(group, due[0])
    assert next_deadline([group]) == 200
