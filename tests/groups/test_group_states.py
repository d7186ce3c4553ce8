"""The state table of a classic group, and the group's own bookkeeping."""

from __future__ import annotations

import itertools
import struct

import pytest

from onceflow.groups.group import (
    VALID_PREVIOUS_STATES,
    ClassicGroup,
    GroupState,
    InvalidStateTransition,
    Member,
    parse_subscription_topics,
)

S = GroupState
# Kafka's table, written out independently so that a change to the code's table shows here.
EXPECTED = {
    (S.PREPARING_REBALANCE, S.EMPTY),
    (S.STABLE, S.PREPARING_REBALANCE),
    (S.COMPLETING_REBALANCE, S.PREPARING_REBALANCE),
    (S.EMPTY, S.PREPARING_REBALANCE),
    (S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE),
    (S.COMPLETING_REBALANCE, S.STABLE),
    (S.STABLE, S.DEAD),
    (S.PREPARING_REBALANCE, S.DEAD),
    (S.COMPLETING_REBALANCE, S.DEAD),
    (S.EMPTY, S.DEAD),
    (S.DEAD, S.DEAD),
}
ALL_PAIRS = list(itertools.product(GroupState, GroupState))


def test_table_is_kafkas() -> None:
    table = {(prev, target) for target, prevs in VALID_PREVIOUS_STATES.items() for prev in prevs}
    assert table == EXPECTED


@pytest.mark.parametrize(("current", "target"), sorted(EXPECTED, key=str))
def test_valid_transition(current: GroupState, target: GroupState) -> None:
    group = ClassicGroup("g", created_ms=0, state=current)
    group.transition_to(target, now_ms=42)
    assert group.state is target
    assert group.state_timestamp_ms == 42


@pytest.mark.parametrize(
    ("current", "target"), [p for p in ALL_PAIRS if p not in EXPECTED], ids=str
)
def test_invalid_transition_is_refused(current: GroupState, target: GroupState) -> None:
    group = ClassicGroup("g", created_ms=0, state=current)
    with pytest.raises(InvalidStateTransition) as info:
        group.transition_to(target, now_ms=42)
    assert group.state is current
    assert info.value.current is current and info.value.target is target


def test_can_rebalance_only_from_stable_completing_empty() -> None:
    able = {s for s in GroupState if ClassicGroup("g", 0, state=s).can_rebalance()}
    assert able == {S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY}


def member(member_id: str, protocols: list[str], instance: str | None = None) -> Member:
    return Member(
        member_id,
        instance,
        "c",
        "h",
        30_000,
        10_000,
        "consumer",
        [(p, p.encode()) for p in protocols],
    )


def test_protocol_selection_by_votes_among_common_protocols() -> None:
    group = ClassicGroup("g", 0)
    group.add(member("a", ["roundrobin", "range", "sticky"]))
    group.transition_to(S.PREPARING_REBALANCE, 0)
    group.add(member("b", ["range", "sticky"]))
    group.add(member("c", ["sticky", "range"]))
    # Common: range, sticky. Votes: a->range, b->range, c->sticky.
    assert group.candidate_protocols() == {"range", "sticky"}
    assert group.select_protocol() == "range"
    assert group.supports_protocols("consumer", ["sticky"])
    assert not group.supports_protocols("consumer", ["roundrobin"])
    assert not group.supports_protocols("connect", ["range"])


def test_empty_group_accepts_any_nonempty_protocol() -> None:
    group = ClassicGroup("g", 0)
    assert group.supports_protocols("anything", ["x"])
    assert not group.supports_protocols("", ["x"])
    assert not group.supports_protocols("consumer", [])


def test_leader_moves_to_next_member_on_removal() -> None:
    group = ClassicGroup("g", 0)
    for m in ("a", "b", "c"):
        group.add(member(m, ["range"]))
    assert group.leader_id == "a"
    group.remove("a")
    assert group.leader_id == "b"
    group.remove("b")
    group.remove("c")
    assert group.leader_id is None


def test_static_member_bookkeeping() -> None:
    group = ClassicGroup("g", 0)
    group.add(member("a", ["range"], instance="i-a"))
    assert group.validate_member("a", "i-a") is None
    old, new = group.replace_static_member("i-a", "a", "a2")
    assert old.member_id == "a" and new.member_id == "a2"
    assert group.leader_id == "a2"
    assert group.static_member_id("i-a") == "a2"
    assert group.validate_member("a", "i-a").name == "fenced_instance_id"
    assert group.validate_member("a2", "i-zzz").name == "unknown_member_id"
    with pytest.raises(ValueError):
        group.add(member("x", ["range"], instance="i-a"))


def subscription(topics: list[str]) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def test_consumer_subscription_parsing() -> None:
    assert parse_subscription_topics(subscription(["a", "bb"])) == ["a", "bb"]
    assert parse_subscription_topics(b"\x00") is None
    assert parse_subscription_topics(struct.pack(">hi", 0, 5)) is None
