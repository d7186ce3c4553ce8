"""KIP-848 consumer groups, sans-IO (the consumer-group part of Kafka's GroupMetadataManager).

ConsumerGroupHeartbeat follows Kafka's steps: (1) create or update the member and, when its
subscription or the subscribed topics changed, bump the group epoch; (2) when the group epoch
is ahead of the assignment epoch, compute a new target assignment with the server-side assignor;
(3) reconcile the member towards its target (``reconciliation.py``). Each step's state change is
written as Kafka's records (``consumer_records.py``), returned in a CoordinatorResult.

The records are applied as soon as they are produced (Kafka's runtime replays them at once into
its uncommitted state too), so the next request sees them; the runtime's replay of the same
records once durable is then recognised and skipped. Records read at load (or written by a
Kafka broker) are applied by the same replay. Unlike Kafka, a failed write is not rolled back.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import regex
from kio.schema.errors import ErrorCode

from onceflow.coordinator.result import CoordinatorResult, Record
from onceflow.groups import consumer_protocol
from onceflow.groups import consumer_records as cr
from onceflow.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, AssignmentMember
from onceflow.groups.consumer_group import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    Assignment,
    ConsumerGroup,
    ConsumerGroupMember,
    ConsumerGroupState,
    MemberState,
)
from onceflow.groups.consumer_messages import (
    ConsumerGroupDescription,
    DescribedMember,
    DescribedPartitions,
    HeartbeatRequest,
    HeartbeatResult,
    TopicsImage,
)
from onceflow.groups.context import GroupContext
from onceflow.groups.group import CONSUMER_PROTOCOL_TYPE, ClassicGroup, GroupState
from onceflow.groups.group_metadata_record import group_metadata_record
from onceflow.groups.membership import (
    Membership,
    WriteRecords,
    append_error_to_response_error,
    written_at_once,
)
from onceflow.groups.messages import (
    JoinGroupRequest,
    JoinResult,
    LeaveMember,
    LeaveMemberResult,
    LeaveResult,
    SyncGroupRequest,
    SyncResult,
)
from onceflow.groups.migration import (
    classic_group_from_consumer,
    common_protocol,
    consumer_group_from_classic,
    topic_ids,
    topic_names,
)
from onceflow.groups.offsets_record import GroupMetadataKey, decode_key, encode_group_metadata_key
from onceflow.groups.reconciliation import FencedMemberEpochError, reconcile

log = logging.getLogger(__name__)

# Kafka refreshes a group's regular expressions at most this often (and when one is new).
REGEX_REFRESH_INTERVAL_MS = 10_000
# Kafka matches with RE2/J, in linear time; Python's backtracking engines do not, so a
# subscription's matching gets this much CPU per refresh (the `regex` module's timeout), and a
# regular expression that needs more is refused (INVALID_REGULAR_EXPRESSION) rather than let
# it hold the event loop.
REGEX_MATCH_BUDGET_S = 0.1
# ConsumerGroupHeartbeat v1+: the client generates its member id (KIP-1082).
CONSUMER_GENERATED_MEMBER_ID_VERSION = 1


class HeartbeatError(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


@dataclass(frozen=True)
class TopicMetadata:
    topic_id: uuid.UUID
    name: str
    partitions: int


class ConsumerGroups:
    """The consumer groups of one broker: their heartbeats, timers and records."""

    def __init__(
        self,
        context: GroupContext,
        membership: Membership,
        *,
        member_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        write_records: WriteRecords = written_at_once,
    ) -> None:
        self._ctx = context
        self._membership = membership
        # Appends the records of a classic member's JoinGroup (answered once durable).
        self._write_records = write_records
        # Conversions whose records were just applied: the classic group to drop (upgrade),
        # the classic group to install (downgrade).
        self._upgrades: list[str] = []
        self._downgrades: list[tuple[ClassicGroup, bool]] = []
        self._new_member_id = member_id
        self._groups: dict[str, ConsumerGroup] = {}
        # Records applied when produced, whose replay by the runtime is still to come.
        self._applied: Counter[Record] = Counter()
        # Records produced outside a request (a group converted for a classic JoinGroup),
        # written with the next timer's records.
        self._deferred: list[Record] = []

    # -- lookups --------------------------------------------------------------------------

    def group(self, group_id: str) -> ConsumerGroup | None:
        return self._groups.get(group_id)

    def groups(self) -> list[ConsumerGroup]:
        return list(self._groups.values())

    # -- ConsumerGroupHeartbeat -----------------------------------------------------------

    def heartbeat(
        self, request: HeartbeatRequest, topics: TopicsImage
    ) -> CoordinatorResult[HeartbeatResult]:
        records: list[Record] = []
        try:
            self._validate(request)
            if self._ctx.loading:
                raise HeartbeatError(ErrorCode.coordinator_load_in_progress, "loading")
            if request.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                result = self._leave(request, records, topics)
                self._apply(records)
            else:
                result = self._heartbeat(request, records, topics)  # applies its records
        except cr.ConsumerGroupRecordError as e:
            # A name too long for the records' int16 strings (the request's compact strings
            # allow more): nothing was applied. Kafka's runtime answers a failed write so.
            return CoordinatorResult(
                [], HeartbeatResult(ErrorCode.unknown_server_error, f"cannot write: {e}")
            )
        except HeartbeatError as e:
            log.info(
                "[GroupId %s] heartbeat of member %s at epoch %d: %s (%s)",
                request.group_id,
                request.member_id,
                request.member_epoch,
                e.error.name,
                e,
            )
            return CoordinatorResult([], HeartbeatResult(e.error, str(e)))
        finally:
            # A conversion this heartbeat started and did not apply (it failed) never happens.
            self._upgrades.clear()
            self._downgrades.clear()
        return CoordinatorResult(records, result)

    def _validate(self, req: HeartbeatRequest) -> None:
        def invalid(message: str) -> HeartbeatError:
            return HeartbeatError(ErrorCode.invalid_request, message)

        if not req.group_id:
            raise invalid("GroupId can't be empty.")
        if req.instance_id == "":
            raise invalid("InstanceId can't be empty.")
        if req.rack_id == "":
            raise invalid("RackId can't be empty.")
        if req.api_version >= CONSUMER_GENERATED_MEMBER_ID_VERSION and not req.member_id:
            raise invalid("MemberId can't be empty.")
        epoch = req.member_epoch
        if epoch > 0 or epoch == LEAVE_GROUP_MEMBER_EPOCH:
            if not req.member_id:
                raise invalid("MemberId can't be empty.")
        elif epoch == 0:
            if req.rebalance_timeout_ms == -1:
                raise invalid("RebalanceTimeoutMs must be provided in first request.")
            if req.owned is None or any(req.owned.values()):
                raise invalid("TopicPartitions must be empty when (re-)joining.")
            if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
                raise invalid(
                    "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
                )
        elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            if not req.member_id:
                raise invalid("MemberId can't be empty.")
            if req.instance_id is None:
                raise invalid("InstanceId can't be null.")
        else:
            raise invalid("MemberEpoch is invalid.")
        if req.server_assignor is not None and req.server_assignor not in ASSIGNORS:
            raise HeartbeatError(
                ErrorCode.unsupported_assignor,
                f"ServerAssignor {req.server_assignor} is not supported. Supported assignors: "
                f"{', '.join(ASSIGNORS)}.",
            )
        if req.subscribed_topic_regex is not None:
            try:
                regex.compile(req.subscribed_topic_regex)
            except regex.error as e:
                raise HeartbeatError(
                    ErrorCode.invalid_regular_expression,
                    f"SubscribedTopicRegex `{req.subscribed_topic_regex}` is not a valid "
                    f"regular expression: {e}.",
                ) from None

    def _group_for(
        self, group_id: str, create: bool, records: list[Record], topics: TopicsImage
    ) -> ConsumerGroup:
        group = self._groups.get(group_id)
        if group is not None:
            return group
        classic = self._membership.group(group_id)
        if classic is not None and not classic.is_in(GroupState.DEAD):
            if create and classic.is_in(GroupState.EMPTY):
                # Kafka's online upgrade of an empty classic group: its tombstone, then the new
                # group's records; the committed offsets stay.
                records.append((encode_group_metadata_key(group_id), None))
                return ConsumerGroup(group_id)
            if create and self._validate_online_upgrade(classic):
                return self._convert_to_consumer_group(classic, records, topics)
            raise HeartbeatError(
                ErrorCode.group_id_not_found, f"Group {group_id} is not a consumer group."
            )
        if not create:
            raise HeartbeatError(
                ErrorCode.group_id_not_found, f"Consumer group {group_id} not found."
            )
        return ConsumerGroup(group_id)

    # -- online upgrade (a classic group with members) --------------------------------------

    def _validate_online_upgrade(self, classic: ClassicGroup) -> bool:
        """Kafka's validateOnlineUpgrade."""
        gid = classic.group_id
        if not self._ctx.config.migration_policy.upgrade_enabled:
            log.info("Cannot upgrade classic group %s: the online upgrade is disabled.", gid)
            return False
        if not classic.uses_consumer_protocol:
            log.info("Cannot upgrade classic group %s: it does not use the consumer protocol.", gid)
            return False
        if len(classic.members) > self._ctx.config.group_consumer_max_size:
            log.info("Cannot upgrade classic group %s: larger than group.consumer.max.size.", gid)
            return False
        return True

    def _convert_to_consumer_group(
        self, classic: ClassicGroup, records: list[Record], topics: TopicsImage
    ) -> ConsumerGroup:
        """Kafka's convertToConsumerGroup and ConsumerGroup.fromClassicGroup: each member keeps
        its subscription and last assignment, at member epoch = the generation, Stable. The
        group is built here and by the records alike; it replaces the classic group when the
        records are applied (with the heartbeat that triggered it, so a failed heartbeat
        leaves the classic group as it was)."""
        gid = classic.group_id
        try:
            group = consumer_group_from_classic(classic, topics)
        except consumer_protocol.ConsumerProtocolError as e:
            log.warning(
                "Cannot upgrade the classic group %s: the embedded consumer protocol is "
                "malformed: %s.",
                gid,
                e,
            )
            raise HeartbeatError(
                ErrorCode.group_id_not_found,
                f"Cannot upgrade the classic group {gid} to consumer group because the "
                "embedded consumer protocol is malformed.",
            ) from None
        group.metadata_hash = _metadata_hash(_subscription_metadata(group.members, {}, topics))
        # ClassicGroup.createGroupTombstoneRecords, then ConsumerGroup.createConsumerGroupRecords
        records.append((encode_group_metadata_key(gid), None))
        for m in group.members.values():
            records.append(_member_metadata_record(gid, m))
        records.append(_group_epoch_record(gid, group.group_epoch, group.metadata_hash))
        for m in group.members.values():
            records.append(_target_member_record(gid, m.member_id, m.assigned))
        records.append(_target_epoch_record(gid, group.assignment_epoch))
        for m in group.members.values():
            records.append(_current_assignment_record(gid, m))
        self._upgrades.append(gid)
        return group

    def _heartbeat(
        self, req: HeartbeatRequest, records: list[Record], topics: TopicsImage
    ) -> HeartbeatResult:
        now = self._ctx.clock()
        joining = req.member_epoch == 0
        group = self._group_for(req.group_id, joining, records, topics)
        member_id = req.member_id or self._new_member_id()
        member, replaced = self._member(group, req, member_id)
        if member_id not in group.members and len(group.members) >= self._max_size(replaced):
            raise HeartbeatError(
                ErrorCode.group_max_size_reached,
                f"The consumer group has reached its maximum capacity of "
                f"{self._ctx.config.group_consumer_max_size} members.",
            )

        # 1. The member, and the group epoch when what the assignment depends on changed.
        updated = replace(
            member,
            instance_id=req.instance_id if req.instance_id is not None else member.instance_id,
            rack_id=req.rack_id if req.rack_id is not None else member.rack_id,
            rebalance_timeout_ms=(
                req.rebalance_timeout_ms
                if req.rebalance_timeout_ms != -1
                else member.rebalance_timeout_ms
            ),
            server_assignor=(
                req.server_assignor if req.server_assignor is not None else member.server_assignor
            ),
            subscribed_topic_names=(
                tuple(req.subscribed_topic_names)
                if req.subscribed_topic_names is not None
                else member.subscribed_topic_names
            ),
            subscribed_topic_regex=(
                (req.subscribed_topic_regex or None)
                if req.subscribed_topic_regex is not None
                else member.subscribed_topic_regex
            ),
            client_id=req.client_id,
            client_host=req.client_host,
            # A member heartbeating with the consumer protocol no longer uses the classic one.
            classic=None,
        )
        reconciled = self._update_and_reconcile(
            group,
            member,
            updated,
            replaced,
            req.owned,
            records,
            topics,
            now,
            requested_regex=req.subscribed_topic_regex,
        )
        self._apply(records)
        live = self._groups[group.group_id]
        session = self._ctx.config.group_consumer_session_timeout_ms
        live.session_deadlines[member_id] = now + session
        if reconciled.state is MemberState.UNREVOKED_PARTITIONS:
            deadline = live.rebalance_deadlines.get(member_id)
            if deadline is None or deadline[1] != reconciled.member_epoch:
                timeout = max(reconciled.rebalance_timeout_ms, 0)
                live.rebalance_deadlines[member_id] = (now + timeout, reconciled.member_epoch)
        else:
            live.rebalance_deadlines.pop(member_id, None)

        full = joining or (
            req.rebalance_timeout_ms != -1
            and (req.subscribed_topic_names is not None or req.subscribed_topic_regex is not None)
            and req.owned is not None
        )
        changed = dict(reconciled.assigned) != dict(member.assigned)
        return HeartbeatResult(
            ErrorCode.none,
            member_id=member_id,
            member_epoch=reconciled.member_epoch,
            heartbeat_interval_ms=self._ctx.config.group_consumer_heartbeat_interval_ms,
            assignment=dict(reconciled.assigned) if full or changed else None,
        )

    def _update_and_reconcile(
        self,
        group: ConsumerGroup,
        member: ConsumerGroupMember,
        updated: ConsumerGroupMember,
        replaced: str | None,
        owned: Assignment | None,
        records: list[Record],
        topics: TopicsImage,
        now: int,
        *,
        requested_regex: str | None,
    ) -> ConsumerGroupMember:
        """Kafka's three steps for a member (new or updated) of either protocol: its record and
        the group epoch, the target assignment, the member's reconciliation (records added)."""
        member_id = updated.member_id
        is_new = member_id not in group.members and replaced is None
        if replaced is not None:
            # A static member back under a new member id takes the old one's place.
            records.extend(_remove_member_records(group.group_id, replaced))
        if is_new or not updated.same_metadata(member) or replaced is not None:
            records.append(_member_metadata_record(group.group_id, updated))
        bump = is_new or not updated.same_subscription(member)

        members = dict(group.members)
        if replaced is not None:
            members.pop(replaced, None)
        members[member_id] = updated
        resolved = self._refresh_regexes(
            group, members, topics, now, records, force=bump, requested=requested_regex
        )
        metadata = _subscription_metadata(members, resolved, topics)
        metadata_hash = _metadata_hash(metadata)
        group_epoch = group.group_epoch
        if bump or metadata_hash != group.metadata_hash:
            group_epoch += 1
            records.append(_group_epoch_record(group.group_id, group_epoch, metadata_hash))

        # 2. The target assignment, computed for the new group epoch.
        if group_epoch > group.assignment_epoch:
            targets = self._assign(group, members, resolved, metadata, replaced)
            for mid, target in targets.items():
                if dict(group.target_assignment.get(mid, {})) != target or mid == member_id:
                    records.append(_target_member_record(group.group_id, mid, target))
            records.append(_target_epoch_record(group.group_id, group_epoch))
            target_epoch, target = group_epoch, targets.get(member_id, {})
        else:
            target_epoch = group.assignment_epoch
            target = group.target_assignment.get(member_id, {})
            if replaced is not None:
                target = group.target_assignment.get(replaced, {})
                records.append(_target_member_record(group.group_id, member_id, target))

        # 3. The member's reconciliation towards its target. What it held before rejoining
        # with epoch 0 it has given up: those partitions are free for it.
        held = group.members.get(member_id)
        given_up = held if held is not None and held is not member else None

        def partition_epoch(topic_id: uuid.UUID, partition: int) -> int:
            if given_up is not None and (
                partition in given_up.assigned.get(topic_id, ())
                or partition in given_up.pending_revocation.get(topic_id, ())
            ):
                return -1
            return group.current_partition_epoch(topic_id, partition)

        try:
            reconciled = reconcile(updated, target_epoch, target, partition_epoch, owned)
        except FencedMemberEpochError as e:
            raise HeartbeatError(ErrorCode.fenced_member_epoch, str(e)) from None
        if reconciled != member or is_new or replaced is not None:
            records.append(_current_assignment_record(group.group_id, reconciled))

        return reconciled

    def _max_size(self, replaced: str | None) -> int:
        limit = self._ctx.config.group_consumer_max_size
        return limit + 1 if replaced is not None else limit

    def _member(
        self, group: ConsumerGroup, req: HeartbeatRequest, member_id: str
    ) -> tuple[ConsumerGroupMember, str | None]:
        """The member as it is before this heartbeat, and the member id it replaces (a static
        member rejoining under a new id)."""
        joining = req.member_epoch == 0
        if req.instance_id is None:
            member = group.members.get(member_id)
            if member is None:
                if not joining:
                    raise HeartbeatError(
                        ErrorCode.unknown_member_id,
                        f"Member {member_id} is not a member of group {group.group_id}.",
                    )
                return ConsumerGroupMember(member_id), None
            if joining:
                return _rejoined(member), None
            self._check_epoch(member, req)
            return member, None
        existing = group.static_member(req.instance_id)
        if joining:
            if existing is None:
                member = group.members.get(member_id)
                return (
                    ConsumerGroupMember(member_id) if member is None else _rejoined(member)
                ), None
            if existing.member_id == member_id:
                return _rejoined(existing), None
            if existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                raise HeartbeatError(
                    ErrorCode.unreleased_instance_id,
                    f"Static member {existing.member_id} with instance id {req.instance_id} "
                    "is not released yet.",
                )
            return (
                replace(existing, member_id=member_id, member_epoch=0, previous_member_epoch=0),
                existing.member_id,
            )
        if existing is None:
            raise HeartbeatError(
                ErrorCode.unknown_member_id, f"Instance id {req.instance_id} is unknown."
            )
        if existing.member_id != member_id:
            raise HeartbeatError(
                ErrorCode.fenced_instance_id,
                f"Static member {member_id} with instance id {req.instance_id} was fenced by "
                f"member {existing.member_id}.",
            )
        self._check_epoch(existing, req)
        return existing, None

    @staticmethod
    def _check_epoch(member: ConsumerGroupMember, req: HeartbeatRequest) -> None:
        received = req.member_epoch
        if received > member.member_epoch:
            raise HeartbeatError(
                ErrorCode.fenced_member_epoch,
                f"The consumer group member has a greater member epoch ({received}) than the "
                f"one known by the group coordinator ({member.member_epoch}). The member must "
                "abandon all its partitions and rejoin.",
            )
        # The answer with the bumped epoch may have been lost: the previous epoch is fine
        # while the member owns no more than its current assignment.
        lost_answer = received == member.previous_member_epoch and _is_subset(
            req.owned, member.assigned
        )
        if received < member.member_epoch and not lost_answer:
            raise HeartbeatError(
                ErrorCode.fenced_member_epoch,
                f"The consumer group member has a smaller member epoch ({received}) than "
                f"the one known by the group coordinator ({member.member_epoch}). The "
                "member must abandon all its partitions and rejoin.",
            )

    def _refresh_regexes(
        self,
        group: ConsumerGroup,
        members: dict[str, ConsumerGroupMember],
        topics: TopicsImage,
        now: int,
        records: list[Record],
        *,
        force: bool,
        requested: str | None = None,
    ) -> dict[str, tuple[str, ...]]:
        """The group's regular expressions resolved to topics; a record for each that changed.
        Kafka matches with RE2/J: the `regex` module agrees on the common syntax."""
        wanted = {m.subscribed_topic_regex for m in members.values() if m.subscribed_topic_regex}
        resolved = {r: t for r, t in group.resolved_regexes.items() if r in wanted}
        due = force or now - group.regex_refreshed_ms >= REGEX_REFRESH_INTERVAL_MS
        missing = wanted - set(resolved)
        if not missing and not due:
            return resolved
        names = sorted(t.name for t in topics if not t.name.startswith("__"))
        for expression in sorted(wanted if due else missing):
            try:
                matched = _matching(expression, names)
            except TimeoutError:
                if expression in resolved and expression != requested:
                    continue  # keep what it matched; the member that sent it is told
                raise HeartbeatError(
                    ErrorCode.invalid_regular_expression,
                    f"SubscribedTopicRegex `{expression}` takes more than "
                    f"{REGEX_MATCH_BUDGET_S} s to match the topics.",
                ) from None
            if group.resolved_regexes.get(expression) != matched:
                key = cr.ConsumerGroupKey(
                    cr.CONSUMER_GROUP_REGULAR_EXPRESSION, group.group_id, expression
                )
                value = cr.RegularExpressionValue(matched, 0, now)
                records.append((cr.encode_key(key), cr.encode_regular_expression(value)))
            resolved[expression] = matched
        if due:
            group.regex_refreshed_ms = now  # in memory only, as Kafka's refresh deadline
        return resolved

    def _assign(
        self,
        group: ConsumerGroup,
        members: dict[str, ConsumerGroupMember],
        resolved: dict[str, tuple[str, ...]],
        metadata: dict[str, TopicMetadata],
        replaced: str | None,
    ) -> dict[str, dict[uuid.UUID, frozenset[int]]]:
        votes = Counter(m.server_assignor for m in members.values() if m.server_assignor)
        name = votes.most_common(1)[0][0] if votes else DEFAULT_ASSIGNOR
        inputs = {}
        for mid, m in members.items():
            names = set(m.subscribed_topic_names)
            if m.subscribed_topic_regex:
                names.update(resolved.get(m.subscribed_topic_regex, ()))
            previous_id = replaced if mid not in group.members and replaced else mid
            inputs[mid] = AssignmentMember(
                frozenset(metadata[n].topic_id for n in names if n in metadata),
                group.target_assignment.get(previous_id, {}),
            )
        partitions = {t.topic_id: t.partitions for t in metadata.values()}
        return ASSIGNORS[name].assign(inputs, partitions)

    # -- leaving and fencing --------------------------------------------------------------

    def _leave(
        self, req: HeartbeatRequest, records: list[Record], topics: TopicsImage
    ) -> HeartbeatResult:
        group = self._groups.get(req.group_id)
        if group is None:
            raise HeartbeatError(
                ErrorCode.group_id_not_found, f"Consumer group {req.group_id} not found."
            )
        if req.instance_id is None:
            member = group.members.get(req.member_id)
            if member is None:
                raise HeartbeatError(
                    ErrorCode.unknown_member_id,
                    f"Member {req.member_id} is not a member of group {group.group_id}.",
                )
        else:
            member = group.static_member(req.instance_id)
            if member is None:
                raise HeartbeatError(
                    ErrorCode.unknown_member_id, f"Instance id {req.instance_id} is unknown."
                )
            if member.member_id != req.member_id:
                raise HeartbeatError(
                    ErrorCode.fenced_instance_id,
                    f"Static member {req.member_id} with instance id {req.instance_id} was "
                    f"fenced by member {member.member_id}.",
                )
            if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                # It keeps its place (and target assignment) for its session timeout.
                left = replace(
                    member, member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH, pending_revocation={}
                )
                records.append(_current_assignment_record(group.group_id, left))
                return HeartbeatResult(
                    ErrorCode.none,
                    member_id=member.member_id,
                    member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH,
                )
        records.extend(self._fence_records(group, member.member_id, topics))
        return HeartbeatResult(
            ErrorCode.none, member_id=req.member_id, member_epoch=req.member_epoch
        )

    def _fence_records(
        self, group: ConsumerGroup, member_id: str, topics: TopicsImage
    ) -> list[Record]:
        """The member removed (its three records' tombstones) and the group epoch bumped; or,
        when only classic members are left and the policy allows, the group downgraded."""
        if self._validate_online_downgrade(group, member_id):
            return self._convert_to_classic_group(group, member_id, topics)
        records = _remove_member_records(group.group_id, member_id)
        members = {mid: m for mid, m in group.members.items() if mid != member_id}
        resolved = {
            r: t
            for r, t in group.resolved_regexes.items()
            if any(m.subscribed_topic_regex == r for m in members.values())
        }
        metadata_hash = _metadata_hash(_subscription_metadata(members, resolved, topics))
        records.append(_group_epoch_record(group.group_id, group.group_epoch + 1, metadata_hash))
        return records

    # -- online downgrade (only classic members left) -------------------------------------

    def _validate_online_downgrade(self, group: ConsumerGroup, leaving: str) -> bool:
        """Kafka's validateOnlineDowngradeWithFencedMember."""
        others = [m for mid, m in group.members.items() if mid != leaving]
        left = group.members.get(leaving)
        if left is None or left.uses_classic_protocol:
            return False
        if not others or not all(m.uses_classic_protocol for m in others):
            return False
        if not self._ctx.config.migration_policy.downgrade_enabled:
            log.info(
                "Cannot downgrade consumer group %s to classic group: the online downgrade is "
                "disabled.",
                group.group_id,
            )
            return False
        if len(others) > self._ctx.config.group_max_size:
            log.info(
                "Cannot downgrade consumer group %s: larger than group.max.size.", group.group_id
            )
            return False
        return common_protocol(others)

    def _can_downgrade_after_join(self, group: ConsumerGroup) -> bool:
        """Kafka's validateOnlineDowngradeWithReplacedMemberId, once the joining classic
        member has replaced the (last) consumer-protocol one."""
        members = list(group.members.values())
        return (
            all(m.uses_classic_protocol for m in members)
            and self._ctx.config.migration_policy.downgrade_enabled
            and len(members) <= self._ctx.config.group_max_size
            and common_protocol(members)
        )

    def _convert_to_classic_group(
        self,
        group: ConsumerGroup,
        leaving: str | None,
        topics: TopicsImage,
        *,
        rebalance: bool = True,
    ) -> list[Record]:
        """Kafka's convertToClassicGroup and ClassicGroup.fromConsumerGroup: the consumer
        group's tombstones and the classic group's record, in one append; the classic group,
        Stable at generation = the group epoch with each member's target assignment, replaces
        the consumer group when the records are applied, and rebalances so the members
        rejoin (not when a joining static member triggered it, as in Kafka)."""
        gid = group.group_id
        classic, assignment = classic_group_from_consumer(group, leaving, topics, self._ctx.clock())
        records: list[Record] = []
        for mid in group.members:
            records.extend(_remove_member_records(gid, mid))
        records.extend(self.group_tombstones(group))
        records.append(group_metadata_record(classic, assignment))
        self._downgrades.append((classic, rebalance))
        log.info("[GroupId %s] downgrading the consumer group to a classic group.", gid)
        return records

    # -- classic members in a consumer group (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) --

    def classic_join(
        self,
        req: JoinGroupRequest,
        respond: Callable[[JoinResult], None],
        topics: TopicsImage,
    ) -> None:
        """Kafka's classicGroupJoinToConsumerGroup: the member joins (or rejoins) as any
        member does (its subscription and owned partitions from its protocol metadata) and is
        answered, once the records are durable, with generation = its member epoch and no
        member list: every classic member of a consumer group is a follower."""
        group = self._groups[req.group_id]
        member_id = req.member_id or self._new_member_id()
        records: list[Record] = []
        try:
            if self._ctx.loading:
                raise HeartbeatError(ErrorCode.coordinator_load_in_progress, "loading")
            cfg = self._ctx.config
            if not (
                cfg.group_min_session_timeout_ms
                <= req.session_timeout_ms
                <= cfg.group_max_session_timeout_ms
            ):
                # Kafka's GroupCoordinatorService checks it for every JoinGroup.
                raise HeartbeatError(ErrorCode.invalid_session_timeout, "session timeout")
            if req.member_id not in group.members and len(group.members) >= self._max_size(None):
                raise HeartbeatError(
                    ErrorCode.group_max_size_reached,
                    f"The consumer group has reached its maximum capacity of "
                    f"{self._ctx.config.group_consumer_max_size} members.",
                )
            names = {n for n, _ in req.protocols}
            if not group.supports_classic_protocols(req.protocol_type, names):
                raise HeartbeatError(
                    ErrorCode.inconsistent_group_protocol,
                    f"Member {member_id}'s protocols are not supported.",
                )
            if not req.member_id and req.require_known_member_id and not req.group_instance_id:
                respond(JoinResult(ErrorCode.member_id_required, member_id=member_id))
                return
            member, replaced = self._classic_member(group, req, member_id)
            try:
                subscription = consumer_protocol.decode_subscription(bytes(req.protocols[0][1]))
            except consumer_protocol.ConsumerProtocolError as e:
                # Kafka's deserializeSubscription throws IllegalStateException here, which its
                # runtime answers as UNKNOWN_SERVER_ERROR; nothing changes.
                raise HeartbeatError(
                    ErrorCode.unknown_server_error,
                    f"Malformed embedded consumer protocol in subscription deserialization: {e}.",
                ) from None
            rebalance_timeout = (
                req.rebalance_timeout_ms
                if req.rebalance_timeout_ms >= 0
                else req.session_timeout_ms
            )
            updated = replace(
                member,
                instance_id=(
                    req.group_instance_id
                    if req.group_instance_id is not None
                    else member.instance_id
                ),
                rack_id=subscription.rack_id or member.rack_id,
                rebalance_timeout_ms=rebalance_timeout,
                server_assignor=None,
                subscribed_topic_names=subscription.topics,
                subscribed_topic_regex=None,
                client_id=req.client_id,
                client_host=req.client_host,
                classic=cr.ClassicMemberMetadata(
                    req.session_timeout_ms, tuple((n, bytes(m)) for n, m in req.protocols)
                ),
            )
            owned = topic_ids(subscription.owned_partitions, topics)
            now = self._ctx.clock()
            reconciled = self._update_and_reconcile(
                group, member, updated, replaced, owned, records, topics, now, requested_regex=None
            )
        except cr.ConsumerGroupRecordError as e:
            log.info(
                "[GroupId %s] classic join of %s: cannot write: %s", req.group_id, member_id, e
            )
            respond(JoinResult(ErrorCode.unknown_server_error, member_id=req.member_id))
            return
        except HeartbeatError as e:
            log.info(
                "[GroupId %s] classic join of member %s: %s (%s)",
                req.group_id,
                member_id,
                e.error.name,
                e,
            )
            respond(JoinResult(e.error, member_id=req.member_id))
            return
        replaced_consumer = replaced is not None and group.members[replaced].classic is None
        self._apply(records)
        live_group = self._groups.get(req.group_id)
        if (
            replaced_consumer
            and live_group is not None
            and self._can_downgrade_after_join(live_group)
        ):
            # Kafka's validateOnlineDowngradeWithReplacedMemberId: the last consumer-protocol
            # member came back as a classic one; the group becomes classic, no rebalance.
            conversion = self._convert_to_classic_group(live_group, None, topics, rebalance=False)
            self._apply(conversion)
            records.extend(conversion)
        result = JoinResult(
            ErrorCode.none,
            member_id=member_id,
            generation_id=reconciled.member_epoch,
            protocol_type=CONSUMER_PROTOCOL_TYPE,
            protocol_name=req.protocols[0][0],
        )
        gid = req.group_id

        def written(error: ErrorCode) -> None:
            live = self._groups.get(gid)
            if error is not ErrorCode.none:
                respond(JoinResult(append_error_to_response_error(error), member_id=member_id))
                return
            if live is not None and member_id in live.members:
                at = self._ctx.clock()
                live.join_deadlines.pop(member_id, None)
                live.session_deadlines[member_id] = at + req.session_timeout_ms
                live.sync_deadlines[member_id] = at + max(rebalance_timeout, 0)
            respond(result)

        self._write_records(records, written)

    def _classic_member(
        self, group: ConsumerGroup, req: JoinGroupRequest, member_id: str
    ) -> tuple[ConsumerGroupMember, str | None]:
        """The joining classic member as it is now (new, or as it was: a classic member keeps
        its epoch and assignment across its JoinGroups), and the member id it replaces: a
        static member restarted (unknown member id, known instance id) takes its old place,
        epoch and assignment, as in Kafka, without a rebalance, whichever protocol the old
        one used."""
        if req.group_instance_id is not None:
            existing = group.static_member(req.group_instance_id)
            if existing is not None and existing.member_id != member_id:
                if req.member_id:
                    raise HeartbeatError(
                        ErrorCode.fenced_instance_id,
                        f"Static member {member_id} with instance id {req.group_instance_id} "
                        f"is fenced by member {existing.member_id}.",
                    )
                return replace(existing, member_id=member_id), existing.member_id
        member = group.members.get(member_id)
        if member is None:
            # New, or a member id the group no longer knows (fenced meanwhile): it joins anew.
            return ConsumerGroupMember(member_id), None
        if member.classic is None:
            raise HeartbeatError(
                ErrorCode.unknown_member_id,
                f"Member {member_id} does not use the classic protocol.",
            )
        return member, None

    def _classic_member_of(
        self, group: ConsumerGroup, member_id: str, instance_id: str | None
    ) -> ConsumerGroupMember:
        """Kafka's validateConsumerGroupMember and throwIfMemberDoesNotUseClassicProtocol."""
        if instance_id is not None:
            static = group.static_member(instance_id)
            if static is None:
                raise HeartbeatError(
                    ErrorCode.unknown_member_id, f"Instance id {instance_id} is unknown."
                )
            if static.member_id != member_id:
                raise HeartbeatError(
                    ErrorCode.fenced_instance_id,
                    f"Static member {member_id} with instance id {instance_id} is fenced.",
                )
        member = group.members.get(member_id)
        if member is None or member.classic is None:
            raise HeartbeatError(
                ErrorCode.unknown_member_id,
                f"Member {member_id} is not a classic member of group {group.group_id}.",
            )
        return member

    def _rejoin_needed(self, group: ConsumerGroup, member: ConsumerGroupMember) -> bool:
        """The classic member must rejoin: the group epoch moved, it has partitions to revoke,
        or the partitions it waits for are free."""
        return (
            member.member_epoch < group.group_epoch
            or member.state is MemberState.UNREVOKED_PARTITIONS
            or (
                member.state is MemberState.UNRELEASED_PARTITIONS
                and not group.waiting_on_unreleased_partition(member)
            )
        )

    def _schedule_join_deadline(self, group: ConsumerGroup, member: ConsumerGroupMember) -> None:
        deadline = self._ctx.clock() + max(member.rebalance_timeout_ms, 0)
        group.join_deadlines.setdefault(member.member_id, deadline)

    def classic_sync(self, req: SyncGroupRequest, topics: TopicsImage) -> SyncResult:
        """Kafka's classicGroupSyncToConsumerGroup: the member's current assignment, as a
        ConsumerProtocolAssignment of its subscription's version."""
        group = self._groups[req.group_id]
        try:
            if self._ctx.loading:
                raise HeartbeatError(ErrorCode.rebalance_in_progress, "loading")
            member = self._classic_member_of(group, req.member_id, req.group_instance_id)
            assert member.classic is not None
            if req.generation_id != member.member_epoch:
                raise HeartbeatError(ErrorCode.illegal_generation, "generation != member epoch")
            protocol_name = member.classic.supported_protocols[0][0]
            if (req.protocol_type is not None and req.protocol_type != CONSUMER_PROTOCOL_TYPE) or (
                req.protocol_name is not None and req.protocol_name != protocol_name
            ):
                raise HeartbeatError(ErrorCode.inconsistent_group_protocol, "protocol mismatch")
            if (
                group.group_epoch > member.member_epoch
                and member.state is not MemberState.UNREVOKED_PARTITIONS
            ):
                self._schedule_join_deadline(group, member)
                raise HeartbeatError(ErrorCode.rebalance_in_progress, "rejoin to catch up")
        except HeartbeatError as e:
            return SyncResult(e.error)
        now = self._ctx.clock()
        group.sync_deadlines.pop(member.member_id, None)
        group.session_deadlines[member.member_id] = now + member.classic.session_timeout_ms
        try:
            at_version = consumer_protocol.version(member.classic.supported_protocols[0][1])
        except consumer_protocol.ConsumerProtocolError:
            at_version = 0
        assignment = consumer_protocol.encode_assignment(
            topic_names(member.assigned, topics), at_version
        )
        return SyncResult(ErrorCode.none, req.protocol_type, req.protocol_name, assignment)

    def classic_heartbeat(
        self, group_id: str, member_id: str, generation_id: int, instance_id: str | None
    ) -> ErrorCode:
        """Kafka's classicGroupHeartbeatToConsumerGroup."""
        group = self._groups[group_id]
        if self._ctx.loading:
            return ErrorCode.none
        try:
            member = self._classic_member_of(group, member_id, instance_id)
        except HeartbeatError as e:
            return e.error
        assert member.classic is not None
        if generation_id != member.member_epoch:
            return ErrorCode.illegal_generation
        group.session_deadlines[member_id] = self._ctx.clock() + member.classic.session_timeout_ms
        if self._rejoin_needed(group, member):
            self._schedule_join_deadline(group, member)
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def classic_leave(
        self, group_id: str, members: Sequence[LeaveMember], topics: TopicsImage
    ) -> CoordinatorResult[LeaveResult]:
        """Kafka's classicGroupLeaveToConsumerGroup: each valid member removed, the group
        epoch bumped once."""
        group = self._groups[group_id]
        if self._ctx.loading:
            return CoordinatorResult([], LeaveResult(ErrorCode.coordinator_load_in_progress))
        results = []
        leaving: list[str] = []
        for m in members:
            try:
                if m.group_instance_id is None:
                    member = self._classic_member_of(group, m.member_id, None)
                else:
                    static = group.static_member(m.group_instance_id)
                    if static is None:
                        raise HeartbeatError(ErrorCode.unknown_member_id, "unknown instance id")
                    if m.member_id and static.member_id != m.member_id:
                        raise HeartbeatError(ErrorCode.fenced_instance_id, "fenced")
                    if static.classic is None:
                        raise HeartbeatError(ErrorCode.unknown_member_id, "not classic")
                    member = static
            except HeartbeatError as e:
                results.append(LeaveMemberResult(m.member_id, m.group_instance_id, e.error))
                continue
            if member.member_id not in leaving:
                leaving.append(member.member_id)
            results.append(LeaveMemberResult(member.member_id, m.group_instance_id, ErrorCode.none))
        records: list[Record] = []
        if leaving:
            for mid in leaving:
                records.extend(_remove_member_records(group_id, mid))
            rest = {mid: m for mid, m in group.members.items() if mid not in leaving}
            resolved = {
                r: t
                for r, t in group.resolved_regexes.items()
                if any(m.subscribed_topic_regex == r for m in rest.values())
            }
            metadata_hash = _metadata_hash(_subscription_metadata(rest, resolved, topics))
            records.append(_group_epoch_record(group_id, group.group_epoch + 1, metadata_hash))
            self._apply(records)
        return CoordinatorResult(records, LeaveResult(ErrorCode.none, tuple(results)))

    # -- timers ---------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        deadlines = [
            d
            for g in self._groups.values()
            for d in (
                *g.session_deadlines.values(),
                *(d for d, _ in g.rebalance_deadlines.values()),
                *g.join_deadlines.values(),
                *g.sync_deadlines.values(),
            )
        ]
        return min(deadlines, default=None)

    def tick(self, topics: TopicsImage) -> CoordinatorResult[int]:
        """Fence the members whose session or revocation timed out; the response is how many.
        Also writes the records produced outside a request."""
        if self._ctx.loading:
            return CoordinatorResult([], 0)
        now = self._ctx.clock()
        records, self._deferred = self._deferred, []
        fenced = 0
        session = self._ctx.config.group_consumer_session_timeout_ms
        for group in list(self._groups.values()):
            for member_id, m in list(group.members.items()):
                # After a load, sessions restart from now, as Kafka schedules them.
                group.session_deadlines.setdefault(member_id, now + m.session_timeout_ms(session))
            for member_id, deadline in list(group.session_deadlines.items()):
                expired = deadline <= now
                revoke = group.rebalance_deadlines.get(member_id)
                member = group.members.get(member_id)
                if member is None:
                    group.session_deadlines.pop(member_id, None)
                    continue
                if revoke is not None and revoke[0] <= now and member.member_epoch == revoke[1]:
                    expired = True
                # A classic member that did not rejoin, or sync, within its rebalance timeout.
                for classic_deadline in (group.join_deadlines, group.sync_deadlines):
                    if classic_deadline.get(member_id, now + 1) <= now:
                        expired = True
                if expired:
                    new = self._fence_records(group, member_id, topics)
                    self._apply(new)
                    records.extend(new)
                    fenced += 1
        return CoordinatorResult(records, fenced)

    # -- classic JoinGroup on a consumer group --------------------------------------------

    def convert_empty_to_classic(self, group_id: str) -> bool:
        """Kafka's online downgrade of an empty consumer group for a classic JoinGroup: the
        group's tombstones (written with the next timer's records). False if it has members."""
        group = self._groups.get(group_id)
        if group is None:
            return True
        if not group.is_empty():
            return False
        records = self.group_tombstones(group)
        self._apply(records)
        self._deferred.extend(records)
        return True

    def group_tombstones(self, group: ConsumerGroup) -> list[Record]:
        gid = group.group_id
        records: list[Record] = []
        for expression in group.resolved_regexes:
            key = cr.ConsumerGroupKey(cr.CONSUMER_GROUP_REGULAR_EXPRESSION, gid, expression)
            records.append((cr.encode_key(key), None))
        for kind in (cr.CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA, cr.CONSUMER_GROUP_METADATA):
            records.append((cr.encode_key(cr.ConsumerGroupKey(kind, gid)), None))
        return records

    # -- offsets --------------------------------------------------------------------------

    @staticmethod
    def subscribed_topics(group: ConsumerGroup) -> set[str]:
        """The topics the group's members subscribe to (by name, or by regex as resolved)."""
        names: set[str] = set()
        for member in group.members.values():
            names.update(member.subscribed_topic_names)
            if member.subscribed_topic_regex:
                names.update(group.resolved_regexes.get(member.subscribed_topic_regex, ()))
        return names

    def validate_offset_commit(
        self,
        group: ConsumerGroup,
        member_id: str,
        instance_id: str | None,
        member_epoch: int,
        *,
        transactional: bool,
        api_version: int | None,
    ) -> ErrorCode | None:
        """Kafka's ConsumerGroup.validateOffsetCommit: a commit is fenced by member epoch."""
        del instance_id  # Kafka does not check it for consumer groups
        if member_epoch < 0 and group.is_empty():
            return None
        if transactional and member_epoch == -1 and member_id == "":
            return None
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if member.uses_classic_protocol:
            # A classic member commits with its generation (= its member epoch), any version.
            if member_epoch != member.member_epoch:
                return ErrorCode.illegal_generation
            return None
        if not transactional and api_version is not None and api_version < 9:
            return ErrorCode.unsupported_version
        if member_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return None

    # -- DescribeGroups / ListGroups / DeleteGroups ---------------------------------------

    def describe(
        self, group_ids: Iterable[str], topics: TopicsImage
    ) -> list[ConsumerGroupDescription]:
        out = []
        for group_id in group_ids:
            group = self._groups.get(group_id)
            if self._ctx.loading:
                out.append(
                    ConsumerGroupDescription(group_id, ErrorCode.coordinator_load_in_progress)
                )
                continue
            if group is None:
                classic = self._membership.group(group_id)
                message = (
                    f"Group {group_id} is not a consumer group."
                    if classic is not None
                    else f"Group {group_id} not found."
                )
                out.append(
                    ConsumerGroupDescription(group_id, ErrorCode.group_id_not_found, message)
                )
                continue
            votes = Counter(m.server_assignor for m in group.members.values() if m.server_assignor)
            members = tuple(
                DescribedMember(
                    member_id=m.member_id,
                    instance_id=m.instance_id,
                    rack_id=m.rack_id,
                    member_epoch=m.member_epoch,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    subscribed_topic_names=m.subscribed_topic_names,
                    subscribed_topic_regex=m.subscribed_topic_regex,
                    assignment=_described(m.assigned, topics),
                    target_assignment=_described(
                        group.target_assignment.get(m.member_id, {}), topics
                    ),
                    state=m.state.name,
                    member_type=0 if m.uses_classic_protocol else 1,
                )
                for m in group.members.values()
            )
            out.append(
                ConsumerGroupDescription(
                    group_id,
                    ErrorCode.none,
                    state=group.state.value,
                    group_epoch=group.group_epoch,
                    assignment_epoch=group.assignment_epoch,
                    assignor_name=votes.most_common(1)[0][0] if votes else DEFAULT_ASSIGNOR,
                    members=members,
                )
            )
        return out

    # -- replay ---------------------------------------------------------------------------

    def _apply(self, records: list[Record]) -> None:
        for key, value in records:
            if cr.record_type(key) in cr.RECORD_TYPES:
                self._applied[(key, value)] += 1
                self._replay(key, value)
            elif value is None:
                self._membership.replay_group_tombstone(_classic_group_id(key))
        self._complete_conversions()

    def _complete_conversions(self) -> None:
        """After a conversion's records are applied: the classic group it replaces goes
        (upgrade), or the classic group it builds comes in (downgrade)."""
        now = self._ctx.clock()
        session = self._ctx.config.group_consumer_session_timeout_ms
        while self._upgrades:
            gid = self._upgrades.pop(0)
            self._membership.drop_upgraded_group(gid)
            group = self._groups.get(gid)
            if group is not None:
                for mid, m in group.members.items():
                    group.session_deadlines.setdefault(mid, now + m.session_timeout_ms(session))
        while self._downgrades:
            classic, rebalance = self._downgrades.pop(0)
            self._membership.adopt_downgraded_group(classic, rebalance=rebalance)

    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one consumer group record read from the log (or written by the runtime: those
        already applied when produced are skipped once)."""
        applied = self._applied.get((key, value), 0)
        if applied:
            if applied == 1:
                del self._applied[(key, value)]
            else:
                self._applied[(key, value)] = applied - 1
            return
        self._replay(key, value)

    def _replay(self, key: bytes, value: bytes | None) -> None:
        k = cr.decode_key(key)
        group = self._groups.get(k.group_id)
        if group is None:
            if value is None or k.record_type == cr.CONSUMER_GROUP_PARTITION_METADATA:
                return
            group = self._groups[k.group_id] = ConsumerGroup(k.group_id)
        kind = k.record_type
        if kind == cr.CONSUMER_GROUP_METADATA:
            if value is None:
                if group.is_empty():
                    del self._groups[k.group_id]
                return
            meta = cr.decode_group_metadata(value)
            group.group_epoch, group.metadata_hash = meta.epoch, meta.metadata_hash
        elif kind == cr.CONSUMER_GROUP_MEMBER_METADATA:
            if value is None:
                group.remove_member(k.name)
                return
            v = cr.decode_member_metadata(value)
            old = group.members.get(k.name) or ConsumerGroupMember(k.name)
            group.put_member(
                replace(
                    old,
                    instance_id=v.instance_id,
                    rack_id=v.rack_id,
                    client_id=v.client_id,
                    client_host=v.client_host,
                    subscribed_topic_names=v.subscribed_topic_names,
                    subscribed_topic_regex=v.subscribed_topic_regex,
                    rebalance_timeout_ms=v.rebalance_timeout_ms,
                    server_assignor=v.server_assignor,
                    classic=v.classic,
                )
            )
        elif kind == cr.CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA:
            group.assignment_epoch = (
                0 if value is None else cr.decode_target_assignment_metadata(value)
            )
        elif kind == cr.CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER:
            if value is None:
                group.target_assignment.pop(k.name, None)
            else:
                group.target_assignment[k.name] = cr.decode_target_assignment_member(value)
        elif kind == cr.CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT:
            old = group.members.get(k.name)
            if old is None:
                if value is None:
                    return
                old = ConsumerGroupMember(k.name)
            if value is None:
                group.put_member(
                    replace(
                        old,
                        member_epoch=LEAVE_GROUP_MEMBER_EPOCH,
                        previous_member_epoch=LEAVE_GROUP_MEMBER_EPOCH,
                        state=MemberState.STABLE,
                        assigned={},
                        pending_revocation={},
                    )
                )
                return
            v = cr.decode_current_assignment(value)
            try:
                state = MemberState(v.state)
            except ValueError:
                state = MemberState.UNKNOWN
            group.put_member(
                replace(
                    old,
                    member_epoch=v.member_epoch,
                    previous_member_epoch=v.previous_member_epoch,
                    state=state,
                    assigned=v.assigned,
                    pending_revocation=v.pending_revocation,
                )
            )
        elif kind == cr.CONSUMER_GROUP_REGULAR_EXPRESSION:
            if value is None:
                group.resolved_regexes.pop(k.name, None)
            else:
                group.resolved_regexes[k.name] = cr.decode_regular_expression(value).topics


# -- helpers -------------------------------------------------------------------------------


def _matching(expression: str, names: list[str]) -> tuple[str, ...]:
    """The topic names the expression matches whole; TimeoutError past the CPU budget."""
    pattern = regex.compile(expression)
    deadline = time.monotonic() + REGEX_MATCH_BUDGET_S
    matched = []
    for name in names:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(expression)
        if pattern.fullmatch(name, timeout=left):
            matched.append(name)
    return tuple(matched)


def _rejoined(member: ConsumerGroupMember) -> ConsumerGroupMember:
    """A member that rejoins with epoch 0 has given up its partitions; its target stays."""
    return replace(
        member,
        member_epoch=0,
        previous_member_epoch=0,
        state=MemberState.STABLE,
        assigned={},
        pending_revocation={},
    )


def _is_subset(owned: Assignment | None, assigned: Assignment) -> bool:
    if owned is None:
        return False
    return all(ps <= assigned.get(t, frozenset()) for t, ps in owned.items())


def _subscription_metadata(
    members: dict[str, ConsumerGroupMember],
    resolved: dict[str, tuple[str, ...]],
    topics: TopicsImage,
) -> dict[str, TopicMetadata]:
    names: set[str] = set()
    for m in members.values():
        names.update(m.subscribed_topic_names)
        if m.subscribed_topic_regex:
            names.update(resolved.get(m.subscribed_topic_regex, ()))
    out = {}
    for name in names:
        topic = topics.get(name)
        if topic is not None:
            out[name] = TopicMetadata(topic.topic_id, name, len(topic.partitions))
    return out


def _metadata_hash(metadata: dict[str, TopicMetadata]) -> int:
    """A stable hash of the subscribed topics (ids and partition counts). Kafka 4.1+ keeps
    such a hash in the group's record; this is not Kafka's function, so a group loaded by a
    Kafka broker rebalances once."""
    if not metadata:
        return 0
    text = ";".join(f"{m.topic_id}:{m.name}:{m.partitions}" for _, m in sorted(metadata.items()))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big", signed=True)


def _described(assignment: Assignment, topics: TopicsImage) -> tuple[DescribedPartitions, ...]:
    out = []
    for topic_id, partitions in sorted(assignment.items(), key=lambda item: str(item[0])):
        topic = topics.by_id(topic_id)
        out.append(
            DescribedPartitions(topic_id, topic.name if topic else "", tuple(sorted(partitions)))
        )
    return tuple(out)


def _classic_group_id(key: bytes) -> str:
    decoded = decode_key(key)
    return decoded.group if isinstance(decoded, GroupMetadataKey) else ""


def _member_metadata_record(group_id: str, m: ConsumerGroupMember) -> Record:
    key = cr.ConsumerGroupKey(cr.CONSUMER_GROUP_MEMBER_METADATA, group_id, m.member_id)
    value = cr.MemberMetadataValue(
        m.instance_id,
        m.rack_id,
        m.client_id,
        m.client_host,
        m.subscribed_topic_names,
        m.subscribed_topic_regex,
        m.rebalance_timeout_ms,
        m.server_assignor,
        m.classic,
    )
    return cr.encode_key(key), cr.encode_member_metadata(value)


def _group_epoch_record(group_id: str, epoch: int, metadata_hash: int) -> Record:
    key = cr.ConsumerGroupKey(cr.CONSUMER_GROUP_METADATA, group_id)
    return cr.encode_key(key), cr.encode_group_metadata(cr.GroupMetadataValue(epoch, metadata_hash))


def _target_epoch_record(group_id: str, epoch: int) -> Record:
    key = cr.ConsumerGroupKey(cr.CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA, group_id)
    return cr.encode_key(key), cr.encode_target_assignment_metadata(epoch)


def _target_member_record(group_id: str, member_id: str, target: Assignment) -> Record:
    key = cr.ConsumerGroupKey(cr.CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER, group_id, member_id)
    return cr.encode_key(key), cr.encode_target_assignment_member(target)


def _current_assignment_record(group_id: str, m: ConsumerGroupMember) -> Record:
    key = cr.ConsumerGroupKey(cr.CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT, group_id, m.member_id)
    value = cr.CurrentAssignmentValue(
        m.member_epoch, m.previous_member_epoch, int(m.state), m.assigned, m.pending_revocation
    )
    return cr.encode_key(key), cr.encode_current_assignment(value)


def _remove_member_records(group_id: str, member_id: str) -> list[Record]:
    return [
        (cr.encode_key(cr.ConsumerGroupKey(kind, group_id, member_id)), None)
        for kind in (
            cr.CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT,
            cr.CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
            cr.CONSUMER_GROUP_MEMBER_METADATA,
        )
    ]


__all__ = ["ConsumerGroupState", "ConsumerGroups", "HeartbeatError"]
