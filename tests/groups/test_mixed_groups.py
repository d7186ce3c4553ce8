"""KIP-848 mixed groups in the sans-IO coordinator: the online upgrade of a classic group with
members by a consumer-protocol member, classic members (JoinGroup/SyncGroup/Heartbeat/
LeaveGroup) inside a consumer group, the online downgrade when the last consumer-protocol
member goes, ``group.consumer.migration.policy``, and replay of the records after a restart.

The clients are simulated as Kafka's: a classic member with the cooperative protocol keeps the
partitions it owns across its JoinGroups and revokes what its SyncGroup no longer hands it,
then rejoins; a consumer-protocol member owns what its heartbeats answer. After every step no
partition may be owned by two clients.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from kio.schema.errors import ErrorCode as E

from onceflow.clock import ManualClock
from onceflow.groups import consumer_protocol
from onceflow.groups.config import GroupCoordinatorConfig
from onceflow.groups.consumer_messages import HeartbeatRequest, HeartbeatResult
from onceflow.groups.coordinator import (
    GroupCoordinator,
    JoinGroupRequest,
    LeaveMember,
    SyncGroupRequest,
)
from onceflow.groups.offsets import OffsetAndMetadata
from tests.groups.harness import Reply
from tests.groups.test_consumer_groups import FakeTopics

CLASSIC_SESSION_MS = 10_000
REBALANCE_MS = 30_000


def subscription(topics: list[str], owned: dict[str, set[int]], generation: int = -1) -> bytes:
    """A ConsumerProtocolSubscription v2 (topics, no user data, owned partitions, generation),
    as a cooperative classic consumer sends it."""
    out = [struct.pack(">hi", 2, len(topics))]
    for t in topics:
        out.append(struct.pack(">h", len(t)) + t.encode())
    out.append(struct.pack(">i", -1))
    out.append(struct.pack(">i", len(owned)))
    for t, ps in sorted(owned.items()):
        out.append(struct.pack(">h", len(t)) + t.encode() + struct.pack(">i", len(ps)))
        out.extend(struct.pack(">i", p) for p in sorted(ps))
    out.append(struct.pack(">i", generation))
    return b"".join(out)


class Cluster:
    """A coordinator whose records go to a log and are replayed as the broker's runtime does."""

    def __init__(self, **config: Any) -> None:
        config.setdefault("group_initial_rebalance_delay_ms", 0)
        self.clock = ManualClock()
        self.topics = FakeTopics()
        self.log: list[tuple[bytes, bytes | None]] = []
        ids = itertools.count(1)
        self.coord = GroupCoordinator(
            self.clock,
            GroupCoordinatorConfig(**config),
            member_id_suffix=lambda: f"x{next(ids)}",
            write_records=self._write_records,
        )

    def _write_records(self, records: list[Any], done: Callable[[E], None]) -> None:
        self.write(records)
        done(E.none)

    def write(self, records: list[Any]) -> None:
        for key, value in records:
            self.log.append((key, value))
            self.coord.replay(key, value)

    def restarted(self, **config: Any) -> Cluster:
        """A new coordinator that loads this log (a broker restart)."""
        fresh = Cluster(**config)
        fresh.topics = self.topics
        fresh.coord.begin_loading()
        for key, value in self.log:
            fresh.coord.replay(key, value)
        fresh.coord.complete_loading()
        fresh.log = list(self.log)
        return fresh

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.coord.tick()
        self.write(self.coord.consumer_group_tick(self.topics).records)

    def group_type(self, group_id: str = "g") -> str:
        [listing] = [g for g in self.coord.list_groups() if g.group_id == group_id]
        return listing.group_type

    def consumer_members(self) -> dict[str, Any]:
        group = self.coord.consumer_groups.group("g")
        assert group is not None
        return dict(group.members)


@dataclass
class Client:
    """One simulated consumer: its member id, generation/epoch and the partitions it owns."""

    cluster: Cluster
    name: str
    classic: bool
    topics: tuple[str, ...] = ("t",)
    member_id: str = ""
    epoch: int = -1
    owned: dict[str, set[int]] = field(default_factory=dict)
    must_join: bool = True
    instance: str | None = None

    # -- classic protocol (cooperative) --------------------------------------------------

    def protocols(self) -> list[tuple[str, bytes]]:
        sub = subscription(list(self.topics), self.owned, self.epoch)
        return [("cooperative-sticky", sub)]

    def join(self, protocols: list[tuple[str, bytes]] | None = None) -> Any:
        reply = Reply()
        self.cluster.coord.join_group(
            JoinGroupRequest(
                group_id="g",
                member_id=self.member_id,
                protocol_type="consumer",
                protocols=protocols or self.protocols(),
                session_timeout_ms=CLASSIC_SESSION_MS,
                rebalance_timeout_ms=REBALANCE_MS,
                client_id=self.name,
                group_instance_id=self.instance,
                require_known_member_id=True,
            ),
            reply,
            self.cluster.topics,
        )
        if reply.done and reply.result.error == E.member_id_required:
            self.member_id = reply.result.member_id
            return self.join(protocols)
        return reply

    def sync(self, assignments: dict[str, bytes] | None = None) -> Any:
        reply = Reply()
        self.cluster.coord.sync_group(
            SyncGroupRequest(
                "g", self.epoch, self.member_id, self.instance, assignments=assignments or {}
            ),
            reply,
            self.cluster.topics,
        )
        return reply

    def classic_heartbeat(self) -> E:
        return self.cluster.coord.heartbeat("g", self.member_id, self.epoch)

    def take(self, assignment: bytes) -> None:
        """Cooperative: revoke what is no longer assigned, add the rest; rejoin after a
        revocation."""
        new = {t: set(ps) for t, ps in consumer_protocol.decode_assignment(assignment).items()}
        revoked = any(self.owned.get(t, set()) - new.get(t, set()) for t in self.owned)
        self.owned = {t: ps for t, ps in new.items() if ps}
        self.must_join = revoked

    # -- consumer protocol --------------------------------------------------------------

    def heartbeat(self, **fields: Any) -> HeartbeatResult:
        joining = self.epoch <= 0
        if joining:
            self.member_id = self.member_id or self.name
            fields.setdefault("subscribed_topic_names", self.topics)
            fields.setdefault("rebalance_timeout_ms", REBALANCE_MS)
        ids = {t: self.cluster.topics.get(t).topic_id for t in self.owned}
        owned = {ids[t]: frozenset(ps) for t, ps in self.owned.items()}
        result = self.cluster.coord.consumer_group_heartbeat(
            HeartbeatRequest(
                "g", self.member_id, max(self.epoch, 0), owned=owned, client_id=self.name, **fields
            ),
            self.cluster.topics,
        )
        self.cluster.write(result.records)
        r = result.response
        if r.error == E.none:
            self.epoch = r.member_epoch
            if r.assignment is not None:
                by_id = {
                    self.cluster.topics.by_id(t).name: set(ps) for t, ps in r.assignment.items()
                }
                self.owned = {t: ps for t, ps in by_id.items() if ps}
        return r

    # -- one step of the client's loop ---------------------------------------------------

    def step(self) -> None:
        if not self.classic:
            assert self.heartbeat().error == E.none
            return
        if not self.must_join:
            error = self.classic_heartbeat()
            if error == E.none:
                return
            assert error in (E.rebalance_in_progress, E.illegal_generation), error
        joined = self.join()
        assert joined.done, "a classic member of a consumer group is answered at once"
        j = joined.result
        assert j.error == E.none, j
        assert j.leader == "" and j.members == ()  # every classic member is a follower
        self.member_id, self.epoch = j.member_id, j.generation_id
        synced = self.sync()
        s = synced.result
        if s.error == E.rebalance_in_progress:
            self.must_join = True
            return
        assert s.error == E.none, s
        self.take(s.assignment)


def assert_disjoint(clients: list[Client]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for c in clients:
        for t, ps in c.owned.items():
            for p in ps:
                assert (t, p) not in seen, f"{t}-{p} owned by {seen[(t, p)]} and {c.name}"
                seen[(t, p)] = c.name


def settle(cluster: Cluster, clients: list[Client], rounds: int = 40) -> None:
    """Step every client until the group is Stable and they own its target assignment,
    checking after each step that no partition has two owners."""
    for _ in range(rounds):
        for c in clients:
            c.step()
            assert_disjoint(clients)
        [d] = cluster.coord.consumer_group_describe(["g"], cluster.topics)
        if d.state == "Stable" and all(not c.must_join for c in clients if c.classic):
            owned = sum(len(ps) for c in clients for ps in c.owned.values())
            assigned = sum(len(p.partitions) for m in d.members for p in m.assignment)
            if owned == assigned:
                return
    raise AssertionError(f"not settled after {rounds} rounds: {d}")


def classic_group(cluster: Cluster, n: int, partitions: int = 4) -> list[Client]:
    """A Stable classic group of n cooperative members over topic t, the leader assigning the
    partitions round robin."""
    cluster.topics.create("t", partitions)
    clients = [Client(cluster, f"k{i}", classic=True) for i in range(n)]
    replies = [c.join() for c in clients]
    cluster.advance(1)
    results = [r.result for r in replies]
    for c, r in zip(clients, results, strict=True):
        assert r.error == E.none
        c.epoch = r.generation_id
    leader = next(c for c, r in zip(clients, results, strict=True) if r.leader == r.member_id)
    assignments = {
        c.member_id: consumer_protocol.encode_assignment(
            {"t": frozenset(range(i, partitions, n))}, 1
        )
        for i, c in enumerate(clients)
    }
    syncs = {c.name: c.sync(assignments if c is leader else None) for c in clients}
    for c in clients:
        c.take(syncs[c.name].result.assignment)
        c.must_join = False
    assert_disjoint(clients)
    assert cluster.group_type() == "classic"
    return clients


# -- upgrade ------------------------------------------------------------------------------


def test_a_consumer_member_upgrades_a_stable_classic_group_with_members() -> None:
    cluster = Cluster()
    k0, k1 = classic_group(cluster, 2)
    generation = k0.epoch
    c = Client(cluster, "c0", classic=False)
    r = c.heartbeat()
    assert r.error == E.none, r
    assert cluster.group_type() == "consumer"
    group = cluster.coord.consumer_groups.group("g")
    assert group is not None and group.group_epoch == generation + 1
    members = cluster.consumer_members()
    # The classic members keep their partitions (at member epoch = the generation) until they
    # revoke them: the new member gets nothing yet.
    assert members[k0.member_id].member_epoch == generation
    assert members[k0.member_id].classic.session_timeout_ms == CLASSIC_SESSION_MS
    assert members[k0.member_id].subscribed_topic_names == ("t",)
    t = cluster.topics.get("t").topic_id
    assert members[k0.member_id].assigned == {t: frozenset({0, 2})}
    assert members[k1.member_id].assigned == {t: frozenset({1, 3})}
    assert c.owned == {}
    [d] = cluster.coord.consumer_group_describe(["g"], cluster.topics)
    assert sorted(m.member_type for m in d.members) == [0, 0, 1]
    # The classic members are told to rejoin, and the partitions move without two owners.
    assert k0.classic_heartbeat() == E.rebalance_in_progress
    clients = [k0, k1, c]
    settle(cluster, clients)
    assert all(c.owned for c in clients)
    assert sorted(p for c in clients for p in c.owned["t"]) == [0, 1, 2, 3]


def test_the_upgrade_answers_pending_joins_with_rebalance_in_progress() -> None:
    cluster = Cluster()
    k0, _ = classic_group(cluster, 2)
    # k0 rejoins (the group rebalances): its JoinGroup waits for k1.
    waiting = k0.join()
    assert not waiting.done
    assert Client(cluster, "c0", classic=False).heartbeat().error == E.none
    assert waiting.result.error == E.rebalance_in_progress
    assert cluster.coord.group("g") is None  # the classic group is gone


def test_a_malformed_classic_subscription_refuses_the_upgrade_and_changes_nothing() -> None:
    cluster = Cluster()
    cluster.topics.create("t", 2)
    reply = Reply()
    cluster.coord.join_group(
        JoinGroupRequest("g", "", "consumer", [("range", b"\x00\x01\xff")], CLASSIC_SESSION_MS),
        reply,
    )
    cluster.advance(1)
    assert reply.result.error == E.none
    r = Client(cluster, "c0", classic=False).heartbeat()
    assert r.error == E.group_id_not_found and "malformed" in (r.error_message or "")
    assert cluster.group_type() == "classic"
    assert cluster.coord.consumer_groups.group("g") is None
    # A later valid conversion is not confused by the refused one.
    assert len(cluster.coord.group("g").members) == 1


def test_the_upgrade_is_refused_for_a_group_of_another_protocol_type_or_too_large() -> None:
    cluster = Cluster(group_consumer_max_size=1)
    classic_group(cluster, 2)
    r = Client(cluster, "c0", classic=False).heartbeat()
    assert r.error == E.group_id_not_found
    assert cluster.group_type() == "classic"
    other = Cluster()
    other.topics.create("t", 1)
    reply = Reply()
    other.coord.join_group(
        JoinGroupRequest("g", "", "connect", [("default", b"x")], CLASSIC_SESSION_MS), reply
    )
    other.advance(1)
    assert Client(other, "c0", classic=False).heartbeat().error == E.group_id_not_found


# -- classic members inside a consumer group ----------------------------------------------


def test_classic_members_join_sync_and_heartbeat_in_a_consumer_group() -> None:
    cluster = Cluster()
    cluster.topics.create("t", 4)
    c = Client(cluster, "c0", classic=False)
    assert c.heartbeat().error == E.none and c.owned == {"t": {0, 1, 2, 3}}
    k = Client(cluster, "k0", classic=True)
    joined = k.join()
    j = joined.result
    # Generation = the member epoch; no leader, no members: the coordinator assigns.
    assert j.error == E.none and j.generation_id == 2 and j.leader == "" and j.members == ()
    assert (j.protocol_type, j.protocol_name) == ("consumer", "cooperative-sticky")
    k.epoch = j.generation_id
    s = k.sync().result
    assert s.error == E.none and consumer_protocol.decode_assignment(s.assignment) == {}
    k.take(s.assignment)
    # Its partitions are still c0's: no rejoin until they are free.
    assert k.classic_heartbeat() == E.none
    settle(cluster, [c, k])
    assert k.owned and c.owned
    assert cluster.coord.heartbeat("g", k.member_id, k.epoch + 1) == E.illegal_generation
    assert cluster.coord.heartbeat("g", "nobody", k.epoch) == E.unknown_member_id
    assert cluster.coord.heartbeat("g", c.member_id, c.epoch) == E.unknown_member_id
    # A classic member commits with its generation (= its member epoch), any version.
    offsets = {("t", p): OffsetAndMetadata(offset=1) for p in k.owned["t"]}

    def commit(generation: int) -> set[E]:
        result = cluster.coord.commit_offsets(
            "g", generation, k.member_id, None, offsets, api_version=2
        )
        cluster.write(result.records)
        return set(result.response.values())

    assert commit(k.epoch) == {E.none}
    assert commit(k.epoch - 1) == {E.illegal_generation}


def test_a_classic_join_with_a_malformed_subscription_gets_kafkas_error() -> None:
    cluster = Cluster()
    cluster.topics.create("t", 2)
    c = Client(cluster, "c0", classic=False)
    c.heartbeat()
    k = Client(cluster, "k0", classic=True)
    before = list(cluster.log)
    j = k.join([("range", b"\x00\x02\x00")]).result
    assert j.error == E.unknown_server_error
    assert cluster.log == before
    assert list(cluster.consumer_members()) == ["c0"]
    reply = Reply()
    cluster.coord.join_group(
        JoinGroupRequest("g", "", "consumer", [("range", subscription(["t"], {}))], 1_000),
        reply,
        cluster.topics,
    )
    assert reply.result.error == E.invalid_session_timeout  # below group.min.session.timeout.ms
    j = k.join([("range", subscription(["t"], {}))]).result
    assert j.error == E.none
    other = k.join([("other", subscription(["t"], {}))]).result
    assert other.error == E.inconsistent_group_protocol


def test_a_classic_member_leaves_and_one_times_out() -> None:
    cluster = Cluster()
    k0, k1, k2 = classic_group(cluster, 3, partitions=6)
    c = Client(cluster, "c0", classic=False)
    c.heartbeat()
    clients = [k0, k1, k2, c]
    settle(cluster, clients)
    epoch = cluster.coord.consumer_groups.group("g").group_epoch
    left = cluster.coord.leave_group(
        "g", [LeaveMember(k0.member_id), LeaveMember("nobody")], cluster.topics
    )
    assert [m.error for m in left.members] == [E.none, E.unknown_member_id]
    k0.owned = {}
    assert k0.member_id not in cluster.consumer_members()
    assert cluster.coord.consumer_groups.group("g").group_epoch == epoch + 1
    settle(cluster, [k1, k2, c])
    # k1 goes silent: its own session timeout (10 s, not the group's 45 s) fences it.
    for _ in range(3):
        cluster.clock.advance(4_000)
        for alive in (k2, c):
            alive.step()
        cluster.advance(0)
    assert k1.member_id not in cluster.consumer_members()
    assert k2.member_id in cluster.consumer_members()
    k1.owned = {}
    settle(cluster, [k2, c])
    assert cluster.group_type() == "consumer"


def test_a_classic_member_that_does_not_rejoin_in_its_rebalance_timeout_is_fenced() -> None:
    cluster = Cluster()
    k0, k1 = classic_group(cluster, 2)
    c = Client(cluster, "c0", classic=False)
    c.heartbeat()
    assert k1.classic_heartbeat() == E.rebalance_in_progress
    # k1 never rejoins; it keeps heartbeating (so its session is fine) and c0 too.
    for _ in range(REBALANCE_MS // 5_000 + 1):
        cluster.clock.advance(5_000)
        c.step()
        k0.step()
        if k1.member_id in cluster.consumer_members():
            k1.classic_heartbeat()
        cluster.advance(0)
    assert k1.member_id not in cluster.consumer_members()


# -- downgrade ----------------------------------------------------------------------------


def mixed_group(cluster: Cluster) -> tuple[list[Client], Client]:
    classic = classic_group(cluster, 2)
    c = Client(cluster, "c0", classic=False)
    c.heartbeat()
    settle(cluster, [*classic, c])
    return classic, c


def rejoin_classic(cluster: Cluster, clients: list[Client]) -> None:
    """The classic members rejoin the (classic) group and the leader assigns."""
    replies = [c.join() for c in clients]
    cluster.advance(1)
    results = [r.result for r in replies]
    assert all(r.error == E.none for r in results), results
    leader = next(r for r in results if r.leader == r.member_id)
    assert {m.member_id for m in leader.members} == {c.member_id for c in clients}
    for c, r in zip(clients, results, strict=True):
        c.epoch = r.generation_id
    assignments = {
        c.member_id: consumer_protocol.encode_assignment({"t": frozenset(c.owned.get("t", ()))}, 1)
        for c in clients
    }
    for c in clients:
        s = c.sync(assignments if c.member_id == leader.member_id else None).result
        assert s.error == E.none
        c.take(s.assignment)


def test_the_last_consumer_member_leaving_downgrades_the_group() -> None:
    cluster = Cluster()
    classic, c = mixed_group(cluster)
    epoch = cluster.coord.consumer_groups.group("g").group_epoch
    result = cluster.coord.consumer_group_heartbeat(
        HeartbeatRequest("g", c.member_id, -1), cluster.topics
    )
    assert result.response.error == E.none
    cluster.write(result.records)
    c.owned = {}
    assert cluster.group_type() == "classic"
    assert cluster.coord.consumer_groups.group("g") is None
    group = cluster.coord.group("g")
    assert group.generation_id == epoch
    assert group.state.value == "PreparingRebalance"  # the classic members must rejoin
    assert set(group.members) == {k.member_id for k in classic}
    # Each keeps the partitions of its target assignment meanwhile.
    t_parts = [
        set(consumer_protocol.decode_assignment(m.assignment).get("t", ()))
        for m in group.members.values()
    ]
    assert all(t_parts)
    rejoin_classic(cluster, classic)
    assert cluster.coord.group("g").state.value == "Stable"
    assert_disjoint(classic)


def test_the_last_consumer_member_timing_out_downgrades_the_group() -> None:
    cluster = Cluster()
    classic, _ = mixed_group(cluster)
    for _ in range(12):  # 48 s > the consumer session of 45 s; the classic ones heartbeat
        cluster.clock.advance(4_000)
        for k in classic:
            if cluster.coord.consumer_groups.group("g") is not None:
                k.step()
        cluster.advance(0)
    assert cluster.group_type() == "classic"
    assert set(cluster.coord.group("g").members) == {k.member_id for k in classic}


POLICIES = {
    "disabled": (False, False),
    "upgrade": (True, False),
    "downgrade": (False, True),
    "bidirectional": (True, True),
    "BiDirectional": (True, True),  # case-insensitive, as Kafka's validator
}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_migration_policy_decides_upgrade_and_downgrade(policy: str) -> None:
    upgrade, downgrade = POLICIES[policy]
    config = GroupCoordinatorConfig.from_properties({"group.consumer.migration.policy": policy})
    assert config.migration_policy.upgrade_enabled is upgrade
    cluster = Cluster(group_consumer_migration_policy=config.group_consumer_migration_policy)
    classic_group(cluster, 2)
    r = Client(cluster, "c0", classic=False).heartbeat()
    assert r.error == (E.none if upgrade else E.group_id_not_found)
    # The downgrade: a mixed group (made under the default policy) loaded under this one.
    mixed = Cluster()
    _, c = mixed_group(mixed)
    loaded = mixed.restarted(group_consumer_migration_policy=policy)
    result = loaded.coord.consumer_group_heartbeat(
        HeartbeatRequest("g", c.member_id, -1), loaded.topics
    )
    assert result.response.error == E.none
    loaded.write(result.records)
    assert loaded.group_type() == ("classic" if downgrade else "consumer")


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match=r"group\.consumer\.migration\.policy"):
        GroupCoordinatorConfig.from_properties({"group.consumer.migration.policy": "sideways"})
    assert GroupCoordinatorConfig().migration_policy.value == "bidirectional"


# -- replay -------------------------------------------------------------------------------


def test_replaying_the_records_rebuilds_the_mixed_group_and_the_downgraded_one() -> None:
    cluster = Cluster()
    classic, c = mixed_group(cluster)
    before = cluster.coord.consumer_group_describe(["g"], cluster.topics)
    members = cluster.consumer_members()
    loaded = cluster.restarted()
    assert loaded.coord.consumer_group_describe(["g"], loaded.topics) == before
    assert loaded.consumer_members() == members  # classic metadata included
    # The loaded classic members go on: heartbeat, rejoin, and the downgrade.
    for k in classic:
        k.cluster = loaded
        assert k.classic_heartbeat() == E.none
    result = loaded.coord.consumer_group_heartbeat(
        HeartbeatRequest("g", c.member_id, -1), loaded.topics
    )
    loaded.write(result.records)
    assert loaded.group_type() == "classic"
    again = loaded.restarted()
    assert again.group_type() == "classic"
    group = again.coord.group("g")
    assert set(group.members) == {k.member_id for k in classic}
    assert group.generation_id == loaded.coord.group("g").generation_id


def test_the_member_record_carries_the_classic_metadata_as_kafka_tags_it() -> None:
    from onceflow.groups import consumer_records as cr

    value = cr.MemberMetadataValue(
        None,
        None,
        "c",
        "/h",
        ("t",),
        None,
        30_000,
        None,
        cr.ClassicMemberMetadata(10_000, (("range", b"\x00\x01"), ("roundrobin", b""))),
    )
    encoded = cr.encode_member_metadata(value)
    assert cr.decode_member_metadata(encoded) == value
    plain = cr.encode_member_metadata(
        cr.MemberMetadataValue(None, None, "c", "/h", ("t",), None, 30_000, None)
    )
    # Version 0 either way; the classic metadata is tagged field 0 (Kafka's schema).
    assert encoded[:2] == plain[:2] == b"\x00\x00"
    assert encoded[: len(plain) - 1] == plain[:-1] and plain[-1:] == b"\x00"
    assert encoded[len(plain) - 1 : len(plain) + 1] == b"\x01\x00"


def test_a_restarted_static_classic_member_takes_its_old_place_without_a_rebalance() -> None:
    cluster = Cluster()
    cluster.topics.create("t", 4)
    c = Client(cluster, "c0", classic=False)
    c.heartbeat()
    k = Client(cluster, "k0", classic=True, instance="i0")
    settle(cluster, [c, k])
    before = cluster.consumer_members()[k.member_id]
    epoch = cluster.coord.consumer_groups.group("g").group_epoch
    # The client restarts: unknown member id, same instance id, same owned partitions.
    restarted = Client(cluster, "k0", classic=True, instance="i0", owned=dict(k.owned))
    restarted.epoch = k.epoch
    again = restarted.join().result
    assert again.error == E.none and again.member_id != k.member_id
    members = cluster.consumer_members()
    assert k.member_id not in members
    after = members[again.member_id]
    assert (after.member_epoch, after.assigned, after.instance_id) == (
        before.member_epoch,
        before.assigned,
        "i0",
    )
    assert again.generation_id == before.member_epoch
    assert cluster.coord.consumer_groups.group("g").group_epoch == epoch  # no rebalance
    # The old member id is fenced.
    assert k.join().result.error == E.fenced_instance_id
    loaded = cluster.restarted()
    assert loaded.consumer_members() == members


def test_a_classic_group_in_its_first_rebalance_is_upgraded_too() -> None:
    cluster = Cluster(group_initial_rebalance_delay_ms=3_000)
    cluster.topics.create("t", 2)
    k = Client(cluster, "k0", classic=True)
    waiting = k.join()
    assert not waiting.done  # the initial delay: no generation, no protocol chosen yet
    c = Client(cluster, "c0", classic=False)
    assert c.heartbeat().error == E.none
    assert waiting.result.error == E.rebalance_in_progress
    assert cluster.group_type() == "consumer"
    k.must_join = True
    settle(cluster, [k, c])
    assert k.owned and c.owned


def test_a_classic_member_that_heartbeats_with_the_consumer_protocol_becomes_a_consumer_one() -> (
    None
):
    cluster = Cluster()
    k0, _ = mixed_group(cluster)[0]
    assert cluster.consumer_members()[k0.member_id].uses_classic_protocol
    switched = Client(cluster, k0.name, classic=False, member_id=k0.member_id)
    assert switched.heartbeat().error == E.none
    assert not cluster.consumer_members()[k0.member_id].uses_classic_protocol
    assert cluster.restarted().consumer_members() == cluster.consumer_members()


def test_a_heartbeat_refused_after_the_conversion_leaves_the_classic_group_as_it_was() -> None:
    # Two classic members may be converted (not above group.consumer.max.size = 2), but the
    # third member is then refused: the conversion is dropped with the heartbeat, as Kafka's
    # records are.
    cluster = Cluster(group_consumer_max_size=2)
    k0, k1 = classic_group(cluster, 2)
    before = list(cluster.log)
    r = Client(cluster, "c0", classic=False).heartbeat()
    assert r.error == E.group_max_size_reached
    assert cluster.log == before
    assert cluster.group_type() == "classic"
    assert set(cluster.coord.group("g").members) == {k0.member_id, k1.member_id}
    assert k0.classic_heartbeat() == E.none
    # Another request applying records later does not drop the classic group either.
    other = Client(cluster, "c1", classic=False)
    other.cluster.coord.consumer_group_heartbeat(
        HeartbeatRequest(
            "h", "c1", 0, subscribed_topic_names=("t",), rebalance_timeout_ms=1, owned={}
        ),
        cluster.topics,
    )
    assert cluster.group_type() == "classic"


def test_the_last_consumer_member_back_as_a_static_classic_one_downgrades_the_group() -> None:
    cluster = Cluster()
    classic = classic_group(cluster, 2)
    s = Client(cluster, "s0", classic=False)
    assert s.heartbeat(instance_id="s").error == E.none
    settle(cluster, [*classic, s])
    held = dict(cluster.consumer_members()["s0"].assigned)
    # s restarts with group.protocol=classic and the same group.instance.id.
    back = Client(cluster, "s0", classic=True, instance="s", owned=dict(s.owned))
    joined = back.join().result
    assert joined.error == E.none and joined.member_id != "s0"
    assert cluster.group_type() == "classic"
    group = cluster.coord.group("g")
    assert group.state.value == "Stable"  # no rebalance: it took s0's place
    assert set(group.members) == {k.member_id for k in classic} | {joined.member_id}
    t = cluster.topics.get("t").topic_id
    mine = consumer_protocol.decode_assignment(group.members[joined.member_id].assignment)
    assert mine == {"t": held[t]}
    assert cluster.restarted().coord.group("g").members.keys() == group.members.keys()
