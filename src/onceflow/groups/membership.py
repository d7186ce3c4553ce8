"""Classic group membership, sans-IO (Kafka's GroupMetadataManager for classic groups).

JoinGroup, SyncGroup, Heartbeat and LeaveGroup follow Apache Kafka's classic group coordinator.
JoinGroup and SyncGroup may have to wait for other members; they take a ``respond`` callback
that is called exactly once, possibly later (see ``outbox.py``).

As in Kafka, a group's record (GroupMetadataValue, ``group_metadata_record.py``) is written to
``__consumer_offsets`` when a generation's assignment is decided (the leader's SyncGroup), when
a generation ends empty, and when a static member rejoins a Stable group under a new id. The
state changes in memory first and the answers wait until the record is durable; the record is
not replayed then (Kafka's ``replayRecords=false``), only at load, where it rebuilds the group
with its generation, members and assignments (:meth:`Membership.replay_group_metadata`), and
the loaded members get fresh sessions (:meth:`Membership.on_loaded`): a broker restart costs
the members no rebalance when they come back within their session timeout.

Time comes from the injected clock; the broker calls :meth:`Membership.tick` periodically
(~100 ms) and at :meth:`Membership.next_deadline` to expire sessions, rebalances and pending
members.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.coordinator.result import Record
from onceflow.groups.context import GroupContext
from onceflow.groups.deadlines import TimerKind, due_deadlines, next_deadline, still_set
from onceflow.groups.errors import CoordinatorStateError
from onceflow.groups.group import ClassicGroup, GroupState, Member
from onceflow.groups.group_metadata_record import (
    decode_group_metadata_value,
    group_metadata_record,
    loaded_group,
)
from onceflow.groups.messages import (
    JoinGroupMember,
    JoinGroupRequest,
    JoinResult,
    LeaveMember,
    LeaveMemberResult,
    LeaveResult,
    SyncGroupRequest,
    SyncResult,
)
from onceflow.groups.offsets_record import encode_group_metadata_key
from onceflow.groups.outbox import Outbox, answers

log = logging.getLogger(__name__)

# Append records to ``__consumer_offsets`` and call back once they are durable, with the
# append's error (ErrorCode.none: written). The broker's writes through the coordinator runtime.
WriteRecords = Callable[[list[Record], Callable[[ErrorCode], None]], None]


def written_at_once(records: list[Record], done: Callable[[ErrorCode], None]) -> None:
    """A log where every append is durable at once (the sans-IO tests, a coordinator alone)."""
    del records
    done(ErrorCode.none)


def append_error_to_response_error(error: ErrorCode) -> ErrorCode:
    """What a member is told when its group's record could not be written (Kafka's
    appendGroupMetadataErrorToResponseError)."""
    if error in (
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_enough_replicas,
        ErrorCode.request_timed_out,
    ):
        return ErrorCode.coordinator_not_available
    if error in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if error in (
        ErrorCode.message_too_large,
        ErrorCode.record_list_too_large,
        ErrorCode.invalid_fetch_size,
    ):
        return ErrorCode.unknown_server_error
    return error


class Membership:
    """The classic groups of one broker and their membership protocol."""

    def __init__(
        self,
        context: GroupContext,
        *,
        member_id_suffix: Callable[[], str],
        write_records: WriteRecords = written_at_once,
    ) -> None:
        self._ctx = context
        self._member_id_suffix = member_id_suffix
        self._write_records = write_records
        self._groups: dict[str, ClassicGroup] = {}
        self._outbox = Outbox()

    @property
    def outbox(self) -> Outbox:
        return self._outbox

    # -- the groups -----------------------------------------------------------------------

    def group(self, group_id: str) -> ClassicGroup | None:
        return self._groups.get(group_id)

    def groups(self) -> list[ClassicGroup]:
        return list(self._groups.values())

    def group_ids(self) -> list[str]:
        return list(self._groups)

    def get_or_create_group(self, group_id: str) -> ClassicGroup:
        """The group, created empty when offsets are committed for an unknown one (a "simple"
        group: commits only, no members)."""
        group = self._groups.get(group_id)
        return group if group is not None else self._create_group(group_id)

    def validate_delete_group(self, group_id: str) -> ErrorCode | None:
        """DeleteGroups: only an empty group can be deleted."""
        group = self._groups.get(group_id)
        if group is None or group.is_in(GroupState.DEAD):
            return ErrorCode.group_id_not_found
        if not group.is_in(GroupState.EMPTY):
            return ErrorCode.non_empty_group
        return None

    @staticmethod
    def group_tombstone(group_id: str) -> Record:
        return (encode_group_metadata_key(group_id), None)

    def replay_group_tombstone(self, group_id: str) -> None:
        """A group's tombstone, written by DeleteGroups or by offset expiry, is durable."""
        group = self._groups.get(group_id)
        if group is None:
            return
        # Live, a member may have joined between DeleteGroups and this replay: keep that
        # group. At load the log is the truth: the group is gone (Kafka's removeGroup).
        if self._ctx.loading or group.is_in(GroupState.EMPTY):
            if group.state is not GroupState.DEAD:
                group.transition_to(GroupState.DEAD, self._ctx.clock())
            del self._groups[group_id]

    def replay_group_metadata(self, group_id: str, value: bytes | None) -> None:
        """A GroupMetadataValue (or its tombstone) of ``__consumer_offsets``.

        At load it rebuilds the group as the record says. Written live, it only persisted
        what the coordinator had already changed in memory: nothing to apply.
        Raises OffsetsRecordError for a value that cannot be decoded.
        """
        if value is None:
            self.replay_group_tombstone(group_id)
            return
        decoded = decode_group_metadata_value(value)
        if self._ctx.loading:
            self._groups[group_id] = loaded_group(group_id, decoded, self._ctx.clock())

    # -- online upgrade and downgrade (KIP-848 mixed groups, consumer_groups.py) ------------

    @answers
    def drop_upgraded_group(self, group_id: str) -> None:
        """The group became a consumer group (its tombstone is written with the consumer
        group's records): members waiting in JoinGroup or SyncGroup are told to rejoin
        (REBALANCE_IN_PROGRESS), as Kafka's convertToConsumerGroup; its timers go with it."""
        group = self._groups.pop(group_id, None)
        if group is None:
            return
        for member in group.members.values():
            member.heartbeat_deadline_ms = None
            if member.awaiting_join is not None:
                callback, member.awaiting_join = member.awaiting_join, None
                self._respond(
                    callback, JoinResult(ErrorCode.rebalance_in_progress, member.member_id)
                )
            if member.awaiting_sync is not None:
                callback, member.awaiting_sync = member.awaiting_sync, None
                self._respond(callback, SyncResult(ErrorCode.rebalance_in_progress))
        group.join_deadline_ms = None
        group.sync_deadline_ms = None
        group.pending_join_members.clear()

    @answers
    def adopt_downgraded_group(self, group: ClassicGroup, *, rebalance: bool = True) -> None:
        """A consumer group downgraded to this classic group (its record is written with the
        consumer group's tombstones): the members' sessions start now and it rebalances, so
        that they rejoin it, as Kafka's convertToClassicGroup (not when a static member
        rejoining as a classic one triggered it)."""
        self._groups[group.group_id] = group
        for member in group.members.values():
            self.schedule_heartbeat(member)
        if rebalance:
            self._prepare_rebalance(group)

    @answers
    def on_loaded(self) -> None:
        """The offsets log is loaded: each loaded member's session starts now (it has had no
        chance to heartbeat while the broker was down), as Kafka's onLoaded; a group over
        ``group.max.size`` (lowered since) rebalances."""
        for group in self._groups.values():
            for member in group.members.values():
                self.schedule_heartbeat(member)
            if len(group.members) > self._ctx.config.group_max_size:
                self._maybe_prepare_rebalance(group)

    def schedule_heartbeat(self, member: Member) -> None:
        """Restart the member's session (a heartbeat, or a commit, which proves it alive)."""
        member.heartbeat_deadline_ms = self._ctx.clock() + member.session_timeout_ms

    # -- JoinGroup ------------------------------------------------------------------------

    @answers
    def join_group(self, request: JoinGroupRequest, respond: Callable[[JoinResult], None]) -> None:
        req = request
        error = self._request_error(req.group_id, ErrorCode.coordinator_load_in_progress)
        if error is not None:
            self._respond(respond, JoinResult(error, member_id=req.member_id))
            return
        cfg = self._ctx.config
        if not (
            cfg.group_min_session_timeout_ms
            <= req.session_timeout_ms
            <= cfg.group_max_session_timeout_ms
        ):
            self._respond(respond, JoinResult(ErrorCode.invalid_session_timeout, req.member_id))
            return
        is_unknown = req.member_id == ""
        group = self._groups.get(req.group_id)
        if group is None:
            if not is_unknown:
                self._respond(respond, JoinResult(ErrorCode.unknown_member_id, req.member_id))
                return
            group = self._create_group(req.group_id)

        if not self._accept_joining_member(group, req.member_id):
            removed = group.remove(req.member_id)
            if removed is not None:
                self._answer_removed(removed)
            self._respond(respond, JoinResult(ErrorCode.group_max_size_reached))
        elif is_unknown:
            self._join_new_member(group, req, respond)
        else:
            self._join_current_member(group, req, respond)

        if group.is_in(GroupState.PREPARING_REBALANCE):
            self._try_complete_join(group)

    def _accept_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        max_size = self._ctx.config.group_max_size
        if group.is_in(GroupState.EMPTY, GroupState.DEAD):
            return True
        member = group.members.get(member_id)
        if group.is_in(GroupState.PREPARING_REBALANCE):
            # Counting members awaiting join lets the last rejoining members be turned away
            # when the limit was lowered below the current size.
            already_waiting = member is not None and member.awaiting_join is not None
            return already_waiting or group.num_awaiting_join() < max_size
        return member is not None or len(group.members) < max_size

    def _join_new_member(
        self, group: ClassicGroup, req: JoinGroupRequest, respond: Callable[[JoinResult], None]
    ) -> None:
        if group.is_in(GroupState.DEAD):
            self._respond(respond, JoinResult(ErrorCode.coordinator_not_available))
            return
        if not group.supports_protocols(req.protocol_type, [n for n, _ in req.protocols]):
            self._respond(respond, JoinResult(ErrorCode.inconsistent_group_protocol))
            return
        prefix = req.group_instance_id if req.group_instance_id is not None else req.client_id
        new_member_id = f"{prefix}-{self._member_id_suffix()}"
        if req.group_instance_id is not None:
            old_member_id = group.static_member_id(req.group_instance_id)
            if old_member_id is not None:
                self._update_static_member_and_rebalance(
                    group, old_member_id, new_member_id, req, respond
                )
            else:
                self._add_member_and_rebalance(group, req, new_member_id, respond)
        elif req.require_known_member_id:
            # KIP-394: remember the id, and let the client come back with it; the id expires
            # after a session timeout if it does not.
            deadline = self._ctx.clock() + req.session_timeout_ms
            group.pending_join_members[new_member_id] = deadline
            self._respond(
                respond, JoinResult(ErrorCode.member_id_required, member_id=new_member_id)
            )
        else:
            self._add_member_and_rebalance(group, req, new_member_id, respond)

    def _join_current_member(
        self, group: ClassicGroup, req: JoinGroupRequest, respond: Callable[[JoinResult], None]
    ) -> None:
        member_id = req.member_id
        if group.is_in(GroupState.DEAD):
            self._respond(respond, JoinResult(ErrorCode.coordinator_not_available, member_id))
            return
        if not group.supports_protocols(req.protocol_type, [n for n, _ in req.protocols]):
            self._respond(respond, JoinResult(ErrorCode.inconsistent_group_protocol, member_id))
            return
        if group.is_pending_member(member_id):
            if req.group_instance_id is not None:
                # Pending ids are only handed to dynamic members; Kafka treats this as a bug
                # (unknown server error). The client must start over.
                self._respond(respond, JoinResult(ErrorCode.unknown_member_id, member_id))
                return
            self._add_member_and_rebalance(group, req, member_id, respond)
            return
        error = group.validate_member(member_id, req.group_instance_id)
        if error is not None:
            self._respond(respond, JoinResult(error, member_id))
            return
        member = group.members[member_id]
        if group.is_in(GroupState.PREPARING_REBALANCE):
            self._update_member_and_rebalance(group, member, req, respond)
        elif group.is_in(GroupState.COMPLETING_REBALANCE):
            if member.matches(list(req.protocols)):
                # Same metadata: a retry of a JoinGroup whose answer was lost; answer again.
                self._respond(respond, self._join_result(group, member, leader_view=True))
            else:
                self._update_member_and_rebalance(group, member, req, respond)
        elif group.is_in(GroupState.STABLE):
            if group.is_leader(member_id) or not member.matches(list(req.protocols)):
                # The leader rejoining forces a rebalance: it may have seen metadata changes
                # (new partitions) that the member metadata does not show.
                self._update_member_and_rebalance(group, member, req, respond)
            else:
                self._respond(respond, self._join_result(group, member, leader_view=False))
        else:
            self._respond(respond, JoinResult(ErrorCode.unknown_member_id, member_id))

    def _join_result(
        self, group: ClassicGroup, member: Member, *, leader_view: bool, skip: bool = False
    ) -> JoinResult:
        members: tuple[JoinGroupMember, ...] = ()
        if leader_view and group.is_leader(member.member_id):
            members = self._member_metadata(group)
        return JoinResult(
            ErrorCode.none,
            member_id=member.member_id,
            generation_id=group.generation_id,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=group.leader_id or "",
            skip_assignment=skip,
            members=members,
        )

    @staticmethod
    def _member_metadata(group: ClassicGroup) -> tuple[JoinGroupMember, ...]:
        return tuple(
            JoinGroupMember(m.member_id, m.group_instance_id, m.metadata(group.protocol_name))
            for m in group.members.values()
        )

    def _add_member_and_rebalance(
        self,
        group: ClassicGroup,
        req: JoinGroupRequest,
        member_id: str,
        respond: Callable[[JoinResult], None],
    ) -> None:
        member = Member(
            member_id=member_id,
            group_instance_id=req.group_instance_id,
            client_id=req.client_id,
            client_host=req.client_host,
            rebalance_timeout_ms=self._rebalance_timeout(req),
            session_timeout_ms=req.session_timeout_ms,
            protocol_type=req.protocol_type,
            protocols=list(req.protocols),
            is_new=True,
        )
        if group.is_in(GroupState.PREPARING_REBALANCE) and group.generation_id == 0:
            group.new_member_added = True
        group.add(member)
        member.awaiting_join = respond
        # A new member cannot heartbeat, and its connection is idle while it waits: bound the
        # wait so that members whose clients went away do not hold up rebalances forever.
        member.heartbeat_deadline_ms = (
            self._ctx.clock() + self._ctx.config.new_member_join_timeout_ms
        )
        self._maybe_prepare_rebalance(group)

    def _update_static_member_and_rebalance(
        self,
        group: ClassicGroup,
        old_member_id: str,
        new_member_id: str,
        req: JoinGroupRequest,
        respond: Callable[[JoinResult], None],
    ) -> None:
        assert req.group_instance_id is not None
        current_leader = group.leader_id
        old, member = group.replace_static_member(
            req.group_instance_id, old_member_id, new_member_id
        )
        self._fence_replaced_member(old)
        self.schedule_heartbeat(member)
        previous = (member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms)
        self._update_member(member, req, respond)

        if group.is_in(GroupState.STABLE):
            if group.select_protocol() == group.protocol_name:
                # Nothing the assignment depends on changed: hand the member its new id within
                # the current generation, without a rebalance, once the new id is durable.
                assignment = {m.member_id: m.assignment for m in group.members.values()}
                self._write_group(
                    group,
                    assignment,
                    lambda error: self._static_member_stored(
                        group, member, old_member_id, req, current_leader, previous, error
                    ),
                )
            else:
                self._maybe_prepare_rebalance(group)
        elif group.is_in(GroupState.COMPLETING_REBALANCE):
            # The leader may already be assigning to the old member id: start over.
            self._prepare_rebalance(group)
        elif group.is_in(GroupState.EMPTY, GroupState.DEAD):
            raise CoordinatorStateError(
                f"group {group.group_id!r} is {group.state} but knows static member "
                f"{req.group_instance_id!r}"
            )

    def _static_member_stored(
        self,
        group: ClassicGroup,
        member: Member,
        old_member_id: str,
        req: JoinGroupRequest,
        current_leader: str | None,
        previous: tuple[list[tuple[str, bytes]], int, int],
        error: ErrorCode,
    ) -> None:
        """The static member's new id is durable (or could not be written: then it gets its
        old id back and the member an error, as Kafka reverts)."""
        if (
            self._groups.get(group.group_id) is not group
            or group.members.get(member.member_id) is not member
        ):
            return  # it left, or was replaced again, meanwhile: answered then
        if error is not ErrorCode.none:
            assert req.group_instance_id is not None
            log.warning(
                "persisting static member %r of group %r failed (%s): back to member id %r",
                req.group_instance_id,
                group.group_id,
                error.name,
                old_member_id,
            )
            member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms = previous
            _, restored = group.replace_static_member(
                req.group_instance_id, member.member_id, old_member_id
            )
            self.schedule_heartbeat(restored)
            member.heartbeat_deadline_ms = None
            self._complete_join_callback(
                member,
                JoinResult(
                    append_error_to_response_error(error),
                    member_id="",
                    generation_id=group.generation_id,
                    protocol_type=group.protocol_type,
                    protocol_name=group.protocol_name,
                    leader=current_leader or "",
                ),
            )
            return
        if req.supports_skip_assignment:
            is_leader = group.is_leader(member.member_id)
            result = self._join_result(group, member, leader_view=True, skip=is_leader)
        else:
            # Older clients are told the previous leader id, so a rejoining static leader
            # does not compute an assignment that a Stable group would ignore.
            result = JoinResult(
                ErrorCode.none,
                member_id=member.member_id,
                generation_id=group.generation_id,
                protocol_type=group.protocol_type,
                protocol_name=group.protocol_name,
                leader=current_leader or "",
            )
        self._complete_join_callback(member, result)

    def _update_member(
        self, member: Member, req: JoinGroupRequest, respond: Callable[[JoinResult], None]
    ) -> None:
        member.protocols = list(req.protocols)
        member.rebalance_timeout_ms = self._rebalance_timeout(req)
        member.session_timeout_ms = req.session_timeout_ms
        if member.awaiting_join is not None and member.awaiting_join is not respond:
            # A second JoinGroup from the same member supersedes the first; answer the first
            # so that no request is left without a response.
            self._respond(member.awaiting_join, JoinResult(ErrorCode.rebalance_in_progress))
        member.awaiting_join = respond

    def _update_member_and_rebalance(
        self,
        group: ClassicGroup,
        member: Member,
        req: JoinGroupRequest,
        respond: Callable[[JoinResult], None],
    ) -> None:
        self._update_member(member, req, respond)
        self._maybe_prepare_rebalance(group)

    @staticmethod
    def _rebalance_timeout(req: JoinGroupRequest) -> int:
        if req.rebalance_timeout_ms < 0:
            return req.session_timeout_ms
        return req.rebalance_timeout_ms

    # -- rebalance ------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: ClassicGroup) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group)

    def _prepare_rebalance(self, group: ClassicGroup) -> None:
        now = self._ctx.clock()
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            # Members waiting on SyncGroup must rejoin instead.
            self._reset_and_propagate_assignment_error(group, ErrorCode.rebalance_in_progress)
        group.pending_sync_members.clear()
        group.sync_deadline_ms = None
        if group.is_in(GroupState.EMPTY):
            # group.initial.rebalance.delay.ms: let more members of a new group arrive before
            # the first generation, extended while they keep arriving (up to the rebalance
            # timeout).
            delay = self._ctx.config.group_initial_rebalance_delay_ms
            group.join_is_initial = True
            group.join_delay_ms = delay
            group.join_remaining_ms = max(group.rebalance_timeout_ms() - delay, 0)
            group.join_deadline_ms = now + max(delay, 1)
        else:
            group.join_is_initial = False
            group.join_deadline_ms = now + max(group.rebalance_timeout_ms(), 1)
        group.transition_to(GroupState.PREPARING_REBALANCE, now)
        self._try_complete_join(group)

    def _try_complete_join(self, group: ClassicGroup) -> None:
        if (
            group.is_in(GroupState.PREPARING_REBALANCE)
            and not group.join_is_initial
            and group.has_all_members_joined()
        ):
            self._complete_join(group)

    def _complete_join(self, group: ClassicGroup) -> None:
        now = self._ctx.clock()
        group.join_deadline_ms = None
        group.join_is_initial = False
        # Dynamic members that did not rejoin in time are gone; static members stay until
        # their session expires (they may be restarting).
        for member in group.not_yet_rejoined_members():
            if not member.is_static:
                self._remove_member(group, member)
        if group.is_in(GroupState.DEAD):
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Only static members that did not rejoin are left: wait another rebalance timeout
            # for them to rejoin or for their sessions to expire.
            group.join_deadline_ms = now + max(group.rebalance_timeout_ms(), 1)
            return
        group.init_next_generation(now)
        if group.is_in(GroupState.EMPTY):
            # A failure is only logged: a restart would bring back the previous generation,
            # whose members then expire (Kafka's reasoning).
            self._write_group(group, {}, lambda error: self._log_write_error(group, error))
            return
        for member in group.members.values():
            self._complete_join_callback(member, self._join_result(group, member, leader_view=True))
            self.schedule_heartbeat(member)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        group.sync_deadline_ms = now + max(group.rebalance_timeout_ms(), 1)
        group.sync_generation_id = group.generation_id

    def _complete_join_callback(self, member: Member, result: JoinResult) -> None:
        if member.awaiting_join is not None:
            callback, member.awaiting_join = member.awaiting_join, None
            self._respond(callback, result)

    def _reset_and_propagate_assignment_error(self, group: ClassicGroup, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: ClassicGroup, error: ErrorCode) -> None:
        ok = error is ErrorCode.none
        for member in group.members.values():
            if member.awaiting_sync is None:
                continue
            callback, member.awaiting_sync = member.awaiting_sync, None
            self._respond(
                callback,
                SyncResult(
                    error,
                    protocol_type=group.protocol_type if ok else None,
                    protocol_name=group.protocol_name if ok else None,
                    assignment=member.assignment,
                ),
            )
            # Its session was on hold while it waited on us; it starts again now.
            self.schedule_heartbeat(member)

    # -- SyncGroup ------------------------------------------------------------------------

    @answers
    def sync_group(self, request: SyncGroupRequest, respond: Callable[[SyncResult], None]) -> None:
        req = request
        # While loading: the rebalance state was lost with the restart, have the member rejoin.
        error = self._request_error(req.group_id, ErrorCode.rebalance_in_progress)
        if error is not None:
            self._respond(respond, SyncResult(error))
            return
        group = self._groups.get(req.group_id)
        if group is None:
            self._respond(respond, SyncResult(ErrorCode.unknown_member_id))
            return
        error = self._validate_sync(group, req)
        if error is not None:
            self._respond(respond, SyncResult(error))
            return
        member = group.members[req.member_id]
        if group.is_in(GroupState.EMPTY):
            self._respond(respond, SyncResult(ErrorCode.unknown_member_id))
        elif group.is_in(GroupState.PREPARING_REBALANCE):
            self._respond(respond, SyncResult(ErrorCode.rebalance_in_progress))
        elif group.is_in(GroupState.COMPLETING_REBALANCE):
            if member.awaiting_sync is not None and member.awaiting_sync is not respond:
                self._respond(member.awaiting_sync, SyncResult(ErrorCode.rebalance_in_progress))
            member.awaiting_sync = respond
            self._remove_pending_sync_member(group, member.member_id)
            if group.is_leader(member.member_id):
                # Members the leader left out get an empty assignment, as in Kafka.
                assignment = {m: bytes(req.assignments.get(m, b"")) for m in group.members}
                self._write_group(
                    group,
                    assignment,
                    lambda error: self._assignment_stored(
                        group, req.generation_id, assignment, error
                    ),
                )
        elif group.is_in(GroupState.STABLE):
            self._remove_pending_sync_member(group, member.member_id)
            self._respond(
                respond,
                SyncResult(
                    ErrorCode.none, group.protocol_type, group.protocol_name, member.assignment
                ),
            )
            self.schedule_heartbeat(member)
        else:
            raise CoordinatorStateError(
                f"SyncGroup reached group {group.group_id!r} in {group.state}"
            )

    def _assignment_stored(
        self,
        group: ClassicGroup,
        generation_id: int,
        assignment: dict[str, bytes],
        error: ErrorCode,
    ) -> None:
        """The leader's assignment is durable (or could not be written): the members get it."""
        # Another member may have joined while the record was written: only the round it was
        # decided for may use it.
        if self._groups.get(group.group_id) is not group or not (
            group.is_in(GroupState.COMPLETING_REBALANCE) and group.generation_id == generation_id
        ):
            return
        if error is ErrorCode.none:
            for m in group.members.values():
                m.assignment = assignment[m.member_id]
            self._propagate_assignment(group, ErrorCode.none)
            group.transition_to(GroupState.STABLE, self._ctx.clock())
            return
        log.warning("storing the assignment of group %r failed: %s", group.group_id, error.name)
        self._reset_and_propagate_assignment_error(group, append_error_to_response_error(error))
        self._maybe_prepare_rebalance(group)

    @staticmethod
    def _validate_sync(group: ClassicGroup, req: SyncGroupRequest) -> ErrorCode | None:
        if group.is_in(GroupState.DEAD):
            return ErrorCode.coordinator_not_available
        error = group.validate_member(req.member_id, req.group_instance_id)
        if error is not None:
            return error
        if req.generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if req.protocol_type is not None and req.protocol_type != group.protocol_type:
            return ErrorCode.inconsistent_group_protocol
        if req.protocol_name is not None and req.protocol_name != group.protocol_name:
            return ErrorCode.inconsistent_group_protocol
        return None

    def _remove_pending_sync_member(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        if not group.pending_sync_members:
            group.sync_deadline_ms = None

    # -- Heartbeat ------------------------------------------------------------------------

    @answers
    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None = None,
    ) -> ErrorCode:
        # While loading Kafka answers blindly; the member learns more on its next request.
        error = self._request_error(group_id, ErrorCode.none)
        if error is not None:
            return error
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if group.is_in(GroupState.DEAD):
            return ErrorCode.coordinator_not_available
        error = group.validate_member(member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if group.is_in(GroupState.EMPTY):
            return ErrorCode.unknown_member_id
        self.schedule_heartbeat(group.members[member_id])
        if group.is_in(GroupState.PREPARING_REBALANCE):
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    # -- LeaveGroup -----------------------------------------------------------------------

    @answers
    def leave_group(self, group_id: str, members: Sequence[LeaveMember]) -> LeaveResult:
        error = self._request_error(group_id, ErrorCode.coordinator_load_in_progress)
        if error is not None:
            return LeaveResult(error)
        group = self._groups.get(group_id)
        if group is None:
            return LeaveResult(
                ErrorCode.none,
                tuple(
                    LeaveMemberResult(m.member_id, m.group_instance_id, ErrorCode.unknown_member_id)
                    for m in members
                ),
            )
        if group.is_in(GroupState.DEAD):
            return LeaveResult(ErrorCode.coordinator_not_available)
        results = []
        for leaving in members:
            error = self._leave_one(group, leaving)
            results.append(LeaveMemberResult(leaving.member_id, leaving.group_instance_id, error))
        return LeaveResult(ErrorCode.none, tuple(results))

    def _leave_one(self, group: ClassicGroup, leaving: LeaveMember) -> ErrorCode:
        if leaving.member_id == "":
            # KIP-345: an admin removes a static member by its instance id alone.
            if leaving.group_instance_id is None:
                return ErrorCode.unknown_member_id
            current = group.static_member_id(leaving.group_instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            self._remove_member_and_update_group(group, group.members[current])
            return ErrorCode.none
        if group.is_pending_member(leaving.member_id):
            group.remove(leaving.member_id)
            self._try_complete_join(group)
            return ErrorCode.none
        error = group.validate_member(leaving.member_id, leaving.group_instance_id)
        if error is not None:
            return error
        self._remove_member_and_update_group(group, group.members[leaving.member_id])
        return ErrorCode.none

    def _remove_member_and_update_group(self, group: ClassicGroup, member: Member) -> None:
        self._remove_member(group, member)
        if group.is_in(GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group)
        elif group.is_in(GroupState.PREPARING_REBALANCE):
            self._try_complete_join(group)

    def _remove_member(self, group: ClassicGroup, member: Member) -> None:
        group.remove(member.member_id)
        self._answer_removed(member)

    def _answer_removed(self, member: Member) -> None:
        """Answer what a member that is no longer in the group was waiting for."""
        member.heartbeat_deadline_ms = None
        if member.awaiting_join is not None:
            callback, member.awaiting_join = member.awaiting_join, None
            self._respond(callback, JoinResult(ErrorCode.unknown_member_id))
        if member.awaiting_sync is not None:
            callback, member.awaiting_sync = member.awaiting_sync, None
            self._respond(callback, SyncResult(ErrorCode.unknown_member_id))

    def _fence_replaced_member(self, old: Member) -> None:
        """A static member rejoined under a new id: its old id's pending requests are fenced."""
        old.heartbeat_deadline_ms = None
        if old.awaiting_join is not None:
            callback, old.awaiting_join = old.awaiting_join, None
            self._respond(
                callback, JoinResult(ErrorCode.fenced_instance_id, member_id=old.member_id)
            )
        if old.awaiting_sync is not None:
            callback, old.awaiting_sync = old.awaiting_sync, None
            self._respond(callback, SyncResult(ErrorCode.fenced_instance_id))

    # -- time -----------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """The earliest time (ms) at which :meth:`tick` has something to do, if any."""
        return next_deadline(self._groups.values())

    @answers
    def tick(self) -> None:
        """Fire every deadline that has passed, earliest first.

        Deadlines set while ticking are left to the next tick, so one tick always ends.
        """
        for deadline in due_deadlines(self._groups.values(), self._ctx.clock()):
            group = self._groups.get(deadline.group_id)
            if group is None or not still_set(group, deadline):
                continue
            if deadline.kind is TimerKind.JOIN:
                self._on_join_deadline(group)
            elif deadline.kind is TimerKind.SYNC:
                self._on_sync_deadline(group)
            elif deadline.kind is TimerKind.PENDING_MEMBER:
                del group.pending_join_members[deadline.member_id]
                self._try_complete_join(group)
            else:
                self._on_heartbeat_deadline(group, group.members[deadline.member_id])

    def _on_join_deadline(self, group: ClassicGroup) -> None:
        if not group.is_in(GroupState.PREPARING_REBALANCE):
            group.join_deadline_ms = None
            return
        delay = min(self._ctx.config.group_initial_rebalance_delay_ms, group.join_remaining_ms)
        if group.join_is_initial and group.new_member_added and delay > 0:
            # Members are still arriving at the new group: wait a little longer.
            group.new_member_added = False
            group.join_remaining_ms = max(group.join_remaining_ms - group.join_delay_ms, 0)
            group.join_delay_ms = delay
            group.join_deadline_ms = self._ctx.clock() + max(delay, 1)
            return
        self._complete_join(group)

    def _on_sync_deadline(self, group: ClassicGroup) -> None:
        group.sync_deadline_ms = None
        if group.sync_generation_id != group.generation_id:
            return
        if not group.is_in(GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        if not group.pending_sync_members:
            return
        # Members that never sent SyncGroup are gone; the others rebalance without them.
        for member_id in list(group.pending_sync_members):
            member = group.members.get(member_id)
            if member is not None:
                self._remove_member(group, member)
        self._prepare_rebalance(group)

    def _on_heartbeat_deadline(self, group: ClassicGroup, member: Member) -> None:
        waiting = member.awaiting_join is not None or member.awaiting_sync is not None
        if waiting and not member.is_new:
            # The member is waiting on the coordinator, so its silence says nothing; its
            # session restarts when it is answered.
            member.heartbeat_deadline_ms = None
            return
        self._remove_member_and_update_group(group, member)

    # -- the group's record -----------------------------------------------------------------

    def _write_group(
        self,
        group: ClassicGroup,
        assignment: dict[str, bytes],
        then: Callable[[ErrorCode], None],
    ) -> None:
        """Write the group's record; ``then`` gets the append's error once it is durable.

        ``then`` may run at once (in the request that wrote) or later, from the log: then the
        answers it queued are sent at its end, as a public method's are.
        """
        returned = False

        def written(error: ErrorCode) -> None:
            then(error)
            if returned:
                self._outbox.flush()

        self._write_records([group_metadata_record(group, assignment)], written)
        returned = True

    @staticmethod
    def _log_write_error(group: ClassicGroup, error: ErrorCode) -> None:
        if error is not ErrorCode.none:
            log.warning("writing the metadata of group %r failed: %s", group.group_id, error.name)

    # -- plumbing -------------------------------------------------------------------------

    def _create_group(self, group_id: str) -> ClassicGroup:
        group = ClassicGroup(group_id, created_ms=self._ctx.clock())
        self._groups[group_id] = group
        return group

    def _request_error(self, group_id: str, while_loading: ErrorCode) -> ErrorCode | None:
        """The answer to a request that cannot reach its group: INVALID_GROUP_ID without a
        group id, ``while_loading`` (the API's own answer) while the offsets log loads."""
        if not group_id:
            # Membership APIs need a group id; offset APIs accept "" for backward compatibility.
            return ErrorCode.invalid_group_id
        return while_loading if self._ctx.loading else None

    def _respond(self, callback: Callable[[Any], None], result: Any) -> None:
        self._outbox.respond(callback, result)
