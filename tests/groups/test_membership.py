"""JoinGroup, SyncGroup, Heartbeat, LeaveGroup and the timers, against a ManualClock."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.groups.coordinator import LeaveMember
from onceflow.groups.group import GroupState

from .harness import REBALANCE_MS, SESSION_MS, Env

E = ErrorCode


def state(env: Env, group: str = "g") -> GroupState:
    g = env.coord.group(group)
    assert g is not None
    return g.state


def test_two_members_leader_and_follower_and_sync_distribution() -> None:
    env = Env()
    a = env.join(client_id="a")
    b = env.join(client_id="b")
    assert not a.done and not b.done
    assert state(env) is GroupState.PREPARING_REBALANCE
    env.advance(1)
    ra, rb = a.result, b.result
    assert ra.error is E.none and rb.error is E.none
    assert ra.generation_id == rb.generation_id == 1
    assert ra.leader == rb.leader == ra.member_id  # the first member leads
    assert ra.protocol_type == "consumer" and ra.protocol_name == "range"
    assert {m.member_id for m in ra.members} == {ra.member_id, rb.member_id}
    assert all(m.metadata == b"range-meta" for m in ra.members)
    assert rb.members == ()
    assert state(env) is GroupState.COMPLETING_REBALANCE

    follower_sync = env.sync(rb.member_id, 1)
    assert not follower_sync.done  # followers wait for the leader
    leader_sync = env.sync(ra.member_id, 1, {ra.member_id: b"A", rb.member_id: b"B"})
    assert leader_sync.result.assignment == b"A"
    assert follower_sync.result.assignment == b"B"
    assert follower_sync.result.protocol_name == "range"
    assert state(env) is GroupState.STABLE
    assert env.heartbeat(rb.member_id, 1) is E.none
    # A follower syncing again in Stable gets its assignment straight away.
    assert env.sync(rb.member_id, 1).result.assignment == b"B"


def test_leader_omitting_a_member_gives_it_an_empty_assignment() -> None:
    env = Env()
    ra, rb = env.join_two()
    fs = env.sync(rb.member_id, 1)
    env.sync(ra.member_id, 1, {ra.member_id: b"A"})
    assert fs.result.error is E.none and fs.result.assignment == b""


def test_third_member_joining_stable_group_rebalances() -> None:
    env = Env()
    leader, follower = env.form_group(2)
    c = env.join(client_id="c")
    assert not c.done
    assert state(env) is GroupState.PREPARING_REBALANCE
    # Heartbeats tell the existing members to rejoin.
    assert env.heartbeat(leader.member_id, 1) is E.rebalance_in_progress
    assert env.heartbeat(follower.member_id, 1) is E.rebalance_in_progress
    # Sync and commits of the old generation get the same news.
    assert env.sync(follower.member_id, 1).result.error is E.rebalance_in_progress
    ra = env.join(leader.member_id)
    assert not ra.done
    rb = env.join(follower.member_id)  # last one in: the rebalance completes at once
    results = [ra.result, rb.result, c.result]
    assert {r.generation_id for r in results} == {2}
    assert {r.leader for r in results} == {leader.member_id}
    assert len(ra.result.members) == 3
    assert state(env) is GroupState.COMPLETING_REBALANCE
    # The old generation is now illegal.
    assert env.heartbeat(leader.member_id, 1) is E.illegal_generation


def test_member_dying_is_evicted_after_session_timeout_and_group_rebalances() -> None:
    env = Env()
    leader, follower = env.form_group(2)
    env.clock.advance(SESSION_MS // 2)
    assert env.heartbeat(leader.member_id, 1) is E.none
    env.advance(SESSION_MS // 2 + 1)  # the follower's session has now expired
    group = env.coord.group("g")
    assert group is not None and follower.member_id not in group.members
    assert state(env) is GroupState.PREPARING_REBALANCE
    assert env.heartbeat(follower.member_id, 1) is E.unknown_member_id
    assert env.heartbeat(leader.member_id, 1) is E.rebalance_in_progress
    r = env.join(leader.member_id)
    assert r.result.error is E.none and r.result.generation_id == 2
    assert [m.member_id for m in r.result.members] == [leader.member_id]


def test_next_deadline_drives_tick() -> None:
    env = Env()
    _leader, follower = env.form_group(2)
    deadline = env.coord.next_deadline()
    assert deadline == env.clock.now_ms + SESSION_MS
    env.clock.now_ms = deadline - 1
    env.coord.tick()
    assert follower.member_id in env.coord.group("g").members
    env.clock.now_ms = deadline
    env.coord.tick()
    assert follower.member_id not in env.coord.group("g").members


def test_leave_group_and_last_member_leaving_empties_the_group() -> None:
    env = Env()
    leader, follower = env.form_group(2)
    res = env.coord.leave_group("g", [LeaveMember(follower.member_id)])
    assert res.error is E.none and [m.error for m in res.members] == [E.none]
    assert state(env) is GroupState.PREPARING_REBALANCE
    r = env.join(leader.member_id)
    assert r.result.generation_id == 2
    env.sync(leader.member_id, 2, {leader.member_id: b"all"})
    res = env.coord.leave_group("g", [LeaveMember(leader.member_id)])
    assert res.members[0].error is E.none
    group = env.coord.group("g")
    assert group.state is GroupState.EMPTY and group.generation_id == 3 and not group.members
    assert group.leader_id is None and group.protocol_name is None


def test_leave_group_batch_with_unknown_and_fenced_members() -> None:
    env = Env()
    _leader, follower = env.form_group(2, instances=["i-1", None])
    res = env.coord.leave_group(
        "g",
        [
            LeaveMember("nobody"),
            LeaveMember("wrong-id", group_instance_id="i-1"),
            LeaveMember(follower.member_id),
        ],
    )
    assert [m.error for m in res.members] == [
        E.unknown_member_id,
        E.fenced_instance_id,
        E.none,
    ]
    # KIP-345: an admin removes a static member by instance id alone.
    res = env.coord.leave_group("g", [LeaveMember("", group_instance_id="i-1")])
    assert res.members[0].error is E.none
    assert env.coord.group("g").members == {}
    unknown = env.coord.leave_group("no-such-group", [LeaveMember("x")])
    assert unknown.error is E.none and unknown.members[0].error is E.unknown_member_id


def test_leaving_member_waiting_in_join_is_answered() -> None:
    env = Env()
    leader, _follower = env.form_group(2)
    rejoin = env.join(leader.member_id)  # leader rejoin forces a rebalance
    assert not rejoin.done
    env.coord.leave_group("g", [LeaveMember(leader.member_id)])
    assert rejoin.result.error is E.unknown_member_id


def test_static_member_rejoin_keeps_generation_and_fences_old_id() -> None:
    env = Env()
    leader, follower = env.form_group(2, instances=["i-leader", "i-follower"])
    # The follower restarts: same instance id, no member id, same metadata.
    r = env.join(instance="i-follower", client_id="c1").result
    assert r.error is E.none
    assert r.member_id != follower.member_id
    assert r.generation_id == 1 and r.leader == leader.member_id
    assert state(env) is GroupState.STABLE
    assert env.heartbeat(follower.member_id, 1, instance="i-follower") is E.fenced_instance_id
    assert env.heartbeat(r.member_id, 1, instance="i-follower") is E.none
    # It gets its previous assignment back without a rebalance.
    sync = env.sync(r.member_id, 1, instance="i-follower").result
    assert sync.assignment == f"assigned:{follower.member_id}".encode()


def test_static_leader_rejoin_old_client_sees_old_leader_id() -> None:
    env = Env()
    leader, _ = env.form_group(2, instances=["i-leader", "i-follower"])
    r = env.join(instance="i-leader").result
    assert r.error is E.none and r.generation_id == 1
    assert r.leader == leader.member_id != r.member_id  # so it does not run the assignor
    assert r.skip_assignment is False and r.members == ()
    assert env.coord.group("g").leader_id == r.member_id


def test_static_leader_rejoin_v9_skips_assignment() -> None:
    env = Env()
    _leader, _ = env.form_group(2, instances=["i-leader", "i-follower"])
    r = env.join(instance="i-leader", skip=True).result
    assert r.error is E.none and r.leader == r.member_id and r.skip_assignment is True
    assert len(r.members) == 2
    assert state(env) is GroupState.STABLE


def test_static_member_rejoin_with_new_protocol_rebalances() -> None:
    env = Env()
    env.form_group(2, instances=["i-a", "i-b"])
    r = env.join(instance="i-b", protocols=(("range", b"changed"),))
    # Same protocol selected: no rebalance even though the metadata changed.
    assert r.result.error is E.none and state(env) is GroupState.STABLE
    r2 = env.join(instance="i-b", protocols=(("sticky", b"y"), ("range", b"x")))
    # i-a supports only range, so range stays the only candidate: still no rebalance.
    assert r2.result.error is E.none and state(env) is GroupState.STABLE
    r3 = env.join(instance="i-a", protocols=(("sticky", b"y"), ("range", b"x")))
    # Now both prefer sticky: the selected protocol would change, so the group rebalances.
    assert not r3.done
    assert state(env) is GroupState.PREPARING_REBALANCE
    r4 = env.join(r2.result.member_id, instance="i-b", protocols=(("sticky", b"y"),))
    assert r3.result.protocol_name == r4.result.protocol_name == "sticky"


def test_static_member_replaced_while_waiting_in_join_is_fenced() -> None:
    env = Env()
    leader, follower = env.form_group(2, instances=["i-a", "i-b"])
    first = env.join(follower.member_id, instance="i-b", protocols=(("range", b"new"),))
    assert not first.done and state(env) is GroupState.PREPARING_REBALANCE
    second = env.join(instance="i-b", protocols=(("range", b"new"),))
    assert first.result.error is E.fenced_instance_id
    assert not second.done
    env.join(leader.member_id, instance="i-a")
    assert second.result.error is E.none and second.result.generation_id == 2


def test_static_member_survives_rebalance_timeout_until_session_expires() -> None:
    env = Env()
    leader, _follower = env.form_group(2, instances=["i-a", "i-b"])
    rejoin = env.join(leader.member_id, instance="i-a")  # leader forces a rebalance
    # i-b neither rejoins nor heartbeats. The session (10 s) expires before the rebalance
    # timeout (30 s): the static member is evicted by its session, then the join completes.
    env.advance(SESSION_MS + 1)
    assert rejoin.result.error is E.none and rejoin.result.generation_id == 2
    assert [m.member_id for m in rejoin.result.members] == [leader.member_id]


def test_static_laggard_kept_by_rebalance_timeout() -> None:
    env = Env()
    leader, follower = env.form_group(2, instances=["i-a", "i-b"])
    rejoin = env.join(leader.member_id, instance="i-a")
    for _ in range(REBALANCE_MS // 5_000):
        env.clock.advance(5_000)
        assert env.heartbeat(follower.member_id, 1, instance="i-b") is E.rebalance_in_progress
        env.coord.tick()
    # The rebalance timeout completed the join; the static member did not rejoin but stays.
    assert rejoin.result.error is E.none and rejoin.result.generation_id == 2
    assert follower.member_id in env.coord.group("g").members
    assert len(rejoin.result.members) == 2


def test_rebalance_timeout_removes_dynamic_laggards() -> None:
    env = Env()
    leader, follower = env.form_group(2)
    c = env.join(client_id="c")
    a = env.join(leader.member_id)
    # The follower keeps heartbeating (it is alive) but never rejoins.
    for _ in range(REBALANCE_MS // 5_000):
        assert not a.done and not c.done
        env.clock.advance(5_000)
        assert env.heartbeat(follower.member_id, 1) is E.rebalance_in_progress
        env.coord.tick()
    assert a.result.error is E.none and c.result.error is E.none
    assert a.result.generation_id == 2
    assert {m.member_id for m in a.result.members} == {leader.member_id, c.result.member_id}
    assert env.heartbeat(follower.member_id, 1) is E.unknown_member_id
    assert env.heartbeat(follower.member_id, 2) is E.unknown_member_id


def test_member_that_never_syncs_is_removed_after_rebalance_timeout() -> None:
    env = Env()
    ra, rb = env.join_two()
    leader_sync = env.sync(ra.member_id, 1, {ra.member_id: b"A", rb.member_id: b"B"})
    assert leader_sync.result.error is E.none and state(env) is GroupState.STABLE
    # The follower never sends SyncGroup; it keeps heartbeating but that is not enough.
    for _ in range(REBALANCE_MS // 5_000):
        env.clock.advance(5_000)
        env.heartbeat(rb.member_id, 1)
        env.heartbeat(ra.member_id, 1)
        env.coord.tick()
    group = env.coord.group("g")
    assert rb.member_id not in group.members
    assert group.state is GroupState.PREPARING_REBALANCE


def test_follower_waiting_for_leader_sync_gets_rebalance_when_leader_never_syncs() -> None:
    env = Env()
    ra, rb = env.join_two()
    waiting = env.sync(rb.member_id, 1)
    env.advance(REBALANCE_MS)  # the leader never syncs: it is removed, the group rebalances
    assert waiting.result.error is E.rebalance_in_progress
    assert ra.member_id not in env.coord.group("g").members
    rejoin = env.join(rb.member_id)
    assert rejoin.result.generation_id == 2 and rejoin.result.leader == rb.member_id


def test_member_id_required_flow() -> None:
    env = Env()
    first = env.join(require_known=True, client_id="cl")
    r = first.result
    assert r.error is E.member_id_required and r.member_id.startswith("cl-")
    group = env.coord.group("g")
    assert group.is_pending_member(r.member_id) and not group.members
    second = env.join(r.member_id, require_known=True)
    env.advance(1)
    assert second.result.error is E.none and second.result.member_id == r.member_id
    assert second.result.leader == r.member_id


def test_pending_member_id_expires_after_session_timeout() -> None:
    env = Env()
    _leader, _ = env.form_group(2)
    r = env.join(require_known=True).result
    assert r.error is E.member_id_required
    assert state(env) is GroupState.STABLE  # nothing changes until it comes back
    env.clock.advance(SESSION_MS + 1)
    for m in env.coord.group("g").members.values():
        env.heartbeat(m.member_id, 1)
    env.coord.tick()
    assert not env.coord.group("g").is_pending_member(r.member_id)
    late = env.join(r.member_id, require_known=True)
    assert late.result.error is E.unknown_member_id


def test_pending_member_delays_join_completion_until_it_rejoins() -> None:
    env = Env()
    leader, follower = env.form_group(2)
    pending = env.join(require_known=True).result.member_id
    a = env.join(leader.member_id)  # leader rejoin: rebalance
    b = env.join(follower.member_id)
    assert not a.done and not b.done  # a member id was handed out: wait for it
    c = env.join(pending, require_known=True)
    assert a.result.generation_id == b.result.generation_id == c.result.generation_id == 2


def test_member_rejoining_with_its_id_after_the_last_member_expired_is_accepted() -> None:
    """A restarted consumer (KIP-394) gets its member id; before it comes back with it, the
    session of its killed predecessor expires: the group is rebalancing with no member, and
    waits for the pending one. Kafka counts a protocol as supported by all members when its
    count equals the member count, zero here, so the rejoin is accepted (aiokafka treats
    INCONSISTENT_GROUP_PROTOCOL as fatal: faust's restarted app stopped for good)."""
    env = Env()
    (old,) = env.form_group(1)
    env.advance(SESSION_MS // 2)
    pending = env.join(require_known=True, client_id="new").result.member_id
    env.advance(SESSION_MS // 2 + 1)  # the killed member's session expires
    group = env.coord.group("g")
    assert group is not None and not group.members
    assert state(env) is GroupState.PREPARING_REBALANCE
    rejoin = env.join(pending, require_known=True)
    assert rejoin.result.error is E.none and rejoin.result.leader == pending
    assert rejoin.result.generation_id == 2
    assert env.heartbeat(old.member_id, 1) is E.unknown_member_id


def test_initial_rebalance_delay_waits_and_extends_while_members_arrive() -> None:
    env = Env(group_initial_rebalance_delay_ms=3_000)
    a = env.join(rebalance=10_000)
    env.clock.advance(2_000)
    b = env.join(rebalance=10_000)  # arrives during the first delay: extend once more
    env.advance(1_000)
    assert not a.done and not b.done
    env.advance(2_999)
    assert not a.done
    env.advance(1)
    assert a.result.error is E.none and a.result.generation_id == 1
    assert len(a.result.members) == 2


def test_initial_rebalance_delay_is_bounded_by_rebalance_timeout() -> None:
    env = Env(group_initial_rebalance_delay_ms=3_000)
    a = env.join(rebalance=7_000)
    waited = 0
    while not a.done:
        env.join(client_id=f"x{waited}", rebalance=7_000)  # keep new members coming
        env.advance(500)
        waited += 500
        assert waited <= 7_000 + 3_000
    assert a.result.error is E.none
    assert waited <= 7_000


def test_new_member_join_times_out() -> None:
    env = Env(new_member_join_timeout_ms=20_000)
    leader, follower = env.form_group(2, instances=["i-a", "i-b"])
    env.join(leader.member_id, instance="i-a")  # rebalance (30 s); i-b static and silent
    newcomer = env.join(client_id="late")
    for _ in range(20_000 // 5_000):
        assert not newcomer.done
        env.clock.advance(5_000)
        env.heartbeat(follower.member_id, 1, instance="i-b")
        env.coord.tick()
    # A new member may not wait longer than the new-member join timeout.
    assert newcomer.result.error is E.unknown_member_id
    assert (newcomer.result.member_id or "late-m3") not in env.coord.group("g").members
    assert len(env.coord.group("g").members) == 2


def test_join_errors() -> None:
    env = Env()
    assert env.join(group="").result.error is E.invalid_group_id
    assert env.join(session=1).result.error is E.invalid_session_timeout
    assert env.join("ghost").result.error is E.unknown_member_id  # unknown group
    assert env.join(protocols=()).result.error is E.inconsistent_group_protocol
    _leader, _ = env.form_group(2)
    other = env.join(protocols=(("roundrobin", b""),))
    assert other.result.error is E.inconsistent_group_protocol
    other_type = env.join(protocol_type="connect")
    assert other_type.result.error is E.inconsistent_group_protocol
    assert env.join("ghost").result.error is E.unknown_member_id


def test_group_max_size() -> None:
    env = Env(group_max_size=2)
    env.form_group(2)
    r = env.join()
    assert r.result.error is E.group_max_size_reached


def test_follower_rejoin_in_stable_with_same_metadata_is_answered_at_once() -> None:
    env = Env()
    _leader, follower = env.form_group(2)
    r = env.join(follower.member_id).result
    assert r.error is E.none and r.generation_id == 1 and r.members == ()
    assert state(env) is GroupState.STABLE


def test_join_retry_in_completing_rebalance_is_answered_again() -> None:
    env = Env()
    a, _b = env.join(), env.join()
    env.advance(1)
    again = env.join(a.result.member_id).result
    assert again.generation_id == 1 and len(again.members) == 2


def test_sync_errors() -> None:
    env = Env()
    _leader, follower = env.form_group(2)
    assert env.sync("ghost", 1).result.error is E.unknown_member_id
    assert env.sync(follower.member_id, 7).result.error is E.illegal_generation
    assert env.sync("x", 1, group="nope").result.error is E.unknown_member_id
    assert env.sync("x", 1, group="").result.error is E.invalid_group_id


def test_heartbeat_errors() -> None:
    env = Env()
    assert env.heartbeat("x", 1, group="nope") is E.unknown_member_id
    assert env.heartbeat("x", 1, group="") is E.invalid_group_id


def test_loading_answers() -> None:
    env = Env()
    env.coord.begin_loading()
    assert env.join().result.error is E.coordinator_load_in_progress
    assert env.sync("m", 1).result.error is E.rebalance_in_progress
    assert env.heartbeat("m", 1) is E.none
    env.coord.complete_loading()
    assert env.heartbeat("m", 1) is E.unknown_member_id


def test_list_and_describe_groups() -> None:
    env = Env()
    _leader, follower = env.form_group(2, group="stable-one")
    env.join(group="preparing-one", protocol_type="connect")
    listed = {g.group_id: g for g in env.coord.list_groups()}
    assert listed["stable-one"].state == "Stable"
    assert listed["stable-one"].protocol_type == "consumer"
    assert listed["preparing-one"].state == "PreparingRebalance"
    assert listed["preparing-one"].protocol_type == "connect"
    assert listed["stable-one"].group_type == "classic"
    only_stable = env.coord.list_groups(states=["STABLE"])
    assert [g.group_id for g in only_stable] == ["stable-one"]
    assert env.coord.list_groups(types=["consumer"]) == []
    assert len(env.coord.list_groups(types=["Classic"])) == 2

    desc, missing = env.coord.describe_groups(["stable-one", "missing"])
    assert desc.error is E.none and desc.state == "Stable" and desc.protocol_data == "range"
    by_id = {m.member_id: m for m in desc.members}
    assert by_id[follower.member_id].assignment == f"assigned:{follower.member_id}".encode()
    assert by_id[follower.member_id].metadata == b"range-meta"
    assert by_id[follower.member_id].client_id == "c1"
    assert missing.error is E.group_id_not_found and missing.state == "Dead"
    (prep,) = env.coord.describe_groups(["preparing-one"])
    assert prep.protocol_data == "" and prep.members[0].metadata == b""
