"""Classic groups persisted in ``__consumer_offsets`` (GroupMetadataValue) and replayed on load:
a restart keeps the generation, members and assignments; members that come back heartbeat
without a rebalance, members that do not expire as usual."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable

import pytest
from kio.schema.errors import ErrorCode

from onceflow.coordinator.result import Record
from onceflow.groups.coordinator import GroupCoordinator
from onceflow.groups.group import GroupState
from onceflow.groups.group_metadata_record import (
    GroupMetadataValue,
    MemberMetadata,
    decode_group_metadata_value,
    encode_group_metadata_value,
)
from onceflow.groups.offsets_record import (
    OffsetsRecordError,
    decode_key,
    encode_group_metadata_key,
)

from .harness import SESSION_MS, Env, replay_log

E = ErrorCode
Done = Callable[[ErrorCode], None]


class LoggedEnv(Env):
    """An Env whose coordinator writes its group records to ``self.log``; with ``held`` the
    writes wait in ``self.in_flight`` until the test completes them (a log not yet durable)."""

    def __init__(self, *, held: bool = False, **config: int) -> None:
        super().__init__(**config)
        self.held = held
        self.in_flight: list[Done] = []
        ids = itertools.count(1)
        self.coord = GroupCoordinator(
            self.clock,
            self.config,
            member_id_suffix=lambda: f"m{next(ids)}",
            write_records=self._write_records,
        )

    def _write_records(self, records: list[Record], done: Done) -> None:
        def durable(error: ErrorCode) -> None:
            if error is E.none:
                for key, value in records:
                    self.log.append(("record", (key, value, -1, False)))
                    self.coord.replay(key, value)  # as the broker does: a no-op live
            done(error)

        if self.held:
            self.in_flight.append(durable)
        else:
            durable(E.none)

    def complete_writes(self, error: ErrorCode = E.none) -> None:
        pending, self.in_flight = self.in_flight, []
        for durable in pending:
            durable(error)

    def restarted(self, down_ms: int = 1_000, **config: int) -> GroupCoordinator:
        """A new coordinator that loads this log after ``down_ms`` of downtime."""
        self.clock.advance(down_ms)
        settings = self.config if not config else type(self.config)(**config)
        coord = GroupCoordinator(
            self.clock, settings, loading=True, write_records=self._write_records
        )
        replay_log(coord, self.log)
        coord.complete_loading()
        self.coord = coord
        return coord


def test_value_round_trip_and_kafka_versions() -> None:
    value = GroupMetadataValue(
        protocol_type="consumer",
        generation=7,
        protocol="range",
        leader="a-1",
        current_state_timestamp_ms=1_700_000_000_123,
        members=(
            MemberMetadata("a-1", None, "cli", "/127.0.0.1", 300_000, 45_000, b"sub", b"asg"),
            MemberMetadata("i-1", "inst", "cli2", "/::1", 60_000, 10_000, b"", b"\x00\x01"),
        ),
    )
    raw = encode_group_metadata_value(value)
    assert raw[:2] == b"\x00\x03"  # what Kafka 4 writes
    assert decode_group_metadata_value(raw) == value
    # Version 0 (no timestamp, instance id or rebalance timeout), hand-encoded as Kafka does.
    v0 = (
        b"\x00\x00\x00\x08consumer\x00\x00\x00\x02\x00\x05range\x00\x01a"
        + b"\x00\x00\x00\x01\x00\x01a\x00\x01c\x00\x01h\x00\x00\x27\x10"
        + b"\x00\x00\x00\x01s\x00\x00\x00\x01x"
    )
    assert decode_group_metadata_value(v0) == GroupMetadataValue(
        "consumer",
        2,
        "range",
        "a",
        -1,
        (MemberMetadata("a", None, "c", "h", -1, 10_000, b"s", b"x"),),
    )
    # Version 4 (flexible): compact strings, bytes and arrays, tagged fields after each struct.
    v4 = (
        b"\x00\x04\x09consumer\x00\x00\x00\x02\x00\x02a"
        + struct.pack(">q", 5)
        + b"\x02\x02a\x00\x02c\x02h"
        + struct.pack(">ii", 20_000, 10_000)
        + b"\x02s\x02x\x00\x00"
    )
    assert decode_group_metadata_value(v4) == GroupMetadataValue(
        "consumer",
        2,
        None,
        "a",
        5,
        (MemberMetadata("a", None, "c", "h", 20_000, 10_000, b"s", b"x"),),
    )
    for bad in (raw[:-1], b"\x00\x05" + raw[2:], raw[:2] + b"\x00\x00\x7f\xff"):
        with pytest.raises(OffsetsRecordError):
            decode_group_metadata_value(bad)


def test_sync_writes_the_group_record_with_generation_members_and_assignments() -> None:
    env = LoggedEnv()
    leader, *_ = env.form_group(3)
    [(kind, (key, value, _, _))] = env.log
    assert kind == "record" and decode_key(key).group == "g"
    assert value is not None
    record = decode_group_metadata_value(value)
    group = env.coord.group("g")
    assert group is not None
    assert (record.generation, record.protocol, record.leader) == (1, "range", leader.member_id)
    assert record.protocol_type == "consumer"
    assert [
        (m.member_id, m.client_id, m.session_timeout_ms, m.assignment) for m in record.members
    ] == [(m.member_id, m.client_id, SESSION_MS, m.assignment) for m in group.members.values()]
    assert all(m.subscription == b"range-meta" for m in record.members)


def test_restart_keeps_the_group_and_members_heartbeat_without_rebalance() -> None:
    env = LoggedEnv()
    env.form_group(3)
    before = env.coord.describe_groups(["g"])
    generation = env.coord.group("g").generation_id
    for _ in range(3):  # several restarts in a row
        coord = env.restarted(down_ms=SESSION_MS // 2)
        assert coord.describe_groups(["g"]) == before
        group = coord.group("g")
        assert group is not None and group.state is GroupState.STABLE
        assert group.generation_id == generation
        # The members' sessions started at load: they have a whole session to come back.
        env.advance(SESSION_MS - 1)
        for member_id in list(group.members):
            assert env.heartbeat(member_id, generation) is E.none
        for member_id, member in group.members.items():
            synced = env.sync(member_id, generation).result
            assert (synced.error, synced.assignment) == (E.none, member.assignment)
    assert group.state is GroupState.STABLE and group.generation_id == generation


def test_members_that_do_not_come_back_expire_and_the_group_rebalances() -> None:
    env = LoggedEnv()
    results = env.form_group(3)
    env.restarted()
    survivor = results[1].member_id
    # Only one member comes back: the others' sessions (from the load) expire.
    for _ in range(SESSION_MS // 1_000):
        env.advance(1_000)
        assert env.heartbeat(survivor, 1) in (E.none, E.rebalance_in_progress)
    group = env.coord.group("g")
    assert group is not None and group.state is GroupState.PREPARING_REBALANCE
    assert list(group.members) == [survivor]
    rejoin = env.join(survivor)
    assert rejoin.result.error is E.none and rejoin.result.generation_id == 2
    # Everyone gone: the generation ends empty, and that is written and loaded too.
    env.advance(SESSION_MS + 1)
    env.advance(1)
    assert group.state is GroupState.EMPTY and group.generation_id == 3
    coord = env.restarted()
    assert coord.group("g").state is GroupState.EMPTY
    assert coord.group("g").generation_id == 3


def test_answers_wait_for_the_record_and_a_failed_write_rebalances() -> None:
    env = LoggedEnv(held=True)
    a, b = env.join(), env.join()
    env.advance(1)
    leader, follower = sorted((a.result, b.result), key=lambda r: r.leader != r.member_id)
    follower_sync = env.sync(follower.member_id, 1)
    leader_sync = env.sync(leader.member_id, 1, {follower.member_id: b"f", leader.member_id: b"l"})
    assert not leader_sync.done and not follower_sync.done  # not durable yet
    assert env.coord.group("g").state is GroupState.COMPLETING_REBALANCE
    env.complete_writes()
    assert (leader_sync.result.error, leader_sync.result.assignment) == (E.none, b"l")
    assert (follower_sync.result.error, follower_sync.result.assignment) == (E.none, b"f")
    assert env.coord.group("g").state is GroupState.STABLE

    # The next generation's record cannot be written: the members are told and rejoin.
    rejoins = [env.join(leader.member_id), env.join(follower.member_id)]
    env.advance(1)
    assert all(r.result.generation_id == 2 for r in rejoins)
    sync = env.sync(leader.member_id, 2, {leader.member_id: b"l2", follower.member_id: b"f2"})
    env.complete_writes(E.not_leader_or_follower)
    assert sync.result.error is E.not_coordinator
    group = env.coord.group("g")
    assert group.state is GroupState.PREPARING_REBALANCE
    assert all(m.assignment == b"" for m in group.members.values())


def test_a_record_durable_after_the_round_moved_on_is_not_applied() -> None:
    env = LoggedEnv(held=True)
    a, b = env.join(), env.join()
    env.advance(1)
    leader = next(r.result for r in (a, b) if r.result.leader == r.result.member_id)
    leader_sync = env.sync(leader.member_id, 1, {m.member_id: b"x" for m in leader.members})
    newcomer = env.join(client_id="late")  # a new member: the round starts over
    assert leader_sync.result.error is E.rebalance_in_progress
    env.complete_writes()
    group = env.coord.group("g")
    assert group.state is GroupState.PREPARING_REBALANCE
    assert not newcomer.done
    assert all(m.assignment == b"" for m in group.members.values())


def test_static_member_new_id_is_persisted() -> None:
    env = LoggedEnv()
    results = env.form_group(2, instances=["i-a", "i-b"])
    old_id = next(r.member_id for r in results if r.member_id.startswith("i-b"))
    rejoined = env.join(instance="i-b").result  # restarted client, same instance id
    assert rejoined.error is E.none and rejoined.member_id != old_id
    coord = env.restarted()
    group = coord.group("g")
    assert group.static_member_id("i-b") == rejoined.member_id
    assert env.heartbeat(rejoined.member_id, 1, instance="i-b") is E.none
    assert env.heartbeat(old_id, 1, instance="i-b") is E.fenced_instance_id


def test_static_member_write_failure_restores_the_old_id() -> None:
    env = LoggedEnv()
    results = env.form_group(2, instances=["i-a", "i-b"])
    old_id = next(r.member_id for r in results if r.member_id.startswith("i-b"))
    env.held = True
    rejoin = env.join(instance="i-b")
    assert not rejoin.done
    env.complete_writes(E.request_timed_out)
    assert rejoin.result.error is E.coordinator_not_available
    group = env.coord.group("g")
    assert group.static_member_id("i-b") == old_id and group.state is GroupState.STABLE
    assert env.heartbeat(old_id, 1, instance="i-b") is E.none


def test_tombstone_at_load_removes_the_group() -> None:
    env = LoggedEnv()
    env.form_group(2)
    env.log.append(("record", (encode_group_metadata_key("g"), None, -1, False)))
    assert env.restarted().group("g") is None


def test_loaded_group_over_max_size_rebalances() -> None:
    env = LoggedEnv()
    env.form_group(3)
    coord = env.restarted(group_max_size=2, group_initial_rebalance_delay_ms=0)
    assert coord.group("g").state is GroupState.PREPARING_REBALANCE
