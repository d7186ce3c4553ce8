"""The server-side assignors (uniform, range): every subscribed partition exactly once, to a
member subscribed to its topic; uniform balanced and sticky."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.groups.assignors import AssignmentMember, RangeAssignor, UniformAssignor

TOPICS = [uuid.UUID(int=i + 1) for i in range(4)]


def _owners(result: dict[str, dict[uuid.UUID, frozenset[int]]]) -> dict[tuple, list[str]]:
    owners: dict[tuple, list[str]] = {}
    for member_id, topics in result.items():
        for topic_id, partitions in topics.items():
            for p in partitions:
                owners.setdefault((topic_id, p), []).append(member_id)
    return owners


def _check_complete(members, partitions, result) -> None:
    owners = _owners(result)
    for topic_id, n in partitions.items():
        subscribed = [m for m in members if topic_id in members[m].subscribed]
        for p in range(n):
            got = owners.get((topic_id, p), [])
            if subscribed:
                assert len(got) == 1, (topic_id, p, got)
                assert got[0] in subscribed
            else:
                assert got == []


def _count(result, member_id) -> int:
    return sum(len(ps) for ps in result.get(member_id, {}).values())


def test_uniform_spreads_evenly_and_moves_only_what_it_must() -> None:
    topic = TOPICS[0]
    partitions = {topic: 6}
    one = UniformAssignor().assign({"a": AssignmentMember(frozenset({topic}))}, partitions)
    assert one == {"a": {topic: frozenset(range(6))}}
    two = UniformAssignor().assign(
        {
            "a": AssignmentMember(frozenset({topic}), one["a"]),
            "b": AssignmentMember(frozenset({topic})),
        },
        partitions,
    )
    assert _count(two, "a") == 3 and _count(two, "b") == 3
    assert two["a"][topic] <= one["a"][topic]  # a keeps three of its own
    three = UniformAssignor().assign(
        {
            "a": AssignmentMember(frozenset({topic}), two["a"]),
            "b": AssignmentMember(frozenset({topic}), two["b"]),
            "c": AssignmentMember(frozenset({topic})),
        },
        partitions,
    )
    assert [_count(three, m) for m in "abc"] == [2, 2, 2]
    assert three["a"][topic] <= two["a"][topic] and three["b"][topic] <= two["b"][topic]


def test_range_gives_contiguous_ranges_by_member_id() -> None:
    topic = TOPICS[0]
    sub = AssignmentMember(frozenset({topic}))
    result = RangeAssignor().assign({"b": sub, "a": sub, "c": sub}, {topic: 7})
    assert result == {
        "a": {topic: frozenset({0, 1, 2})},
        "b": {topic: frozenset({3, 4})},
        "c": {topic: frozenset({5, 6})},
    }


members_strategy = st.dictionaries(
    st.sampled_from(["m1", "m2", "m3", "m4", "m5"]),
    st.frozensets(st.sampled_from(TOPICS), max_size=4),
    max_size=5,
)
partitions_strategy = st.dictionaries(
    st.sampled_from(TOPICS), st.integers(min_value=0, max_value=12), max_size=4
)


@settings(max_examples=200, deadline=None)
@given(members_strategy, partitions_strategy, st.randoms(use_true_random=False))
def test_every_partition_is_assigned_once_to_a_subscriber(subs, partitions, rnd) -> None:
    members = {m: AssignmentMember(topics) for m, topics in subs.items()}
    for assignor in (UniformAssignor(), RangeAssignor()):
        result = assignor.assign(members, partitions)
        _check_complete(members, partitions, result)
    # A second round from the first's target (as the coordinator gives it), members shuffled
    # in and out: still complete, and uniform keeps homogeneous groups within one.
    first = UniformAssignor().assign(members, partitions)
    names = sorted(members)
    rnd.shuffle(names)
    kept = names[: max(1, len(names) - 1)] if names else []
    second_members = {m: AssignmentMember(subs[m], first.get(m, {})) for m in kept}
    second_members["new"] = AssignmentMember(frozenset(partitions))
    second = UniformAssignor().assign(second_members, partitions)
    _check_complete(second_members, partitions, second)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=0, max_value=40),
    st.integers(min_value=0, max_value=5),
)
def test_uniform_homogeneous_is_balanced_and_sticky(n_members, n_partitions, joined) -> None:
    topic = TOPICS[0]
    sub = frozenset({topic})
    before = UniformAssignor().assign(
        {f"m{i}": AssignmentMember(sub) for i in range(n_members)}, {topic: n_partitions}
    )
    members = {f"m{i}": AssignmentMember(sub, before[f"m{i}"]) for i in range(n_members)}
    members.update({f"n{i}": AssignmentMember(sub) for i in range(joined)})
    after = UniformAssignor().assign(members, {topic: n_partitions})
    counts = [_count(after, m) for m in members]
    assert max(counts) - min(counts) <= 1
    # Members that stay keep everything they had, up to their new share: a partition leaves a
    # member only when that member holds more than the largest share.
    largest = max(counts)
    for i in range(n_members):
        had = before[f"m{i}"].get(topic, frozenset())
        kept = after[f"m{i}"].get(topic, frozenset())
        assert len(had & kept) >= min(len(had), largest - 1), (had, kept)
