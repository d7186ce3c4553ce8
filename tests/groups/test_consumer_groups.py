"""KIP-848 consumer groups in the sans-IO coordinator: heartbeats, epochs, revocation before
assignment, static members, timeouts, commits fenced by member epoch, records and replay."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode as E

from onceflow.groups.consumer_messages import HeartbeatRequest, HeartbeatResult
from onceflow.groups.offsets import OffsetAndMetadata
from tests.groups.harness import Env, Reply

REBALANCE_MS = 30_000
SESSION_MS = 45_000


@dataclass
class FakeTopic:
    name: str
    topic_id: uuid.UUID
    partitions: list[object] = field(default_factory=list)


class FakeTopics:
    def __init__(self) -> None:
        self._topics: dict[str, FakeTopic] = {}

    def create(self, name: str, partitions: int) -> uuid.UUID:
        topic = FakeTopic(name, uuid.uuid5(uuid.NAMESPACE_DNS, name), [None] * partitions)
        self._topics[name] = topic
        return topic.topic_id

    def get(self, name: str) -> FakeTopic | None:
        return self._topics.get(name)

    def by_id(self, topic_id: uuid.UUID) -> FakeTopic | None:
        return next((t for t in self._topics.values() if t.topic_id == topic_id), None)

    def __iter__(self) -> Iterator[FakeTopic]:
        return iter(list(self._topics.values()))


class Consumers:
    """A coordinator, its topics, and the records it wrote (replayed as the runtime would)."""

    def __init__(self) -> None:
        self.env = Env()
        self.coord = self.env.coord
        self.topics = FakeTopics()
        self.log: list[tuple[bytes, bytes | None]] = []

    def write(self, records) -> None:
        for key, value in records:
            self.log.append((key, value))
            self.coord.replay(key, value)  # the runtime's replay once durable

    def heartbeat(self, member_id: str, epoch: int, **fields) -> HeartbeatResult:
        fields.setdefault("rebalance_timeout_ms", REBALANCE_MS if epoch == 0 else -1)
        if epoch == 0:
            fields.setdefault("owned", {})
        result = self.coord.consumer_group_heartbeat(
            HeartbeatRequest("g", member_id, epoch, **fields), self.topics
        )
        self.write(result.records)
        return result.response

    def join(self, member_id: str, topics=("t",), **fields) -> HeartbeatResult:
        return self.heartbeat(member_id, 0, subscribed_topic_names=tuple(topics), **fields)

    def tick(self) -> int:
        result = self.coord.consumer_group_tick(self.topics)
        self.write(result.records)
        return result.response

    def describe(self):
        [d] = self.coord.consumer_group_describe(["g"], self.topics)
        return d


def parts(result: HeartbeatResult, topic_id: uuid.UUID) -> set[int]:
    assert result.assignment is not None
    return set(result.assignment.get(topic_id, ()))


def test_a_member_joins_and_gets_every_partition() -> None:
    c = Consumers()
    t = c.topics.create("t", 4)
    r = c.join("m1")
    assert r.error == E.none and r.member_epoch == 1 and r.member_id == "m1"
    assert parts(r, t) == {0, 1, 2, 3}
    assert r.heartbeat_interval_ms == 5_000
    d = c.describe()
    assert (d.state, d.group_epoch, d.assignment_epoch, d.assignor_name) == (
        "Stable",
        1,
        1,
        "uniform",
    )
    # A heartbeat with nothing new gets no assignment (it did not change).
    again = c.heartbeat("m1", 1, owned={t: frozenset(range(4))})
    assert again.error == E.none and again.assignment is None


def test_partitions_move_only_after_their_owner_revoked_them() -> None:
    c = Consumers()
    t = c.topics.create("t", 4)
    c.join("m1")
    r2 = c.join("m2")
    # m2 is at the new epoch but its partitions are still m1's.
    assert r2.member_epoch == 2 and parts(r2, t) == set()
    assert c.describe().state == "Reconciling"
    r1 = c.heartbeat("m1", 1, owned={t: frozenset(range(4))})
    # m1 is asked to give up two partitions and stays at its epoch until it has.
    assert r1.member_epoch == 1 and len(parts(r1, t)) == 2
    kept = frozenset(parts(r1, t))
    assert c.heartbeat("m2", 2, owned={}).assignment is None  # still held by m1
    r1 = c.heartbeat("m1", 1, owned={t: kept})
    assert r1.member_epoch == 2 and r1.assignment is None  # same partitions, new epoch
    r2 = c.heartbeat("m2", 2, owned={})
    assert parts(r2, t) == {0, 1, 2, 3} - kept
    assert c.describe().state == "Stable"


def test_a_leaving_member_bumps_the_epoch_and_the_other_takes_over() -> None:
    c = Consumers()
    t = c.topics.create("t", 2)
    c.join("m1")
    c.join("m2")
    c.heartbeat("m1", 1, owned={t: frozenset({0, 1})})
    c.heartbeat("m1", 1, owned={t: frozenset({0})})
    c.heartbeat("m2", 2, owned={})
    left = c.heartbeat("m2", -1)
    assert (left.error, left.member_epoch) == (E.none, -1)
    d = c.describe()
    assert [m.member_id for m in d.members] == ["m1"] and d.group_epoch == 3
    r1 = c.heartbeat("m1", 2, owned={t: frozenset({0})})
    assert r1.member_epoch == 3 and parts(r1, t) == {0, 1}


def test_epoch_errors() -> None:
    c = Consumers()
    c.topics.create("t", 1)
    c.join("m1")
    assert c.heartbeat("m1", 5, owned={}).error == E.fenced_member_epoch
    assert c.heartbeat("nobody", 1).error == E.unknown_member_id
    assert c.heartbeat("m1", -3).error == E.invalid_request
    assert c.join("m2", server_assignor="sticky").error == E.unsupported_assignor
    assert c.heartbeat("", 0, subscribed_topic_names=("t",)).error == E.invalid_request
    assert (
        c.heartbeat("m3", 0, subscribed_topic_names=("t",), rebalance_timeout_ms=-1).error
        == E.invalid_request
    )
    unknown = c.coord.consumer_group_heartbeat(HeartbeatRequest("other", "m", 1), c.topics)
    assert unknown.response.error == E.group_id_not_found and not unknown.records
    # v0: the coordinator names the member.
    v0 = c.join("", api_version=0)
    assert v0.error == E.none and v0.member_id


def test_session_timeout_fences_the_member() -> None:
    c = Consumers()
    c.topics.create("t", 2)
    c.join("m1")
    c.join("m2")
    c.env.advance(SESSION_MS - 1)
    c.heartbeat("m1", 1, owned=None)
    assert c.tick() == 0
    c.env.advance(2)
    assert c.tick() == 1  # m2 said nothing for a whole session
    assert [m.member_id for m in c.describe().members] == ["m1"]


def test_a_member_that_does_not_revoke_in_time_is_fenced() -> None:
    c = Consumers()
    t = c.topics.create("t", 2)
    c.join("m1")
    c.join("m2")
    r = c.heartbeat("m1", 1, owned={t: frozenset({0, 1})})
    assert r.member_epoch == 1  # asked to revoke
    c.env.advance(REBALANCE_MS + 1)
    c.heartbeat("m2", 2, owned={})  # m2 is alive
    assert c.tick() == 1
    assert [m.member_id for m in c.describe().members] == ["m2"]


def test_static_member_keeps_its_partitions_across_a_restart_of_the_client() -> None:
    c = Consumers()
    t = c.topics.create("t", 4)
    c.join("a1", instance_id="a")
    c.join("b1", instance_id="b")
    ra = c.heartbeat("a1", 1, owned={t: frozenset(range(4))})
    c.heartbeat("a1", 1, owned={t: frozenset(parts(ra, t))})
    rb = c.heartbeat("b1", 2, owned={})
    mine = parts(rb, t)
    epoch = c.describe().group_epoch
    # b restarts: a new member id with the same instance id, not before b1 left with -2.
    assert c.join("b2", instance_id="b").error == E.unreleased_instance_id
    assert c.heartbeat("b1", -2, instance_id="b").member_epoch == -2
    back = c.join("b2", instance_id="b")
    assert back.error == E.none and parts(back, t) == mine
    assert c.describe().group_epoch == epoch  # no rebalance
    assert c.heartbeat("b1", 2, instance_id="b", owned={}).error == E.fenced_instance_id


def test_regex_subscription_follows_new_topics() -> None:
    c = Consumers()
    t1 = c.topics.create("orders-1", 1)
    c.topics.create("other", 1)
    r = c.heartbeat("m1", 0, subscribed_topic_regex="orders-.*")
    assert r.error == E.none and set(r.assignment) == {t1}
    t2 = c.topics.create("orders-2", 2)
    c.env.advance(10_001)  # Kafka refreshes regular expressions every 10 s
    r = c.heartbeat("m1", r.member_epoch, owned={t1: frozenset({0})})
    assert set(r.assignment) == {t1, t2}
    assert c.heartbeat("m2", 0, subscribed_topic_regex="(").error == E.invalid_regular_expression


def test_commits_are_fenced_by_member_epoch() -> None:
    c = Consumers()
    t = c.topics.create("t", 1)
    c.join("m1")
    offsets = {("t", 0): OffsetAndMetadata(offset=5)}
    ok = c.coord.commit_offsets("g", 1, "m1", None, offsets, api_version=9)
    assert ok.response == {("t", 0): E.none}
    c.write(ok.records)
    stale = c.coord.commit_offsets("g", 0, "m1", None, offsets, api_version=9)
    assert stale.response == {("t", 0): E.stale_member_epoch}
    unknown = c.coord.commit_offsets("g", 1, "zz", None, offsets, api_version=9)
    assert unknown.response == {("t", 0): E.unknown_member_id}
    old_api = c.coord.commit_offsets("g", 1, "m1", None, offsets, api_version=8)
    assert old_api.response == {("t", 0): E.unsupported_version}
    txn = c.coord.txn_commit_offsets("tx", "g", 7, 0, 0, "m1", None, offsets)
    assert txn.response == {("t", 0): E.stale_member_epoch}
    txn = c.coord.txn_commit_offsets("tx", "g", 7, 0, 1, "m1", None, offsets)
    assert txn.response == {("t", 0): E.none}
    assert c.coord.fetch_offsets("g", [("t", 0)])[("t", 0)].offset == 5
    assert t is not None


def test_an_empty_classic_group_is_upgraded_and_keeps_its_offsets() -> None:
    c = Consumers()
    t = c.topics.create("t", 1)
    commit = c.coord.commit_offsets("g", -1, "", None, {("t", 0): OffsetAndMetadata(offset=9)})
    c.write(commit.records)
    assert c.coord.group("g") is not None  # a "simple" classic group
    r = c.join("m1")
    assert r.error == E.none and parts(r, t) == {0}
    assert c.coord.group("g") is None
    assert c.coord.fetch_offsets("g", [("t", 0)])[("t", 0)].offset == 9
    listing = {(g.group_id, g.group_type, g.state) for g in c.coord.list_groups()}
    assert listing == {("g", "consumer", "Stable")}
    # While consumers are in it, a classic member joins it as Kafka's mixed groups do
    # (tests/groups/test_mixed_groups.py), but not with another protocol type, nor with an
    # unreadable subscription (Kafka's errors).
    from onceflow.groups.coordinator import JoinGroupRequest

    reply = Reply()
    c.coord.join_group(JoinGroupRequest("g", "", "connect", [("range", b"")], 10_000), reply)
    assert reply.result.error == E.inconsistent_group_protocol
    reply = Reply()
    c.coord.join_group(JoinGroupRequest("g", "", "consumer", [("range", b"")], 10_000), reply)
    assert reply.result.error == E.unknown_server_error
    assert list(c.coord.consumer_groups.group("g").members) == ["m1"]
    # Once it is empty, a classic JoinGroup turns it back into a classic group.
    c.heartbeat("m1", -1)
    reply = Reply()
    c.coord.join_group(JoinGroupRequest("g", "", "consumer", [("range", b"")], 10_000), reply)
    assert c.coord.consumer_groups.group("g") is None
    c.write(c.coord.consumer_group_tick(c.topics).records)  # the tombstones are written
    assert c.coord.fetch_offsets("g", [("t", 0)])[("t", 0)].offset == 9


def test_replaying_the_records_rebuilds_the_group() -> None:
    c = Consumers()
    t = c.topics.create("t", 3)
    c.topics.create("u-1", 2)
    c.join("m1", instance_id="i1")
    c.join("m2", topics=("t",), server_assignor="range")
    c.heartbeat("m3", 0, subscribed_topic_regex="u-.*")
    r = c.heartbeat("m1", 1, owned={t: frozenset(range(3))})
    assert r.error == E.none
    before = c.describe()
    # A fresh coordinator loading the log (i24-persist's replay on load) sees the same group.
    fresh = Consumers()
    fresh.topics = c.topics
    for key, value in c.log:
        fresh.coord.replay(key, value)
    assert fresh.describe() == before
    # And the replay of records that were already applied when produced changes nothing.
    assert c.describe() == before


def test_deleting_an_empty_consumer_group() -> None:
    c = Consumers()
    c.topics.create("t", 1)
    c.join("m1")
    assert c.coord.delete_groups(["g"]).response == {"g": E.non_empty_group}
    c.heartbeat("m1", -1)
    deleted = c.coord.delete_groups(["g"])
    assert deleted.response == {"g": E.none}
    c.write(deleted.records)
    assert c.describe().error == E.group_id_not_found


def test_a_regex_that_backtracks_for_ever_is_refused_not_run() -> None:
    """Kafka's RE2/J matches in linear time; a backtracking pattern must not hold the loop."""
    c = Consumers()
    c.topics.create("a" * 200 + "b", 1)
    r = c.heartbeat("m1", 0, subscribed_topic_regex="(a|aa)+")
    assert r.error == E.invalid_regular_expression, r


def test_offset_fetch_of_a_member_is_fenced_by_its_epoch() -> None:
    import pytest

    from onceflow.groups.errors import MemberFencedError

    c = Consumers()
    c.topics.create("t", 1)
    c.join("m1")

    def fetch(member_id, epoch):
        steps = c.coord.fetch_offsets_in_steps("g", [("t", 0)], False, member_id, epoch)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    assert fetch("m1", 1)[("t", 0)].offset == -1
    assert fetch(None, -1)[("t", 0)].offset == -1  # admin clients name no member
    with pytest.raises(MemberFencedError) as stale:
        fetch("m1", 0)
    assert stale.value.error_code == E.stale_member_epoch
    with pytest.raises(MemberFencedError) as unknown:
        fetch("zz", 1)
    assert unknown.value.error_code == E.unknown_member_id


def test_names_too_long_for_the_records_are_refused_and_change_nothing() -> None:
    """The request's compact strings allow more than the records' keys' int16 strings (the
    member id, the regular expression); the values' compact strings hold any length."""
    c = Consumers()
    c.topics.create("t", 1)
    long = "x" * 40_000
    assert c.join(long).error == E.unknown_server_error
    assert c.heartbeat("m", 0, subscribed_topic_regex=long).error == E.unknown_server_error
    assert c.describe().error == E.group_id_not_found and c.log == []
    assert c.join("m", instance_id=long).error == E.none


def test_a_member_rejoining_with_epoch_0_gets_its_partitions_back_at_once() -> None:
    """A client fenced (or restarted with its member id) rejoins with epoch 0 and nothing
    owned: the partitions it held are its own target, free for it, not 'unreleased'."""
    c = Consumers()
    t = c.topics.create("t", 2)
    assert parts(c.join("m1"), t) == {0, 1}
    again = c.join("m1")
    assert again.error == E.none and parts(again, t) == {0, 1}
    assert c.describe().state == "Stable"


def test_offsets_of_a_consumer_group_expire_as_kafkas_do() -> None:
    """Retention counts from each commit; a subscribed topic's offsets stay; an empty group
    whose offsets all expired goes too."""
    c = Consumers()
    c.topics.create("t", 1)
    c.topics.create("u", 1)
    c.join("m1")
    for topic in ("t", "u"):
        commit = c.coord.commit_offsets(
            "g", 1, "m1", None, {(topic, 0): OffsetAndMetadata(offset=1)}, api_version=9
        )
        c.write(commit.records)
    retention = c.env.config.offsets_retention_ms
    c.env.advance(retention)
    expired = c.coord.cleanup_expired_offsets()
    assert expired.response == 1  # u's: nobody subscribes to it; t's stays
    c.write(expired.records)
    assert c.coord.fetch_offsets("g", [("u", 0)])[("u", 0)].offset == -1
    assert c.coord.fetch_offsets("g", [("t", 0)])[("t", 0)].offset == 1
    c.heartbeat("m1", -1)
    gone = c.coord.cleanup_expired_offsets()
    assert gone.response == 1
    c.write(gone.records)
    assert c.describe().error == E.group_id_not_found
