"""Offset commits through the coordinator: handler -> records -> replay -> fetch, restarts,
transactional offsets (KIP-98/KIP-447), deletion and expiration."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from onceflow.clock import ManualClock
from onceflow.groups.coordinator import (
    CoordinatorLoadInProgressError,
    GroupCoordinator,
    LeaveMember,
)
from onceflow.groups.group import GroupState
from onceflow.groups.offsets import OffsetAndMetadata, OffsetFetchEntry
from onceflow.groups.offsets_record import OffsetsRecordError

from .harness import SESSION_MS, Env, replay_log

E = ErrorCode
TP0, TP1 = ("orders", 0), ("orders", 1)


def oam(offset: int, metadata: str = "", epoch: int = -1) -> OffsetAndMetadata:
    return OffsetAndMetadata(offset, leader_epoch=epoch, metadata=metadata)


def test_commit_replay_fetch_for_simple_group() -> None:
    env = Env()
    result = env.coord.commit_offsets("g", -1, "", None, {TP0: oam(10, "m", 3), TP1: oam(20)})
    assert result.response == {TP0: E.none, TP1: E.none}
    assert len(result.records) == 2
    # Nothing changes until the records are written and replayed.
    assert env.coord.fetch_offsets("g", [TP0], require_stable=False) == {TP0: OffsetFetchEntry()}
    assert env.coord.group("g") is None
    env.write(result.records)
    fetched = env.coord.fetch_offsets("g", [TP0, TP1, ("other", 0)], require_stable=True)
    assert fetched[TP0] == OffsetFetchEntry(10, 3, "m")
    assert fetched[TP1] == OffsetFetchEntry(20)
    assert fetched[("other", 0)] == OffsetFetchEntry(-1, -1, "", E.none)
    assert set(env.coord.fetch_offsets("g", None)) == {TP0, TP1}
    group = env.coord.group("g")
    assert group is not None and group.state is GroupState.EMPTY and group.protocol_type is None


def test_commit_timestamp_and_retention() -> None:
    env = Env()
    now = env.clock.now_ms
    result = env.coord.commit_offsets("g", -1, "", None, {TP0: oam(1)}, retention_time_ms=500)
    env.write(result.records)
    stored = env.coord.offsets.get("g", TP0)
    assert stored.commit_timestamp_ms == now and stored.expire_timestamp_ms == now + 500


def test_member_commits_in_stable_group() -> None:
    env = Env()
    leader, follower = env.form_group(2)
    ok = env.coord.commit_offsets("g", 1, follower.member_id, None, {TP0: oam(5)})
    assert ok.response == {TP0: E.none}
    env.write(ok.records)
    assert env.coord.fetch_offsets("g", [TP0])[TP0].offset == 5
    # A commit also counts as a sign of life.
    env.clock.advance(SESSION_MS - 1)
    env.coord.commit_offsets("g", 1, follower.member_id, None, {TP0: oam(6)})
    env.coord.heartbeat("g", leader.member_id, 1)
    env.advance(2)
    assert follower.member_id in env.coord.group("g").members


def test_commit_validation_errors() -> None:
    env = Env()
    leader, follower = env.form_group(2)
    c = env.coord

    def err(gen: int, member: str, instance: str | None = None, group: str = "g") -> ErrorCode:
        result = c.commit_offsets(group, gen, member, instance, {TP0: oam(1)})
        assert result.records == [] or result.response[TP0] is E.none
        return result.response[TP0]

    assert err(1, "ghost") is E.unknown_member_id
    assert err(7, follower.member_id) is E.illegal_generation
    assert err(-1, "") is E.unknown_member_id  # only members commit to a non-empty group
    assert err(5, "x", group="unknown-group") is E.illegal_generation
    assert (
        c.commit_offsets("unknown-group", 5, "x", None, {TP0: oam(1)}, api_version=9).response[TP0]
        is E.group_id_not_found
    )
    too_big = c.commit_offsets(
        "g", 1, leader.member_id, None, {TP0: oam(1, "x" * 5000), TP1: oam(2)}
    )
    assert too_big.response == {TP0: E.offset_metadata_too_large, TP1: E.none}
    assert len(too_big.records) == 1
    # While a rebalance completes, a member with the new generation must wait for its assignment.
    env.join(leader.member_id)
    env.join(follower.member_id)
    assert c.group("g").state is GroupState.COMPLETING_REBALANCE
    assert err(2, follower.member_id) is E.rebalance_in_progress
    # PreparingRebalance still accepts commits of the current generation.
    env.join(client_id="newcomer")
    assert c.group("g").state is GroupState.PREPARING_REBALANCE
    assert err(2, follower.member_id) is E.none


def test_restart_replays_to_same_offsets() -> None:
    env = Env()
    env.write(env.coord.commit_offsets("g", -1, "", None, {TP0: oam(1), TP1: oam(2)}).records)
    env.write(env.coord.commit_offsets("g", -1, "", None, {TP0: oam(3, "x")}).records)
    env.write(env.coord.commit_offsets("h", -1, "", None, {("t", 9): oam(99)}).records)
    txn = env.coord.txn_commit_offsets("tx", "g", 11, 0, -1, "", None, {TP1: oam(50)})
    env.write(txn.records, producer_id=11, transactional=True)
    env.marker(11, committed=True)
    aborted = env.coord.txn_commit_offsets("tx", "g", 12, 0, -1, "", None, {TP0: oam(500)})
    env.write(aborted.records, producer_id=12, transactional=True)
    env.marker(12, committed=False)
    open_txn = env.coord.txn_commit_offsets("tx", "h", 13, 0, -1, "", None, {("t", 9): oam(100)})
    env.write(open_txn.records, producer_id=13, transactional=True)
    env.write(env.coord.delete_offsets("h", [("t", 8)]).records)  # nothing to delete

    before = env.coord.offsets.snapshot()
    assert before == {
        "g": {TP0: env.coord.offsets.get("g", TP0), TP1: env.coord.offsets.get("g", TP1)},
        "h": {("t", 9): env.coord.offsets.get("h", ("t", 9))},
    }
    assert before["g"][TP1].offset == 50 and before["g"][TP0].offset == 3

    restarted = GroupCoordinator(ManualClock(env.clock.now_ms + 1_000), loading=True)
    with pytest.raises(CoordinatorLoadInProgressError):
        restarted.fetch_offsets("g", None)
    replay_log(restarted, env.log)
    restarted.complete_loading()
    assert restarted.offsets.snapshot() == before
    for group_id in ("g", "h"):
        for stable in (False, True):
            assert restarted.fetch_offsets(group_id, None, stable) == env.coord.fetch_offsets(
                group_id, None, stable
            )
    # The open transaction is still pending after the restart.
    assert (
        restarted.fetch_offsets("h", [("t", 9)], True)[("t", 9)].error is E.unstable_offset_commit
    )
    assert sorted(restarted.group_ids()) == ["g", "h"]
    # Simple groups (commits only, no group record): they come back empty.
    assert all(restarted.group(g).state is GroupState.EMPTY for g in ("g", "h"))


def test_transactional_offsets_pending_until_commit() -> None:
    env = Env()
    env.write(env.coord.commit_offsets("g", -1, "", None, {TP0: oam(1)}).records)
    result = env.coord.txn_commit_offsets(
        "tx", "g", 7, 0, -1, "", None, {TP0: oam(10), TP1: oam(20)}
    )
    assert result.response == {TP0: E.none, TP1: E.none}
    env.write(result.records, producer_id=7, transactional=True)
    # Visible only to read_uncommitted-style fetches as the previous value...
    assert env.coord.fetch_offsets("g", [TP0, TP1])[TP0].offset == 1
    assert env.coord.fetch_offsets("g", [TP0, TP1])[TP1].offset == -1
    # ...and unstable for require_stable fetches.
    stable = env.coord.fetch_offsets("g", [TP0, TP1, ("x", 0)], require_stable=True)
    assert stable[TP0].error is E.unstable_offset_commit and stable[TP0].offset == -1
    assert stable[TP1].error is E.unstable_offset_commit
    assert stable[("x", 0)].error is E.none
    assert env.coord.offsets.pending_for_producer(7) == {"g": {TP0: 10, TP1: 20}}
    env.marker(7, committed=True)
    after = env.coord.fetch_offsets("g", [TP0, TP1], require_stable=True)
    assert after[TP0] == OffsetFetchEntry(10) and after[TP1] == OffsetFetchEntry(20)
    assert env.coord.offsets.pending_for_producer(7) == {}


def test_transactional_offsets_dropped_on_abort() -> None:
    env = Env()
    env.write(env.coord.commit_offsets("g", -1, "", None, {TP0: oam(1)}).records)
    txn = env.coord.txn_commit_offsets("tx", "g", 7, 0, -1, "", None, {TP0: oam(10)})
    env.write(txn.records, producer_id=7, transactional=True)
    env.marker(7, committed=False)
    assert env.coord.fetch_offsets("g", [TP0], require_stable=True)[TP0] == OffsetFetchEntry(1)
    env.marker(7, committed=True)  # a marker with nothing pending changes nothing
    assert env.coord.fetch_offsets("g", [TP0])[TP0].offset == 1


def test_plain_commit_after_transactional_one_wins_at_commit() -> None:
    env = Env()
    txn = env.coord.txn_commit_offsets("tx", "g", 7, 0, -1, "", None, {TP0: oam(10), TP1: oam(11)})
    env.write(txn.records, producer_id=7, transactional=True)
    env.write(env.coord.commit_offsets("g", -1, "", None, {TP0: oam(99)}).records)
    env.marker(7, committed=True)
    fetched = env.coord.fetch_offsets("g", [TP0, TP1])
    assert fetched[TP0].offset == 99 and fetched[TP1].offset == 11


def test_two_producers_pending_on_one_group() -> None:
    env = Env()
    for pid, off in ((1, 10), (2, 20)):
        txn = env.coord.txn_commit_offsets("tx", "g", pid, 0, -1, "", None, {TP0: oam(off)})
        env.write(txn.records, producer_id=pid, transactional=True)
    env.marker(1, committed=True)
    assert env.coord.fetch_offsets("g", [TP0], True)[TP0].error is E.unstable_offset_commit
    assert env.coord.fetch_offsets("g", [TP0])[TP0].offset == 10
    env.marker(2, committed=True)
    assert env.coord.fetch_offsets("g", [TP0], True)[TP0] == OffsetFetchEntry(20)


def test_kip447_fencing_errors() -> None:
    env = Env()
    c = env.coord

    def txn_err(group: str, gen: int, member: str, instance: str | None = None) -> ErrorCode:
        return c.txn_commit_offsets(
            "tx", group, 5, 0, gen, member, instance, {TP0: oam(1)}
        ).response[TP0]

    assert txn_err("unknown", 3, "m") is E.illegal_generation
    assert txn_err("unknown", -1, "") is E.none
    leader, follower = env.form_group(2, instances=[None, "i-f"])
    assert txn_err("g", 1, leader.member_id) is E.none
    assert txn_err("g", 1, "stale-member") is E.unknown_member_id
    assert txn_err("g", 0, leader.member_id) is E.illegal_generation
    # TxnOffsetCommit v0-v2 carry no group metadata: accepted even with members.
    assert txn_err("g", -1, "") is E.none
    # A static member replaced by a newer instance is fenced.
    replacement = env.join(instance="i-f").result
    assert replacement.error is E.none
    assert txn_err("g", 1, follower.member_id, "i-f") is E.fenced_instance_id
    assert txn_err("g", 1, replacement.member_id, "i-f") is E.none
    # A member evicted by its session timeout is unknown afterwards.
    env.advance(SESSION_MS + 1)
    assert txn_err("g", 1, leader.member_id) is E.unknown_member_id
    # Transactional commits are not refused during CompletingRebalance.
    env2 = Env()
    a, b = env2.join(), env2.join()
    env2.advance(1)
    assert env2.coord.group("g").state is GroupState.COMPLETING_REBALANCE
    r = env2.coord.txn_commit_offsets("tx", "g", 1, 0, 1, a.result.member_id, None, {TP0: oam(1)})
    assert r.response[TP0] is E.none
    assert b.result.error is E.none


def test_delete_groups_non_empty_vs_empty() -> None:
    env = Env()
    leader, follower = env.form_group(2, group="busy")
    env.write(env.coord.commit_offsets("busy", 1, leader.member_id, None, {TP0: oam(1)}).records)
    env.write(env.coord.commit_offsets("idle", -1, "", None, {TP0: oam(1), TP1: oam(2)}).records)
    pending = env.coord.txn_commit_offsets("tx", "idle", 3, 0, -1, "", None, {("p", 0): oam(7)})
    env.write(pending.records, producer_id=3, transactional=True)

    result = env.coord.delete_groups(["busy", "idle", "ghost"])
    assert result.response == {
        "busy": E.non_empty_group,
        "idle": E.none,
        "ghost": E.group_id_not_found,
    }
    # Three offset tombstones (two committed, one pending) and the group tombstone.
    assert len(result.records) == 4 and all(v is None for _, v in result.records)
    assert env.coord.group("idle") is not None  # not until the records are replayed
    env.write(result.records)
    assert env.coord.group("idle") is None
    assert env.coord.fetch_offsets("idle", None) == {}
    assert env.coord.fetch_offsets("idle", [("p", 0)], True)[("p", 0)] == OffsetFetchEntry()
    assert env.coord.group("busy") is not None
    assert env.coord.delete_groups(["idle"]).response == {"idle": E.group_id_not_found}

    # Once the busy group empties, it can be deleted too.
    env.coord.leave_group("busy", [LeaveMember(leader.member_id), LeaveMember(follower.member_id)])
    assert env.coord.group("busy").state is GroupState.EMPTY
    deleted = env.coord.delete_groups(["busy"])
    assert deleted.response == {"busy": E.none}
    env.write(deleted.records)
    assert env.coord.group("busy") is None and env.coord.fetch_offsets("busy", None) == {}


def test_group_tombstone_spares_a_group_that_gained_members() -> None:
    env = Env()
    env.write(env.coord.commit_offsets("g", -1, "", None, {TP0: oam(1)}).records)
    deleted = env.coord.delete_groups(["g"])
    joiner = env.join()  # arrives while the deletion is being written
    env.write(deleted.records)
    assert env.coord.group("g") is not None
    env.advance(1)
    assert joiner.result.error is E.none


def test_delete_offsets() -> None:
    env = Env()
    env.write(env.coord.commit_offsets("g", -1, "", None, {TP0: oam(1), TP1: oam(2)}).records)
    res = env.coord.delete_offsets("g", [TP0, ("none", 0)])
    assert res.response == (E.none, {TP0: E.none, ("none", 0): E.none})
    assert len(res.records) == 1
    env.write(res.records)
    assert env.coord.fetch_offsets("g", None) == {TP1: OffsetFetchEntry(2)}
    assert env.coord.delete_offsets("ghost", [TP0]).response == (E.group_id_not_found, {})
    # A consumer group with members may only delete offsets of topics it does not consume.
    env.form_group(1, group="live")
    env.write(env.coord.commit_offsets("live", -1, "", None, {}).records)
    res = env.coord.delete_offsets("live", [TP0])
    # The harness's member metadata is not a parsable subscription: assume subscribed.
    assert res.response == (E.none, {TP0: E.group_subscribed_to_topic})
    env.join(group="other", protocol_type="connect")
    env.advance(1)
    assert env.coord.delete_offsets("other", [TP0]).response == (E.non_empty_group, {})


def test_expired_offsets_are_tombstoned_and_empty_groups_removed() -> None:
    env = Env(offsets_retention_ms=1_000)
    env.write(env.coord.commit_offsets("simple", -1, "", None, {TP0: oam(1)}).records)
    env.write(
        env.coord.commit_offsets(
            "simple", -1, "", None, {TP1: oam(1)}, retention_time_ms=100_000
        ).records
    )
    leader, _ = env.form_group(2, group="live")
    env.write(env.coord.commit_offsets("live", 1, leader.member_id, None, {TP0: oam(1)}).records)
    assert env.coord.cleanup_expired_offsets().records == []
    env.clock.advance(1_000)
    for m in env.coord.group("live").members.values():
        env.coord.heartbeat("live", m.member_id, 1)
    result = env.coord.cleanup_expired_offsets()
    assert result.response == 1  # simple/TP0 only; TP1 has its own expiry; live is Stable
    env.write(result.records)
    assert set(env.coord.fetch_offsets("simple", None)) == {TP1}
    env.clock.advance(100_000)
    result = env.coord.cleanup_expired_offsets()
    env.write(result.records)
    # Every offset of the simple group expired: the group goes as well.
    assert env.coord.group("simple") is None
    assert env.coord.group("live") is not None  # its members were evicted, but it has offsets


def test_replay_rejects_undecodable_records() -> None:
    env = Env()
    with pytest.raises(OffsetsRecordError):
        env.coord.replay(b"\x00\x09junk", b"")
    # A GroupMetadataValue is decoded now (group state is persisted): a corrupt one too fails.
    with pytest.raises(OffsetsRecordError):
        env.coord.replay(b"\x00\x02\x00\x01g", b"\x00\x03whatever")
    assert env.coord.group("g") is None


def test_loading_answers_for_offsets() -> None:
    env = Env()
    env.coord.begin_loading()
    assert env.coord.commit_offsets("g", -1, "", None, {TP0: oam(1)}).response == {
        TP0: E.coordinator_load_in_progress
    }
    assert env.coord.delete_groups(["g"]).response == {"g": E.coordinator_load_in_progress}
