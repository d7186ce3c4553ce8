"""Property-based tests: random clients against one group, and random offset histories."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kio.schema.errors import ErrorCode

from onceflow.clock import ManualClock
from onceflow.coordinator.result import Record
from onceflow.groups.config import GroupCoordinatorConfig
from onceflow.groups.coordinator import (
    GroupCoordinator,
    JoinGroupRequest,
    JoinResult,
    LeaveMember,
    SyncGroupRequest,
    SyncResult,
)
from onceflow.groups.group import GroupState
from onceflow.groups.offsets import OffsetAndMetadata

from .harness import Reply, replay_log

E = ErrorCode
GROUP = "g"
N_CLIENTS = 5
STATIC = {3: "i-3", 4: "i-4"}  # clients 3 and 4 are static members
PROTOCOL_CHOICES = [
    (("range", b"r"),),
    (("range", b"r2"),),
    (("sticky", b"s"), ("range", b"r")),
]


@dataclass
class Client:
    index: int
    instance: str | None
    member_id: str = ""
    generation: int = -1
    members: tuple[str, ...] = ()
    assigns: bool = False  # it is the leader and must send the assignment
    synced_generation: int = -1
    join: Reply | None = None
    sync: Reply | None = None


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        ids = itertools.count()
        self.coord = GroupCoordinator(
            self.clock,
            GroupCoordinatorConfig(group_initial_rebalance_delay_ms=2_000),
            member_id_suffix=lambda: f"m{next(ids)}",
        )
        self.clients = [Client(i, STATIC.get(i)) for i in range(N_CLIENTS)]
        self.last_generation = 0
        self.assigning_leader: dict[int, str] = {}
        self.protocol_by_generation: dict[int, str | None] = {}
        self.outstanding: list[Reply] = []

    # -- client behaviour ----------------------------------------------------------------

    def _absorb(self) -> None:
        for c in self.clients:
            if c.join is not None and c.join.done:
                self._on_join(c, c.join.result)
                c.join = None
            if c.sync is not None and c.sync.done:
                self._on_sync(c, c.sync.result)
                c.sync = None

    def _on_join(self, c: Client, r: JoinResult) -> None:
        if r.error is E.none:
            c.member_id, c.generation = r.member_id, r.generation_id
            c.members = tuple(m.member_id for m in r.members)
            c.assigns = r.leader == r.member_id and not r.skip_assignment
            if c.assigns:
                previous = self.assigning_leader.setdefault(r.generation_id, r.member_id)
                assert previous == r.member_id, "two leaders assigned one generation"
            event(
                f"joined generation {min(r.generation_id, 4)}{'+' if r.generation_id >= 4 else ''}"
            )
            if r.skip_assignment:
                event("static leader told to skip assignment")
            seen = self.protocol_by_generation.setdefault(r.generation_id, r.protocol_name)
            assert seen == r.protocol_name
            assert r.generation_id >= 1
        elif r.error is E.member_id_required:
            c.member_id = r.member_id
        elif r.error in (E.unknown_member_id, E.fenced_instance_id):
            event(f"join answered {r.error.name}")
            c.member_id, c.generation = "", -1
        else:
            assert r.error in (E.rebalance_in_progress, E.inconsistent_group_protocol), r

    def _on_sync(self, c: Client, r: SyncResult) -> None:
        if r.error is E.none:
            c.synced_generation = c.generation
            event("sync answered with an assignment")
            # A static member that rejoined under a new id keeps the assignment of its old id.
            assert r.assignment.endswith(f"@{c.generation}".encode()), r
        elif r.error in (E.unknown_member_id, E.fenced_instance_id):
            c.member_id, c.generation = "", -1
        else:
            assert r.error in (E.rebalance_in_progress, E.illegal_generation), r

    @rule(
        i=st.integers(0, N_CLIENTS - 1),
        require_known=st.booleans(),
        skip=st.booleans(),
        protocols=st.sampled_from(PROTOCOL_CHOICES),
    )
    def join(self, i: int, require_known: bool, skip: bool, protocols) -> None:
        c = self.clients[i]
        if c.join is not None:
            return  # a client has one JoinGroup in flight at most
        group = self.coord.group(GROUP)
        if c.instance and not c.member_id and group and group.static_member_id(c.instance):
            event(f"static member rejoins a {group.state} group under a new id")
        c.join = Reply()
        self.outstanding.append(c.join)
        self.coord.join_group(
            JoinGroupRequest(
                GROUP,
                c.member_id,
                "consumer",
                protocols,
                session_timeout_ms=10_000,
                rebalance_timeout_ms=15_000,
                group_instance_id=c.instance,
                client_id=f"c{i}",
                require_known_member_id=require_known,
                supports_skip_assignment=skip,
            ),
            c.join,
        )
        self._absorb()

    @rule(i=st.integers(0, N_CLIENTS - 1))
    def sync(self, i: int) -> None:
        c = self.clients[i]
        if c.sync is not None or c.generation < 0:
            return
        assignments = {}
        if c.assigns:
            assignments = {m: f"{m}@{c.generation}".encode() for m in c.members}
        c.sync = Reply()
        self.outstanding.append(c.sync)
        self.coord.sync_group(
            SyncGroupRequest(GROUP, c.generation, c.member_id, c.instance, assignments=assignments),
            c.sync,
        )
        self._absorb()

    @rule(i=st.integers(0, N_CLIENTS - 1))
    def heartbeat(self, i: int) -> None:
        c = self.clients[i]
        if not c.member_id:
            return
        error = self.coord.heartbeat(GROUP, c.member_id, c.generation, c.instance)
        assert error in (
            E.none,
            E.rebalance_in_progress,
            E.illegal_generation,
            E.unknown_member_id,
            E.fenced_instance_id,
        )
        if error in (E.unknown_member_id, E.fenced_instance_id):
            c.member_id, c.generation = "", -1
        self._absorb()

    @rule(i=st.integers(0, N_CLIENTS - 1))
    def leave(self, i: int) -> None:
        c = self.clients[i]
        if not c.member_id:
            return
        result = self.coord.leave_group(GROUP, [LeaveMember(c.member_id, c.instance)])
        assert result.members[0].error in (E.none, E.unknown_member_id, E.fenced_instance_id)
        c.member_id, c.generation = "", -1
        self._absorb()

    @rule(skip=st.booleans(), ms=st.sampled_from([100, 2_001]))
    def play_along(self, skip: bool, ms: int) -> None:
        """Every client takes its natural next step (join, sync or heartbeat), then time
        moves on a little: this is what gets the group through to Stable often."""
        for c in self.clients:
            if c.join is not None or c.sync is not None:
                continue
            if c.generation < 0:
                self.join(c.index, require_known=True, skip=skip, protocols=PROTOCOL_CHOICES[0])
            elif c.synced_generation != c.generation:
                self.sync(c.index)
            else:
                self.heartbeat(c.index)
        self.advance(ms)

    @rule(i=st.integers(0, N_CLIENTS - 1))
    def restart_client(self, i: int) -> None:
        # The process dies and comes back: it forgets its member id without leaving, so a
        # static member rejoins under its instance id, a dynamic one as a stranger.
        c = self.clients[i]
        if c.member_id:
            event("client restarted without leaving")
        c.member_id, c.generation, c.members, c.assigns = "", -1, (), False
        c.synced_generation = -1
        # Answers to the old process's requests go nowhere (they stay in self.outstanding).
        c.join = c.sync = None

    @rule(i=st.integers(0, N_CLIENTS - 1), offset=st.integers(0, 1000))
    def commit(self, i: int, offset: int) -> None:
        c = self.clients[i]
        result = self.coord.commit_offsets(
            GROUP, c.generation, c.member_id, c.instance, {("t", 0): OffsetAndMetadata(offset)}
        )
        error = result.response[("t", 0)]
        assert error in (
            E.none,
            E.unknown_member_id,
            E.illegal_generation,
            E.rebalance_in_progress,
            E.fenced_instance_id,
        )
        for key, value in result.records:
            self.coord.replay(key, value)
        if error is E.none:
            assert self.coord.fetch_offsets(GROUP, [("t", 0)])[("t", 0)].offset == offset
        self._absorb()

    @rule(ms=st.sampled_from([1, 500, 2_000, 5_000, 10_001, 15_001, 60_000]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.coord.tick()
        self._absorb()

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def group_is_consistent(self) -> None:
        group = self.coord.group(GROUP)
        if group is None:
            return
        event(f"state {group.state}")
        assert group.generation_id >= self.last_generation, "generation went backwards"
        self.last_generation = group.generation_id
        if group.state is GroupState.EMPTY:
            assert not group.members and group.leader_id is None
        if group.members:
            assert group.leader_id in group.members
        else:
            assert group.leader_id is None
        for instance, member_id in group.static_members.items():
            assert group.members[member_id].group_instance_id == instance
        for member in group.members.values():
            if member.awaiting_join is not None:
                assert group.state is GroupState.PREPARING_REBALANCE
            if member.awaiting_sync is not None:
                assert group.state is GroupState.COMPLETING_REBALANCE
            if group.state is GroupState.STABLE:
                assert member.assignment, f"member {member.member_id} has no assignment in Stable"
        assert group.pending_sync_members <= set(group.members)
        if group.state is GroupState.PREPARING_REBALANCE:
            assert group.join_deadline_ms is not None

    @invariant()
    def every_request_answered_at_most_once(self) -> None:
        assert all(len(r.results) <= 1 for r in self.outstanding)

    def teardown(self) -> None:
        # Liveness: with no more client activity, every waiting request gets its answer and
        # every member is eventually evicted.
        for _ in range(40):
            self.clock.advance(60_000)
            self.coord.tick()
        assert all(r.done for r in self.outstanding), "a request was never answered"
        group = self.coord.group(GROUP)
        if group is not None:
            assert group.state is GroupState.EMPTY and not group.members
            assert self.coord.next_deadline() is None


TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)


class PersistedGroupMachine(GroupMachine):
    """The random clients of test_group_state_machine.py, with the group's records kept and
    the broker restarted at random: a Stable group loads exactly as it was, an Empty one with
    its generation, and the clients carry on from there (the liveness checks of teardown)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[Record] = []
        self.ids = itertools.count()
        self.coord = self._coordinator(loading=False)

    def _coordinator(self, *, loading: bool) -> GroupCoordinator:
        return GroupCoordinator(
            self.clock,
            self.coord.config,
            loading=loading,
            member_id_suffix=lambda: f"m{next(self.ids)}",
            write_records=self._write,
        )

    def _write(self, records: list[Record], done: Callable[[ErrorCode], None]) -> None:
        self.records.extend(records)
        done(E.none)

    @rule()
    def restart_broker(self) -> None:
        loaded = self._coordinator(loading=True)
        for key, value in self.records:
            loaded.replay(key, value)
        loaded.complete_loading()
        before, after = self.coord.group(GROUP), loaded.group(GROUP)
        if before is not None and before.state is GroupState.STABLE:
            event("restart of a Stable group")
            assert loaded.describe_groups([GROUP]) == self.coord.describe_groups([GROUP])
            assert after is not None
            assert (after.generation_id, after.leader_id) == (
                before.generation_id,
                before.leader_id,
            )
            assert after.static_members == before.static_members
        elif before is not None and before.state is GroupState.EMPTY and self.records:
            assert after is not None and after.state is GroupState.EMPTY
            assert after.generation_id == before.generation_id
        self.coord = loaded
        # The connections dropped: what was in flight is never answered.
        self.outstanding = [reply for reply in self.outstanding if reply.done]
        for c in self.clients:
            c.join = c.sync = None
        # A rebalance that had not written its generation is lost, as in Kafka: the next one
        # may use its number again.
        self.last_generation = 0 if after is None else after.generation_id
        for generation in [g for g in self.protocol_by_generation if g > self.last_generation]:
            del self.protocol_by_generation[generation]
            self.assigning_leader.pop(generation, None)


TestPersistedGroupMachine = PersistedGroupMachine.TestCase
TestPersistedGroupMachine.settings = settings(
    max_examples=100, stateful_step_count=60, deadline=None
)


TPS = [("t", 0), ("t", 1), ("u", 0)]


class OffsetsMachine(RuleBasedStateMachine):
    """Commits, transactional commits, markers, deletions and restarts; the coordinator must
    agree with a simple model, and a restart (replay of the log) must change nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.coord = GroupCoordinator(self.clock)
        self.log: list[tuple[str, tuple]] = []
        self.committed: dict[tuple[str, int], int] = {}
        self.pending: dict[int, dict[tuple[str, int], int]] = {}
        self.seq = 0
        self.written_at: dict[tuple[str, int], int] = {}
        self.pending_at: dict[int, dict[tuple[str, int], int]] = {}

    def _write(self, records, producer_id: int = -1, transactional: bool = False) -> None:
        for key, value in records:
            self.log.append(("record", (key, value, producer_id, transactional)))
            self.coord.replay(key, value, producer_id=producer_id, transactional=transactional)

    @rule(tp=st.sampled_from(TPS), offset=st.integers(0, 10**6))
    def commit(self, tp, offset: int) -> None:
        result = self.coord.commit_offsets(GROUP, -1, "", None, {tp: OffsetAndMetadata(offset)})
        assert result.response == {tp: E.none}
        self._write(result.records)
        self.seq += 1
        self.committed[tp] = offset
        self.written_at[tp] = self.seq

    @rule(pid=st.integers(1, 3), tp=st.sampled_from(TPS), offset=st.integers(0, 10**6))
    def txn_commit(self, pid: int, tp, offset: int) -> None:
        result = self.coord.txn_commit_offsets(
            "tx", GROUP, pid, 0, -1, "", None, {tp: OffsetAndMetadata(offset)}
        )
        assert result.response == {tp: E.none}
        self._write(result.records, producer_id=pid, transactional=True)
        self.seq += 1
        self.pending.setdefault(pid, {})[tp] = offset
        self.pending_at.setdefault(pid, {})[tp] = self.seq

    @rule(pid=st.integers(1, 3), committed=st.booleans())
    def marker(self, pid: int, committed: bool) -> None:
        self.log.append(("marker", (pid, committed)))
        self.coord.complete_transaction(pid, committed)
        offsets = self.pending.pop(pid, {})
        seqs = self.pending_at.pop(pid, {})
        if committed:
            for tp, offset in offsets.items():
                if tp not in self.written_at or seqs[tp] > self.written_at[tp]:
                    self.committed[tp] = offset
                    self.written_at[tp] = seqs[tp]

    @rule(tp=st.sampled_from(TPS))
    def delete_offset(self, tp) -> None:
        result = self.coord.delete_offsets(GROUP, [tp])
        if self.coord.group(GROUP) is None:
            assert result.response == (E.group_id_not_found, {})
            return
        self._write(result.records)
        self.seq += 1
        self.committed.pop(tp, None)
        self.written_at.pop(tp, None)
        for pid in self.pending:
            self.pending[pid].pop(tp, None)
            self.pending_at[pid].pop(tp, None)

    @rule()
    def restart(self) -> None:
        before = self.coord.offsets.snapshot()
        restarted = GroupCoordinator(self.clock)
        replay_log(restarted, self.log)
        assert restarted.offsets.snapshot() == before
        for stable in (False, True):
            assert restarted.fetch_offsets(GROUP, TPS, stable) == self.coord.fetch_offsets(
                GROUP, TPS, stable
            )
        self.coord = restarted

    @invariant()
    def agrees_with_model(self) -> None:
        fetched = self.coord.fetch_offsets(GROUP, TPS, require_stable=False)
        stable = self.coord.fetch_offsets(GROUP, TPS, require_stable=True)
        for tp in TPS:
            assert fetched[tp].offset == self.committed.get(tp, -1)
            has_pending = any(tp in offsets for offsets in self.pending.values())
            if has_pending:
                assert stable[tp].error is E.unstable_offset_commit
            else:
                assert stable[tp].error is E.none
                assert stable[tp].offset == self.committed.get(tp, -1)


TestOffsetsMachine = OffsetsMachine.TestCase
TestOffsetsMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
