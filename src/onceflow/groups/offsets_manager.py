"""Committed offsets, sans-IO (Kafka's OffsetMetadataManager).

Committed offsets follow Kafka's coordinator-runtime model: a handler validates the request and
returns the records to write with the response (:class:`CoordinatorResult`); the broker appends
the records to ``__consumer_offsets``, makes them durable, replays each, and only then answers.
State changes only on replay (:meth:`OffsetManager.replay_commit`) and on a transaction marker
(:meth:`OffsetManager.complete_transaction`), so loading after a restart (replaying the log
from the start) rebuilds the same offsets.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from onceflow.coordinator.result import CoordinatorResult, Record
from onceflow.groups.context import GroupContext
from onceflow.groups.errors import CoordinatorLoadInProgressError, MemberFencedError
from onceflow.groups.group import ClassicGroup, GroupState
from onceflow.groups.membership import Membership
from onceflow.groups.offsets import (
    OffsetAndMetadata,
    OffsetFetchEntry,
    OffsetStore,
    TopicPartition,
)
from onceflow.groups.offsets_record import (
    OffsetCommitKey,
    decode_offset_commit_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
)
from onceflow.records.saturating import saturated_add

if TYPE_CHECKING:
    from onceflow.groups.consumer_groups import ConsumerGroups


class OffsetManager:
    """Committed and pending transactional offsets of every group (all of
    ``__consumer_offsets``); groups are looked up in, and created by, the membership."""

    def __init__(
        self,
        context: GroupContext,
        membership: Membership,
        *,
        consumer_groups: ConsumerGroups | None = None,
    ) -> None:
        self._ctx = context
        self._membership = membership
        # KIP-848 groups: their commits are fenced by member epoch instead of generation.
        self._consumer_groups = consumer_groups
        self._offsets = OffsetStore()

    def _consumer_group_error(
        self,
        group_id: str,
        member_epoch: int,
        member_id: str,
        group_instance_id: str | None,
        *,
        transactional: bool,
        api_version: int | None,
    ) -> ErrorCode | bool | None:
        """False when ``group_id`` is not a consumer group, else the commit's error (or None)."""
        group = None if self._consumer_groups is None else self._consumer_groups.group(group_id)
        if group is None or self._consumer_groups is None:
            return False
        return self._consumer_groups.validate_offset_commit(
            group,
            member_id,
            group_instance_id,
            member_epoch,
            transactional=transactional,
            api_version=api_version,
        )

    def _is_consumer_group(self, group_id: str) -> bool:
        return (
            self._consumer_groups is not None and self._consumer_groups.group(group_id) is not None
        )

    @property
    def offsets(self) -> OffsetStore:
        return self._offsets

    # -- handlers -------------------------------------------------------------------------

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
        if self._ctx.loading:
            return self._fail_all(offsets, ErrorCode.coordinator_load_in_progress)
        consumer_error = self._consumer_group_error(
            group_id,
            generation_id,
            member_id,
            group_instance_id,
            transactional=False,
            api_version=api_version,
        )
        group = None if consumer_error is not False else self._membership.group(group_id)
        if consumer_error is not False:
            if consumer_error is not None:
                return self._fail_all(offsets, consumer_error)
        elif group is None:
            # No group: only a commit outside group management (admin tools, assign()) is
            # accepted; it creates a "simple" group when replayed.
            if generation_id >= 0:
                version_9 = api_version is not None and api_version >= 9
                error = ErrorCode.group_id_not_found if version_9 else ErrorCode.illegal_generation
                return self._fail_all(offsets, error)
        else:
            error = group.validate_offset_commit(
                generation_id, member_id, group_instance_id, transactional=False
            )
            if error is not None:
                return self._fail_all(offsets, error)
            member = group.members.get(member_id)
            if member is not None and group.is_in(
                GroupState.STABLE, GroupState.PREPARING_REBALANCE
            ):
                # A commit proves the member is alive, as a heartbeat does.
                self._membership.schedule_heartbeat(member)
        now = self._ctx.clock()
        # stored as an int64: a retention of Long.MAX_VALUE saturates, still "never"
        expire = None if retention_time_ms < 0 else saturated_add(now, retention_time_ms)
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
        if self._ctx.loading:
            return self._fail_all(offsets, ErrorCode.coordinator_load_in_progress)
        consumer_error = self._consumer_group_error(
            group_id,
            generation_id,
            member_id,
            group_instance_id,
            transactional=True,
            api_version=None,
        )
        if consumer_error is not False:
            if consumer_error is not None:
                return self._fail_all(offsets, consumer_error)
            return self._offset_records(group_id, offsets, self._ctx.clock(), None)
        group = self._membership.group(group_id)
        if group is None:
            if generation_id >= 0:
                return self._fail_all(offsets, ErrorCode.illegal_generation)
        else:
            error = group.validate_offset_commit(
                generation_id, member_id, group_instance_id, transactional=True
            )
            if error is not None:
                return self._fail_all(offsets, error)
        return self._offset_records(group_id, offsets, self._ctx.clock(), None)

    def _offset_records(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        now_ms: int,
        expire_ms: int | None,
    ) -> CoordinatorResult[dict[TopicPartition, ErrorCode]]:
        records: list[Record] = []
        response: dict[TopicPartition, ErrorCode] = {}
        limit = self._ctx.config.offset_metadata_max_bytes
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
        steps = self.fetch_offsets_in_steps(group_id, partitions, require_stable)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]

    def fetch_offsets_in_steps(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition] | None,
        require_stable: bool = False,
        member_id: str | None = None,
        member_epoch: int = -1,
    ) -> Generator[None, None, dict[TopicPartition, OffsetFetchEntry]]:
        """:meth:`fetch_offsets`, one step per partition, so that a caller may do other work
        between steps (a request naming 200,000 partitions): the answer is the group's offsets
        as they were at the first step, one snapshot, as Kafka reads them.

        v9+ name the member: a KIP-848 member must be at its member epoch (Kafka's
        ConsumerGroup.validateOffsetFetch), else MemberFencedError."""
        if self._ctx.loading:
            raise CoordinatorLoadInProgressError(f"offsets of {group_id!r} are loading")
        consumer = None if self._consumer_groups is None else self._consumer_groups.group(group_id)
        if consumer is not None and (member_id is not None or member_epoch >= 0):
            member = consumer.members.get(member_id or "")
            if member is None:
                raise MemberFencedError(
                    ErrorCode.unknown_member_id, f"{member_id} is not a member of {group_id}"
                )
            if member.member_epoch != member_epoch:
                raise MemberFencedError(
                    ErrorCode.stale_member_epoch,
                    f"epoch {member_epoch} of {member_id} is not its epoch {member.member_epoch}",
                )
        group = self._membership.group(group_id)
        known = group is not None or self._is_consumer_group(group_id)
        committed = self._offsets.committed(group_id) if known else {}  # a copy
        pending = self._offsets.pending_partitions(group_id) if require_stable else set()
        wanted = sorted(committed) if partitions is None else list(partitions)
        out: dict[TopicPartition, OffsetFetchEntry] = {}
        unstable = OffsetFetchEntry(error=ErrorCode.unstable_offset_commit)
        for tp in wanted:
            value = committed.get(tp)
            if tp in pending:
                out[tp] = unstable
            elif value is None:
                out[tp] = OffsetFetchEntry()
            else:
                out[tp] = OffsetFetchEntry(value.offset, value.leader_epoch, value.metadata)
            yield
        return out

    def delete_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> CoordinatorResult[tuple[ErrorCode, dict[TopicPartition, ErrorCode]]]:
        """OffsetDelete: allowed for empty groups, and for topics a consumer group does not
        subscribe to (GROUP_SUBSCRIBED_TO_TOPIC otherwise)."""
        if self._ctx.loading:
            return CoordinatorResult([], (ErrorCode.coordinator_load_in_progress, {}))
        group = self._membership.group(group_id)
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

    def delete_all_offsets(self, group_id: str) -> list[Record]:
        """Tombstones for every offset of a group, committed or pending (DeleteGroups)."""
        partitions = set(self._offsets.committed(group_id))
        partitions |= self._offsets.pending_partitions(group_id)
        return [self._tombstone(group_id, tp) for tp in sorted(partitions)]

    def cleanup_expired_offsets(self, group: ClassicGroup, records: list[Record]) -> bool:
        """Append tombstones for the group's offsets past ``offsets.retention.ms``; True when
        none is left (and no transaction holds pending offsets), so the group may go too."""
        now = self._ctx.clock()
        retention = self._ctx.config.offsets_retention_ms
        group_id = group.group_id
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
            else:
                all_expired = False
        return all_expired and not self._offsets.has_open_transactions(group_id)

    def cleanup_expired_consumer_group_offsets(
        self, group_id: str, subscribed: set[str], records: list[Record]
    ) -> bool:
        """As :meth:`cleanup_expired_offsets` for a KIP-848 group (Kafka's ConsumerGroup
        expiration condition): retention counts from each commit, and the offsets of topics a
        member subscribes to do not expire."""
        now = self._ctx.clock()
        retention = self._ctx.config.offsets_retention_ms
        all_expired = True
        for tp, value in sorted(self._offsets.committed(group_id).items()):
            if tp[0] in subscribed:
                all_expired = False
                continue
            if value.expire_timestamp_ms is not None:
                expired = now >= value.expire_timestamp_ms
            else:
                expired = now - value.commit_timestamp_ms >= retention
            if expired and not self._offsets.has_pending(group_id, tp):
                records.append(self._tombstone(group_id, tp))
            else:
                all_expired = False
        return all_expired and not self._offsets.has_open_transactions(group_id)

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

    # -- replay ---------------------------------------------------------------------------

    def replay_commit(
        self,
        key: OffsetCommitKey,
        value: bytes | None,
        producer_id: int = -1,
        transactional: bool = False,
    ) -> None:
        """Apply one OffsetCommit record (None value: its tombstone).

        Raises OffsetsRecordError for a value that cannot be decoded.
        """
        tp = (key.topic, key.partition)
        if value is None:
            self._offsets.replay_commit(key.group, tp, None)
            return
        offset = decode_offset_commit_value(value)
        if not self._is_consumer_group(key.group):
            self._membership.get_or_create_group(key.group)
        self._offsets.replay_commit(key.group, tp, offset, producer_id, transactional)

    def complete_transaction(self, producer_id: int, committed: bool) -> None:
        """Replay a transaction marker on the offsets log: COMMIT makes the producer's pending
        offsets visible, ABORT drops them."""
        self._offsets.replay_end_transaction(producer_id, committed)
