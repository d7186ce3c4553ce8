"""The group coordinator, sans-IO: one shard composing membership and offsets.

As in Apache Kafka's GroupCoordinatorShard, two managers hold the state: the membership
(``membership.py``: classic groups, JoinGroup/SyncGroup/Heartbeat/LeaveGroup, their timers) and
the offsets (``offsets_manager.py``: OffsetCommit, TxnOffsetCommit, OffsetFetch, OffsetDelete,
expiry). Handlers that change the log return a :class:`CoordinatorResult` (records to append to
``__consumer_offsets`` and the response to send once they are durable); :meth:`replay` applies a
record to the manager it belongs to. This class keeps the one API the broker and the simulation
call, answers for the APIs that need both managers (DeleteGroups, offset expiry, replay), and
owns the loading flag both consult.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence

from kio.schema.errors import ErrorCode

from onceflow.clock import Clock
from onceflow.coordinator.result import CoordinatorResult, Record
from onceflow.groups.config import GroupCoordinatorConfig
from onceflow.groups.consumer_groups import ConsumerGroups
from onceflow.groups.consumer_messages import (
    ConsumerGroupDescription,
    HeartbeatRequest,
    HeartbeatResult,
    TopicsImage,
    TopicView,
)
from onceflow.groups.consumer_records import RECORD_TYPES as CONSUMER_GROUP_RECORD_TYPES
from onceflow.groups.consumer_records import record_type
from onceflow.groups.context import GroupContext
from onceflow.groups.errors import CoordinatorLoadInProgressError
from onceflow.groups.group import GroupState
from onceflow.groups.listing import describe_group, list_groups
from onceflow.groups.membership import Membership, WriteRecords, written_at_once

# Re-exported: the broker's handlers and the tests import these from here.
from onceflow.groups.messages import (
    GROUP_TYPE_CONSUMER,
    GroupDescription,
    GroupListing,
    JoinGroupRequest,
    JoinResult,
    LeaveMember,
    LeaveResult,
    SyncGroupRequest,
    SyncResult,
)
from onceflow.groups.offsets import OffsetStore
from onceflow.groups.offsets_manager import OffsetManager
from onceflow.groups.offsets_record import GroupMetadataKey, OffsetCommitKey, decode_key

log = logging.getLogger(__name__)


class _NoTopics:
    """No topics (callers that have no consumer groups need not pass the cluster's)."""

    def get(self, name: str) -> TopicView | None:
        return None

    def by_id(self, topic_id: uuid.UUID) -> TopicView | None:
        return None

    def __iter__(self) -> Iterator[TopicView]:
        return iter(())


NO_TOPICS: TopicsImage = _NoTopics()


def _log_leave_write(error: ErrorCode) -> None:
    if error is not ErrorCode.none:
        log.warning("writing the records of a classic member's LeaveGroup failed: %s", error.name)


class GroupCoordinator:
    """Classic groups and committed offsets of one broker (all of ``__consumer_offsets``)."""

    def __init__(
        self,
        clock: Clock,
        config: GroupCoordinatorConfig | None = None,
        *,
        loading: bool = False,
        member_id_suffix: Callable[[], str] | None = None,
        write_records: WriteRecords = written_at_once,
    ) -> None:
        """``write_records`` appends the classic groups' records (membership.py says when)."""
        self._ctx = GroupContext(clock, config or GroupCoordinatorConfig(), loading)
        self._write_records = write_records
        self._membership = Membership(
            self._ctx,
            member_id_suffix=member_id_suffix or (lambda: str(uuid.uuid4())),
            write_records=write_records,
        )
        # KIP-848 consumer groups; a group id is either a classic group or a consumer group.
        self._consumer_groups = ConsumerGroups(
            self._ctx, self._membership, write_records=write_records
        )
        self._offset_manager = OffsetManager(
            self._ctx, self._membership, consumer_groups=self._consumer_groups
        )
        # The APIs one manager answers alone are that manager's methods (see their docstrings).
        membership, offsets = self._membership, self._offset_manager
        self.group = membership.group
        self.group_ids = membership.group_ids
        self.next_deadline = membership.next_deadline
        self.tick = membership.tick
        self.commit_offsets = offsets.commit_offsets
        self.txn_commit_offsets = offsets.txn_commit_offsets
        self.fetch_offsets = offsets.fetch_offsets
        self.fetch_offsets_in_steps = offsets.fetch_offsets_in_steps
        self.delete_offsets = offsets.delete_offsets
        self.complete_transaction = offsets.complete_transaction

    def join_group(
        self,
        request: JoinGroupRequest,
        respond: Callable[[JoinResult], None],
        topics: TopicsImage | None = None,
    ) -> None:
        """JoinGroup. An empty consumer group becomes a classic group (Kafka's online downgrade
        of an empty group); a consumer group with members takes the classic member in (Kafka's
        classicGroupJoinToConsumerGroup). ``topics``: the cluster's topics (a classic member
        of a consumer group is assigned by the coordinator)."""
        if not self._consumer_groups.convert_empty_to_classic(request.group_id):
            self._consumer_groups.classic_join(request, respond, topics or NO_TOPICS)
            return
        self._membership.join_group(request, respond)

    def sync_group(
        self,
        request: SyncGroupRequest,
        respond: Callable[[SyncResult], None],
        topics: TopicsImage | None = None,
    ) -> None:
        if self._consumer_groups.group(request.group_id) is not None and request.group_id:
            respond(self._consumer_groups.classic_sync(request, topics or NO_TOPICS))
            return
        self._membership.sync_group(request, respond)

    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None = None,
    ) -> ErrorCode:
        if group_id and self._consumer_groups.group(group_id) is not None:
            return self._consumer_groups.classic_heartbeat(
                group_id, member_id, generation_id, group_instance_id
            )
        return self._membership.heartbeat(group_id, member_id, generation_id, group_instance_id)

    def leave_group_result(
        self, group_id: str, members: Sequence[LeaveMember], topics: TopicsImage | None = None
    ) -> CoordinatorResult[LeaveResult]:
        """LeaveGroup. Classic members leaving a consumer group are removed with records (to
        append before answering, as Kafka's classicGroupLeaveToConsumerGroup); a classic
        group's leave writes none."""
        if group_id and self._consumer_groups.group(group_id) is not None:
            return self._consumer_groups.classic_leave(group_id, members, topics or NO_TOPICS)
        return CoordinatorResult([], self._membership.leave_group(group_id, members))

    def leave_group(
        self, group_id: str, members: Sequence[LeaveMember], topics: TopicsImage | None = None
    ) -> LeaveResult:
        """:meth:`leave_group_result` with its records appended through ``write_records``."""
        result = self.leave_group_result(group_id, members, topics)
        if result.records:
            self._write_records(result.records, _log_leave_write)
        return result.response

    # -- KIP-848 consumer groups ------------------------------------------------------------

    def consumer_group_heartbeat(
        self, request: HeartbeatRequest, topics: TopicsImage
    ) -> CoordinatorResult[HeartbeatResult]:
        return self._consumer_groups.heartbeat(request, topics)

    def consumer_group_describe(
        self, group_ids: Iterable[str], topics: TopicsImage
    ) -> list[ConsumerGroupDescription]:
        return self._consumer_groups.describe(group_ids, topics)

    def consumer_group_next_deadline(self) -> int | None:
        return self._consumer_groups.next_deadline()

    def consumer_group_tick(self, topics: TopicsImage) -> CoordinatorResult[int]:
        """Fence consumer group members whose session or revocation timed out."""
        return self._consumer_groups.tick(topics)

    @property
    def consumer_groups(self) -> ConsumerGroups:
        return self._consumer_groups

    @property
    def config(self) -> GroupCoordinatorConfig:
        return self._ctx.config

    # -- loading --------------------------------------------------------------------------

    @property
    def loading(self) -> bool:
        return self._ctx.loading

    def begin_loading(self) -> None:
        """Answer COORDINATOR_LOAD_IN_PROGRESS until :meth:`complete_loading`."""
        self._ctx.loading = True

    def complete_loading(self) -> None:
        """The log is replayed: requests are served, the loaded members' sessions start."""
        self._ctx.loading = False
        self._membership.on_loaded()

    @property
    def offsets(self) -> OffsetStore:
        return self._offset_manager.offsets

    # -- ListGroups, DescribeGroups, DeleteGroups -----------------------------------------

    def list_groups(
        self, states: Iterable[str] | None = None, types: Iterable[str] | None = None
    ) -> list[GroupListing]:
        """Groups by state names and group types. While :attr:`loading`, Kafka answers with the
        groups loaded so far and COORDINATOR_LOAD_IN_PROGRESS; the broker adds that error."""
        listings = list_groups(self._membership.groups(), states, types)
        state_filter = {s.lower() for s in states or ()}
        type_filter = {t.lower() for t in types or ()}
        if not type_filter or GROUP_TYPE_CONSUMER in type_filter:
            for group in self._consumer_groups.groups():
                state = group.state.value
                if not state_filter or state.lower() in state_filter:
                    listings.append(
                        GroupListing(group.group_id, "consumer", state, GROUP_TYPE_CONSUMER)
                    )
        return listings

    def describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        if self._ctx.loading:
            error = ErrorCode.coordinator_load_in_progress
            return [GroupDescription(group_id, error, "") for group_id in group_ids]
        return [describe_group(gid, self._membership.group(gid)) for gid in group_ids]

    def delete_groups(self, group_ids: Iterable[str]) -> CoordinatorResult[dict[str, ErrorCode]]:
        """Delete empty groups: tombstones for their offsets and for the group itself."""
        records: list[Record] = []
        errors: dict[str, ErrorCode] = {}
        for group_id in dict.fromkeys(group_ids):
            consumer = self._consumer_groups.group(group_id)
            if consumer is not None and not self._ctx.loading:
                if consumer.is_empty():
                    records.extend(self._offset_manager.delete_all_offsets(group_id))
                    records.extend(self._consumer_groups.group_tombstones(consumer))
                    errors[group_id] = ErrorCode.none
                else:
                    errors[group_id] = ErrorCode.non_empty_group
                continue
            error = (
                ErrorCode.coordinator_load_in_progress
                if self._ctx.loading
                else self._membership.validate_delete_group(group_id)
            )
            if error is None:
                records.extend(self._offset_manager.delete_all_offsets(group_id))
                records.append(self._membership.group_tombstone(group_id))
            errors[group_id] = ErrorCode.none if error is None else error
        return CoordinatorResult(records, errors)

    # -- offset expiry --------------------------------------------------------------------

    def cleanup_expired_offsets(self) -> CoordinatorResult[int]:
        """Tombstones for offsets past ``offsets.retention.ms`` (and for empty groups left with
        no offsets); the broker runs it every ``offsets.retention.check.interval.ms``.
        The response is the number of offsets expired."""
        records: list[Record] = []
        expired_count = 0
        for group in self._membership.groups():
            before = len(records)
            all_expired = self._offset_manager.cleanup_expired_offsets(group, records)
            expired_count += len(records) - before
            if all_expired and group.is_in(GroupState.EMPTY):
                records.append(self._membership.group_tombstone(group.group_id))
        for consumer in self._consumer_groups.groups():
            before = len(records)
            all_expired = self._offset_manager.cleanup_expired_consumer_group_offsets(
                consumer.group_id, self._consumer_groups.subscribed_topics(consumer), records
            )
            expired_count += len(records) - before
            if all_expired and consumer.is_empty():
                records.extend(self._consumer_groups.group_tombstones(consumer))
        return CoordinatorResult(records, expired_count)

    # -- replay ---------------------------------------------------------------------------

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
        if record_type(key) in CONSUMER_GROUP_RECORD_TYPES:
            self._consumer_groups.replay(key, value)
            return
        decoded = decode_key(key)
        if isinstance(decoded, OffsetCommitKey):
            self._offset_manager.replay_commit(decoded, value, producer_id, transactional)
        elif isinstance(decoded, GroupMetadataKey):
            self._membership.replay_group_metadata(decoded.group, value)


__all__ = [
    "CoordinatorLoadInProgressError",
    "GroupCoordinator",
    "JoinGroupRequest",
    "JoinResult",
    "LeaveMember",
    "SyncGroupRequest",
    "SyncResult",
]
