"""The group coordinator, sans-IO: classic membership protocol and committed offsets.

Membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) follows Apache Kafka's classic group
coordinator. It lives in memory only and is not persisted: after a restart clients rejoin.
JoinGroup and SyncGroup may have to wait for other members; they take a ``respond`` callback
that is called exactly once, possibly later (from another request or from :meth:`tick`).
Callbacks run only after the coordinator's state is consistent again, at the end of the call
that produced them.

Committed offsets follow Kafka's coordinator-runtime model: a handler validates the request and
returns the records to write with the response (:class:`CoordinatorResult`); the broker appends
the records to ``__consumer_offsets``, makes them durable, calls :meth:`replay` for each, and
only then answers. State changes only in :meth:`replay` and :meth:`complete_transaction`, so
loading after a restart (replaying the log from the start) rebuilds the same offsets.

Time comes from the injected clock; the broker calls :meth:`tick` periodically (~100 ms) and
at :meth:`next_deadline` to expire sessions, rebalances and pending members.
"""

from __future__ import annotations

import functools
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.clock import Clock
from onceflow.coordinator_result import CoordinatorResult, Record
from onceflow.groups.config import GroupCoordinatorConfig
from onceflow.groups.group import ClassicGroup, GroupState, Member, Protocols
from onceflow.groups.offsets import (
    OffsetAndMetadata,
    OffsetFetchEntry,
    OffsetStore,
    TopicPartition,
)
from onceflow.groups.offsets_record import (
    GroupMetadataKey,
    OffsetCommitKey,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_offset_commit_key,
    encode_offset_commit_value,
)

GROUP_TYPE_CLASSIC = "classic"

P = ParamSpec("P")
R = TypeVar("R")


class GroupCoordinatorError(Exception):
    """An error of the coordinator that maps onto one Kafka error code."""

    error_code: ErrorCode = ErrorCode.unknown_server_error


class CoordinatorLoadInProgressError(GroupCoordinatorError):
    """The offsets log is still being replayed; the client should retry."""

    error_code = ErrorCode.coordinator_load_in_progress


class CoordinatorStateError(RuntimeError):
    """The coordinator reached a state its own rules exclude: a bug, never a client error."""


# -- requests and results ------------------------------------------------------------------


@dataclass(frozen=True)
class JoinGroupRequest:
    """A JoinGroup request, any version (the broker fills the fields its version has)."""

    group_id: str
    member_id: str
    protocol_type: str
    protocols: Sequence[tuple[str, bytes]]
    session_timeout_ms: int
    # v0 has none: -1 means "same as the session timeout", as Kafka does for v0.
    rebalance_timeout_ms: int = -1
    group_instance_id: str | None = None
    reason: str | None = None
    client_id: str = ""
    client_host: str = ""
    # v4+: a new dynamic member first gets MEMBER_ID_REQUIRED with its id, then rejoins (KIP-394).
    require_known_member_id: bool = False
    # v9+: a static leader rejoining a Stable group is told to skip the assignment (KIP-814).
    supports_skip_assignment: bool = False


@dataclass(frozen=True)
class JoinGroupMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    # Only the leader gets the members (with their metadata for the selected protocol).
    members: tuple[JoinGroupMember, ...] = ()


@dataclass(frozen=True)
class SyncGroupRequest:
    """A SyncGroup request, any version; the leader sends the assignments."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignments: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True)
class LeaveMember:
    """One member of a LeaveGroup request (v0-v2 carry a single member id)."""

    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class LeaveMemberResult:
    member_id: str
    group_instance_id: str | None
    error: ErrorCode


@dataclass(frozen=True)
class LeaveResult:
    """Top-level error and one result per member. For v0-v2 the broker answers the single
    member's error as the top-level error, as Kafka does."""

    error: ErrorCode
    members: tuple[LeaveMemberResult, ...] = ()


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = GROUP_TYPE_CLASSIC


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupDescription:
    """A DescribeGroups entry. An unknown group is state Dead with GROUP_ID_NOT_FOUND; brokers
    answering DescribeGroups v0-v5 turn that error into NONE, as Kafka does."""

    group_id: str
    error: ErrorCode
    state: str
    protocol_type: str = ""
    protocol_data: str = ""
    members: tuple[MemberDescription, ...] = ()


def _answers(
    method: Callable[Concatenate[GroupCoordinator, P], R],
) -> Callable[Concatenate[GroupCoordinator, P], R]:
    """Run the callbacks a public method queued, once the method has finished its changes."""

    @functools.wraps(method)
    def wrapper(self: GroupCoordinator, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        finally:
            self._flush()

    return wrapper


class GroupCoordinator:
    """Classic groups and committed offsets of one broker (all of ``__consumer_offsets``)."""

    def __init__(
        self,
        clock: Clock,
        config: GroupCoordinatorConfig | None = None,
        *,
        loading: bool = False,
        member_id_suffix: Callable[[], str] | None = None,
    ) -> None:
        self._clock = clock
        self.config = config or GroupCoordinatorConfig()
        self._loading = loading
        self._member_id_suffix = member_id_suffix or (lambda: str(uuid.uuid4()))
        self._groups: dict[str, ClassicGroup] = {}
        self._offsets = OffsetStore()
        self._outbox: deque[tuple[Callable[[Any], None], Any]] = deque()
        self._flushing = False

    # -- loading --------------------------------------------------------------------------

    @property
    def loading(self) -> bool:
        return self._loading

    def begin_loading(self) -> None:
        """Answer COORDINATOR_LOAD_IN_PROGRESS until :meth:`complete_loading`."""
        self._loading = True

    def complete_loading(self) -> None:
        self._loading = False

    # -- introspection --------------------------------------------------------------------

    def group(self, group_id: str) -> ClassicGroup | None:
        return self._groups.get(group_id)

    def group_ids(self) -> list[str]:
        return list(self._groups)

    @property
    def offsets(self) -> OffsetStore:
        return self._offsets

    # -- JoinGroup ------------------------------------------------------------------------

    @_answers
    def join_group(self, request: JoinGroupRequest, respond: Callable[[JoinResult], None]) -> None:
        req = request
        error = self._check_group_id(req.group_id)
        if error is None and self._loading:
            error = ErrorCode.coordinator_load_in_progress
        if error is not None:
            self._respond(respond, JoinResult(error, member_id=req.member_id))
            return
        cfg = self.config
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
        max_size = self.config.group_max_size
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
            deadline = self._clock() + req.session_timeout_ms
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
        member.heartbeat_deadline_ms = self._clock() + self.config.new_member_join_timeout_ms
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
        self._schedule_heartbeat(member)
        self._update_member(member, req, respond)

        if group.is_in(GroupState.STABLE):
            if group.select_protocol() == group.protocol_name:
                # Nothing the assignment depends on changed: hand the member its new id within
                # the current generation, without a rebalance.
                is_leader = group.is_leader(new_member_id)
                if req.supports_skip_assignment:
                    result = self._join_result(group, member, leader_view=True, skip=is_leader)
                else:
                    # Older clients are told the previous leader id, so a rejoining static
                    # leader does not compute an assignment that a Stable group would ignore.
                    result = JoinResult(
                        ErrorCode.none,
                        member_id=new_member_id,
                        generation_id=group.generation_id,
                        protocol_type=group.protocol_type,
                        protocol_name=group.protocol_name,
                        leader=current_leader or "",
                    )
                self._complete_join_callback(member, result)
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
        now = self._clock()
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            # Members waiting on SyncGroup must rejoin instead.
            self._reset_and_propagate_assignment_error(group, ErrorCode.rebalance_in_progress)
        group.pending_sync_members.clear()
        group.sync_deadline_ms = None
        if group.is_in(GroupState.EMPTY):
            # group.initial.rebalance.delay.ms: let more members of a new group arrive before
            # the first generation, extended while they keep arriving (up to the rebalance
            # timeout).
            delay = self.config.group_initial_rebalance_delay_ms
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
        now = self._clock()
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
            return
        for member in group.members.values():
            self._complete_join_callback(member, self._join_result(group, member, leader_view=True))
            self._schedule_heartbeat(member)
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
            self._schedule_heartbeat(member)

    # -- SyncGroup ------------------------------------------------------------------------

    @_answers
    def sync_group(self, request: SyncGroupRequest, respond: Callable[[SyncResult], None]) -> None:
        req = request
        error = self._check_group_id(req.group_id)
        if error is None and self._loading:
            # The rebalance state was lost with the restart: have the member rejoin.
            error = ErrorCode.rebalance_in_progress
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
                for m in group.members.values():
                    m.assignment = bytes(req.assignments.get(m.member_id, b""))
                self._propagate_assignment(group, ErrorCode.none)
                group.transition_to(GroupState.STABLE, self._clock())
        elif group.is_in(GroupState.STABLE):
            self._remove_pending_sync_member(group, member.member_id)
            self._respond(
                respond,
                SyncResult(
                    ErrorCode.none, group.protocol_type, group.protocol_name, member.assignment
                ),
            )
            self._schedule_heartbeat(member)
        else:
            raise CoordinatorStateError(
                f"SyncGroup reached group {group.group_id!r} in {group.state}"
            )

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

    @_answers
    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None = None,
    ) -> ErrorCode:
        error = self._check_group_id(group_id)
        if error is not None:
            return error
        if self._loading:
            # Kafka answers blindly while loading; the member learns more on its next request.
            return ErrorCode.none
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
        self._schedule_heartbeat(group.members[member_id])
        if group.is_in(GroupState.PREPARING_REBALANCE):
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def _schedule_heartbeat(self, member: Member) -> None:
        member.heartbeat_deadline_ms = self._clock() + member.session_timeout_ms

    # -- LeaveGroup -----------------------------------------------------------------------

    @_answers
    def leave_group(self, group_id: str, members: Sequence[LeaveMember]) -> LeaveResult:
        error = self._check_group_id(group_id)
        if error is None and self._loading:
            error = ErrorCode.coordinator_load_in_progress
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

    # -- ListGroups, DescribeGroups, DeleteGroups -----------------------------------------

    def list_groups(
        self, states: Iterable[str] | None = None, types: Iterable[str] | None = None
    ) -> list[GroupListing]:
        """Groups, filtered by state names and group types (case-insensitive; empty = all).

        All groups here are classic groups, whatever their protocol type ("consumer",
        "connect", ...). While :attr:`loading`, Kafka answers with the groups loaded so far
        and COORDINATOR_LOAD_IN_PROGRESS; the broker adds that error.
        """
        state_filter = {s.lower() for s in states or ()}
        type_filter = {t.lower() for t in types or ()}
        if type_filter and GROUP_TYPE_CLASSIC not in type_filter:
            return []
        return [
            GroupListing(g.group_id, g.protocol_type or "", g.state.value)
            for g in self._groups.values()
            if not state_filter or g.state.value.lower() in state_filter
        ]

    def describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        out = []
        for group_id in group_ids:
            if self._loading:
                out.append(GroupDescription(group_id, ErrorCode.coordinator_load_in_progress, ""))
                continue
            group = self._groups.get(group_id)
            if group is None or group.is_in(GroupState.DEAD):
                out.append(
                    GroupDescription(group_id, ErrorCode.group_id_not_found, GroupState.DEAD.value)
                )
                continue
            stable = group.is_in(GroupState.STABLE)
            members = tuple(
                MemberDescription(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.metadata(group.protocol_name) if stable else b"",
                    m.assignment if stable else b"",
                )
                for m in group.members.values()
            )
            out.append(
                GroupDescription(
                    group_id,
                    ErrorCode.none,
                    group.state.value,
                    protocol_type=group.protocol_type or "",
                    protocol_data=(group.protocol_name or "") if stable else "",
                    members=members,
                )
            )
        return out

    def delete_groups(self, group_ids: Iterable[str]) -> CoordinatorResult[dict[str, ErrorCode]]:
        """Delete empty groups: tombstones for their offsets and for the group itself."""
        records: list[Record] = []
        errors: dict[str, ErrorCode] = {}
        for group_id in dict.fromkeys(group_ids):
            if self._loading:
                errors[group_id] = ErrorCode.coordinator_load_in_progress
                continue
            group = self._groups.get(group_id)
            if group is None or group.is_in(GroupState.DEAD):
                errors[group_id] = ErrorCode.group_id_not_found
            elif not group.is_in(GroupState.EMPTY):
                errors[group_id] = ErrorCode.non_empty_group
            else:
                partitions = set(self._offsets.committed(group_id))
                partitions |= self._offsets.pending_partitions(group_id)
                records.extend(self._tombstone(group_id, tp) for tp in sorted(partitions))
                records.append((encode_group_metadata_key(group_id), None))
                errors[group_id] = ErrorCode.none
        return CoordinatorResult(records, errors)

    # -- offsets: handlers ----------------------------------------------------------------

    def commit_offsets(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        *,
        retention_time_ms: int = -1,
        api_version: int | None = None,
    ) -> CoordinatorResult[dict[TopicPartition, ErrorCode]]:
        """OffsetCommit. ``retention_time_ms`` is v2-v4's field (-1: broker default);
        ``api_version`` >= 9 answers GROUP_ID_NOT_FOUND instead of ILLEGAL_GENERATION for an
        unknown group with a generation."""
        if self._loading:
            return self._fail_all(offsets, ErrorCode.coordinator_load_in_progress)
        group = self._groups.get(group_id)
        if group is None:
            # No group: only a commit outside group management (admin tools, assign()) is
            # accepted; it creates a "simple" group when replayed.
            if generation_id >= 0:
                version_9 = api_version is not None and api_version >= 9
                error = ErrorCode.group_id_not_found if version_9 else ErrorCode.illegal_generation
                return self._fail_all(offsets, error)
        else:
            error = self._validate_offset_commit(
                group, generation_id, member_id, group_instance_id, transactional=False
            )
            if error is not None:
                return self._fail_all(offsets, error)
            member = group.members.get(member_id)
            if member is not None and group.is_in(
                GroupState.STABLE, GroupState.PREPARING_REBALANCE
            ):
                # A commit proves the member is alive, as a heartbeat does.
                self._schedule_heartbeat(member)
        now = self._clock()
        expire = None if retention_time_ms < 0 else now + retention_time_ms
        return self._offset_records(group_id, offsets, now, expire)

    def txn_commit_offsets(
        self,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> CoordinatorResult[dict[TopicPartition, ErrorCode]]:
        """TxnOffsetCommit. The broker writes the records as a transactional batch of
        ``producer_id``/``producer_epoch`` and replays them with ``transactional=True``: they
        stay pending until the transaction's marker (:meth:`complete_transaction`).

        KIP-447 fencing (v3+ carry the group metadata): an unknown group with a generation is
        ILLEGAL_GENERATION; a member no longer in the group UNKNOWN_MEMBER_ID (or
        FENCED_INSTANCE_ID for a replaced static member); a stale generation ILLEGAL_GENERATION.
        """
        del transactional_id, producer_id, producer_epoch  # identify the batch, not validated here
        if self._loading:
            return self._fail_all(offsets, ErrorCode.coordinator_load_in_progress)
        group = self._groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                return self._fail_all(offsets, ErrorCode.illegal_generation)
        else:
            error = self._validate_offset_commit(
                group, generation_id, member_id, group_instance_id, transactional=True
            )
            if error is not None:
                return self._fail_all(offsets, error)
        return self._offset_records(group_id, offsets, self._clock(), None)

    @staticmethod
    def _validate_offset_commit(
        group: ClassicGroup,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        *,
        transactional: bool,
    ) -> ErrorCode | None:
        if group.is_in(GroupState.DEAD):
            return ErrorCode.coordinator_not_available
        if generation_id < 0 and group.is_in(GroupState.EMPTY):
            # Generation -1: a commit outside group management, fine while nobody is a member.
            return None
        if generation_id >= 0 or member_id != "" or group_instance_id is not None:
            error = group.validate_member(member_id, group_instance_id)
            if error is not None:
                return error
            if generation_id != group.generation_id:
                return ErrorCode.illegal_generation
        elif not transactional and not group.is_in(GroupState.EMPTY):
            # Only members commit for a group with members. TxnOffsetCommit v0-v2 carry no
            # member information, so this does not apply to them.
            return ErrorCode.unknown_member_id
        if not transactional and group.is_in(GroupState.COMPLETING_REBALANCE):
            # The member has its new generation but not its assignment yet.
            return ErrorCode.rebalance_in_progress
        return None

    def _offset_records(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        now_ms: int,
        expire_ms: int | None,
    ) -> CoordinatorResult[dict[TopicPartition, ErrorCode]]:
        records: list[Record] = []
        response: dict[TopicPartition, ErrorCode] = {}
        limit = self.config.offset_metadata_max_bytes
        for tp, value in offsets.items():
            if len(value.metadata.encode("utf-8")) > limit:
                response[tp] = ErrorCode.offset_metadata_too_large
                continue
            stored = OffsetAndMetadata(
                offset=value.offset,
                leader_epoch=value.leader_epoch,
                metadata=value.metadata,
                commit_timestamp_ms=now_ms,
                expire_timestamp_ms=expire_ms,
            )
            key = encode_offset_commit_key(group_id, tp[0], tp[1])
            records.append((key, encode_offset_commit_value(stored)))
            response[tp] = ErrorCode.none
        return CoordinatorResult(records, response)

    @staticmethod
    def _fail_all(
        offsets: Mapping[TopicPartition, OffsetAndMetadata], error: ErrorCode
    ) -> CoordinatorResult[dict[TopicPartition, ErrorCode]]:
        return CoordinatorResult([], dict.fromkeys(offsets, error))

    def fetch_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition] | None,
        require_stable: bool = False,
    ) -> dict[TopicPartition, OffsetFetchEntry]:
        """OffsetFetch: committed offsets (offset -1 when none); ``partitions`` None = all.

        With ``require_stable`` a partition with pending transactional offsets answers
        UNSTABLE_OFFSET_COMMIT (the client retries until the transaction completes).
        Raises CoordinatorLoadInProgressError while loading (a group-level error).
        """
        if self._loading:
            raise CoordinatorLoadInProgressError(f"offsets of {group_id!r} are loading")
        group = self._groups.get(group_id)
        committed = {} if group is None else self._offsets.committed(group_id)
        wanted = sorted(committed) if partitions is None else list(partitions)
        out: dict[TopicPartition, OffsetFetchEntry] = {}
        for tp in wanted:
            if require_stable and self._offsets.has_pending(group_id, tp):
                out[tp] = OffsetFetchEntry(error=ErrorCode.unstable_offset_commit)
                continue
            value = committed.get(tp)
            if value is None:
                out[tp] = OffsetFetchEntry()
            else:
                out[tp] = OffsetFetchEntry(value.offset, value.leader_epoch, value.metadata)
        return out

    def delete_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> CoordinatorResult[tuple[ErrorCode, dict[TopicPartition, ErrorCode]]]:
        """OffsetDelete: allowed for empty groups, and for topics a consumer group does not
        subscribe to (GROUP_SUBSCRIBED_TO_TOPIC otherwise)."""
        if self._loading:
            return CoordinatorResult([], (ErrorCode.coordinator_load_in_progress, {}))
        group = self._groups.get(group_id)
        if group is None or group.is_in(GroupState.DEAD):
            return CoordinatorResult([], (ErrorCode.group_id_not_found, {}))
        if not group.is_in(GroupState.EMPTY) and not group.uses_consumer_protocol:
            return CoordinatorResult([], (ErrorCode.non_empty_group, {}))
        records: list[Record] = []
        errors: dict[TopicPartition, ErrorCode] = {}
        check_subscription = not group.is_in(GroupState.EMPTY)
        for tp in dict.fromkeys(partitions):
            if check_subscription and group.is_subscribed_to_topic(tp[0]):
                errors[tp] = ErrorCode.group_subscribed_to_topic
                continue
            if self._offsets.get(group_id, tp) is not None or self._offsets.has_pending(
                group_id, tp
            ):
                records.append(self._tombstone(group_id, tp))
            errors[tp] = ErrorCode.none
        return CoordinatorResult(records, (ErrorCode.none, errors))

    def cleanup_expired_offsets(self) -> CoordinatorResult[int]:
        """Tombstones for offsets past ``offsets.retention.ms`` (and for empty groups left with
        no offsets); the broker runs it every ``offsets.retention.check.interval.ms``.
        The response is the number of offsets expired."""
        now = self._clock()
        retention = self.config.offsets_retention_ms
        records: list[Record] = []
        expired_count = 0
        for group_id, group in self._groups.items():
            all_expired = True
            base = self._expiration_base(group)
            for tp, value in sorted(self._offsets.committed(group_id).items()):
                if base is None or (
                    group.is_in(GroupState.STABLE) and group.is_subscribed_to_topic(tp[0])
                ):
                    all_expired = False
                    continue
                if value.expire_timestamp_ms is not None:
                    expired = now >= value.expire_timestamp_ms
                else:
                    expired = now - base(value) >= retention
                if expired and not self._offsets.has_pending(group_id, tp):
                    records.append(self._tombstone(group_id, tp))
                    expired_count += 1
                else:
                    all_expired = False
            if (
                all_expired
                and group.is_in(GroupState.EMPTY)
                and not self._offsets.has_open_transactions(group_id)
            ):
                records.append((encode_group_metadata_key(group_id), None))
        return CoordinatorResult(records, expired_count)

    @staticmethod
    def _expiration_base(group: ClassicGroup) -> Callable[[OffsetAndMetadata], int] | None:
        """From when an offset's retention counts, per Kafka's rules; None: never expires."""
        if group.protocol_type is None:
            # A simple group (commits only): from the last commit.
            return lambda value: value.commit_timestamp_ms
        if group.is_in(GroupState.EMPTY):
            # From when the group became empty.
            return lambda value: group.state_timestamp_ms
        if (
            group.uses_consumer_protocol
            and group.is_in(GroupState.STABLE)
            and group.subscribed_topics() is not None
        ):
            # Topics no member subscribes to any more: from the last commit.
            return lambda value: value.commit_timestamp_ms
        return None

    @staticmethod
    def _tombstone(group_id: str, tp: TopicPartition) -> Record:
        return (encode_offset_commit_key(group_id, tp[0], tp[1]), None)

    # -- offsets: replay ------------------------------------------------------------------

    def replay(
        self,
        key: bytes,
        value: bytes | None,
        producer_id: int = -1,
        producer_epoch: int = -1,
        transactional: bool = False,
    ) -> None:
        """Apply one record of ``__consumer_offsets`` (written now, or read back at load).

        Raises OffsetsRecordError for a record that cannot be decoded.
        """
        del producer_epoch  # the marker identifies the transaction by producer id alone
        decoded = decode_key(key)
        if isinstance(decoded, OffsetCommitKey):
            tp = (decoded.topic, decoded.partition)
            if value is None:
                self._offsets.replay_commit(decoded.group, tp, None)
                return
            offset = decode_offset_commit_value(value)
            if decoded.group not in self._groups:
                self._create_group(decoded.group)
            self._offsets.replay_commit(decoded.group, tp, offset, producer_id, transactional)
        elif isinstance(decoded, GroupMetadataKey):
            if value is not None:
                # Membership is not persisted here; a value written by Kafka is skipped on purpose.
                return
            group = self._groups.get(decoded.group)
            # A member may have joined between DeleteGroups and this replay: keep that group.
            if group is not None and group.is_in(GroupState.EMPTY):
                group.transition_to(GroupState.DEAD, self._clock())
                del self._groups[decoded.group]

    def state_batches(self) -> list[tuple[list[Record], int | None]]:
        """Records that replay to the current offsets, for rewriting the log: runs of plain
        records (producer id None) and of one open transaction's records (its producer id,
        written as that producer's transactional batch so that its marker still applies)."""
        batches: list[tuple[list[Record], int | None]] = []
        for group_id, tp, value, producer_id in self._offsets.entries():
            record = (
                encode_offset_commit_key(group_id, tp[0], tp[1]),
                encode_offset_commit_value(value),
            )
            if batches and batches[-1][1] == producer_id:
                batches[-1][0].append(record)
            else:
                batches.append(([record], producer_id))
        return batches

    def complete_transaction(self, producer_id: int, committed: bool) -> None:
        """Replay a transaction marker on the offsets log: COMMIT makes the producer's pending
        offsets visible, ABORT drops them."""
        self._offsets.replay_end_transaction(producer_id, committed)

    # -- time -----------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """The earliest time (ms) at which :meth:`tick` has something to do, if any."""
        deadlines: list[int] = []
        for group in self._groups.values():
            if group.join_deadline_ms is not None:
                deadlines.append(group.join_deadline_ms)
            if group.sync_deadline_ms is not None:
                deadlines.append(group.sync_deadline_ms)
            deadlines.extend(group.pending_join_members.values())
            deadlines.extend(
                m.heartbeat_deadline_ms
                for m in group.members.values()
                if m.heartbeat_deadline_ms is not None
            )
        return min(deadlines, default=None)

    @_answers
    def tick(self) -> None:
        """Fire every deadline that has passed, earliest first.

        Deadlines set while ticking are left to the next tick, so one tick always ends.
        """
        now = self._clock()
        due: list[tuple[int, int, str, str]] = []
        for group in self._groups.values():
            gid = group.group_id
            if group.join_deadline_ms is not None and group.join_deadline_ms <= now:
                due.append((group.join_deadline_ms, 0, gid, ""))
            if group.sync_deadline_ms is not None and group.sync_deadline_ms <= now:
                due.append((group.sync_deadline_ms, 1, gid, ""))
            for member_id, deadline in group.pending_join_members.items():
                if deadline <= now:
                    due.append((deadline, 2, gid, member_id))
            for member in group.members.values():
                deadline = member.heartbeat_deadline_ms
                if deadline is not None and deadline <= now:
                    due.append((deadline, 3, gid, member.member_id))
        due.sort()
        for deadline, kind, group_id, member_id in due:
            group = self._groups.get(group_id)
            if group is None:
                continue
            if kind == 0 and group.join_deadline_ms == deadline:
                self._on_join_deadline(group)
            elif kind == 1 and group.sync_deadline_ms == deadline:
                self._on_sync_deadline(group)
            elif kind == 2 and group.pending_join_members.get(member_id) == deadline:
                del group.pending_join_members[member_id]
                self._try_complete_join(group)
            elif kind == 3:
                member = group.members.get(member_id)
                if member is not None and member.heartbeat_deadline_ms == deadline:
                    self._on_heartbeat_deadline(group, member)

    def _on_join_deadline(self, group: ClassicGroup) -> None:
        if not group.is_in(GroupState.PREPARING_REBALANCE):
            group.join_deadline_ms = None
            return
        delay = min(self.config.group_initial_rebalance_delay_ms, group.join_remaining_ms)
        if group.join_is_initial and group.new_member_added and delay > 0:
            # Members are still arriving at the new group: wait a little longer.
            group.new_member_added = False
            group.join_remaining_ms = max(group.join_remaining_ms - group.join_delay_ms, 0)
            group.join_delay_ms = delay
            group.join_deadline_ms = self._clock() + max(delay, 1)
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

    # -- plumbing -------------------------------------------------------------------------

    def _create_group(self, group_id: str) -> ClassicGroup:
        group = ClassicGroup(group_id, created_ms=self._clock())
        self._groups[group_id] = group
        return group

    @staticmethod
    def _check_group_id(group_id: str) -> ErrorCode | None:
        # Membership APIs need a group id; offset APIs accept "" for backward compatibility.
        return ErrorCode.invalid_group_id if not group_id else None

    def _respond(self, callback: Callable[[Any], None], result: Any) -> None:
        self._outbox.append((callback, result))

    def _flush(self) -> None:
        if self._flushing:
            return  # a callback called back into the coordinator: the outer flush continues
        self._flushing = True
        try:
            while self._outbox:
                callback, result = self._outbox.popleft()
                callback(result)
        finally:
            self._flushing = False


__all__ = [
    "CoordinatorLoadInProgressError",
    "CoordinatorResult",
    "CoordinatorStateError",
    "GroupCoordinator",
    "GroupCoordinatorError",
    "GroupDescription",
    "GroupListing",
    "JoinGroupMember",
    "JoinGroupRequest",
    "JoinResult",
    "LeaveMember",
    "LeaveMemberResult",
    "LeaveResult",
    "MemberDescription",
    "OffsetAndMetadata",
    "OffsetFetchEntry",
    "Protocols",
    "SyncGroupRequest",
    "SyncResult",
]
