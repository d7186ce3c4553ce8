"""OffsetCommit (8) and OffsetFetch (9): committed group offsets in `__consumer_offsets`."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import GroupsContext, PartitionLookup
from onceflow.broker.handlers.responses import (
    by_topic,
    partition_errors,
    response_class,
)
from onceflow.groups.coordinator import CoordinatorLoadInProgressError
from onceflow.groups.offsets import OffsetAndMetadata, OffsetFetchEntry, TopicPartition
from onceflow.protocol.entities import build, sibling
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request

ZERO = datetime.timedelta(0)


def requested_offsets(
    partitions: PartitionLookup, topics: Any, session: Any = None
) -> tuple[dict[TopicPartition, OffsetAndMetadata], dict[TopicPartition, ErrorCode]]:
    """The offsets of an (Txn)OffsetCommit request, and errors for partitions that do not exist
    or whose topic the principal may not READ."""
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    errors: dict[TopicPartition, ErrorCode] = {}
    for t in topics:
        readable = auth.authorize(session, auth.READ, auth.TOPIC, t.name)
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            if not readable:
                errors[tp] = ErrorCode.topic_authorization_failed
                continue
            if partitions.partition(t.name, p.partition_index) is None:
                errors[tp] = ErrorCode.unknown_topic_or_partition
                continue
            offsets[tp] = OffsetAndMetadata(
                offset=p.committed_offset,
                leader_epoch=getattr(p, "committed_leader_epoch", -1),
                metadata=p.committed_metadata or "",
            )
    return offsets, errors


def commit_response(cls: type, errors: dict[TopicPartition, ErrorCode]) -> Any:
    """An (Txn)OffsetCommit response: an error code per partition."""
    topic_cls = sibling(cls, cls.__name__.replace("Response", "ResponseTopic"))
    part_cls = sibling(cls, cls.__name__.replace("Response", "ResponsePartition"))
    return build(cls, throttle_time=ZERO, topics=partition_errors(errors, topic_cls, part_cls))


def handle_offset_commit(ctx: GroupsContext, request: Request) -> Any:
    req = request.body
    if not auth.authorize(request.session, auth.READ, auth.GROUP, req.group_id):
        every = {(t.name, p.partition_index) for t in req.topics for p in t.partitions}
        denied = dict.fromkeys(sorted(every), ErrorCode.group_authorization_failed)
        return commit_response(response_class(request), denied)
    offsets, errors = requested_offsets(ctx.partitions, req.topics, request.session)
    retention = getattr(req, "retention_time", None)
    retention_ms = -1 if retention is None else int(retention.total_seconds() * 1000)
    result = ctx.coordinator.commit_offsets(
        req.group_id,
        req.generation_id_or_member_epoch,
        req.member_id,
        getattr(req, "group_instance_id", None),
        offsets,
        retention_time_ms=retention_ms,
        api_version=request.api_version,
    )
    errors.update(result.response)
    response = commit_response(response_class(request), errors)
    return ctx.write_offsets(result.records, response)


def _fetch_group(
    ctx: GroupsContext, group_id: str, topics: Any, require_stable: bool, session: Any = None
) -> tuple[ErrorCode, dict[TopicPartition, OffsetFetchEntry]]:
    asked = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    if not auth.authorize(session, auth.DESCRIBE, auth.GROUP, group_id):
        return ErrorCode.group_authorization_failed, {}
    # Partitions of topics the principal may not DESCRIBE: TOPIC_AUTHORIZATION_FAILED each
    # (or, when all are asked for, left out), as Kafka does.
    describable = {
        name
        for name in {tp[0] for tp in asked or ()}
        if auth.authorize(session, auth.DESCRIBE, auth.TOPIC, name)
    }
    partitions = None if asked is None else [tp for tp in asked if tp[0] in describable]
    try:
        entries = ctx.coordinator.fetch_offsets(group_id, partitions, require_stable)
    except CoordinatorLoadInProgressError:
        return ErrorCode.coordinator_load_in_progress, {}
    if asked is None:
        return ErrorCode.none, dict(
            auth.filter_authorized(
                session, auth.DESCRIBE, auth.TOPIC, entries.items(), lambda item: item[0][0]
            )
        )
    denied = OffsetFetchEntry(error=ErrorCode.topic_authorization_failed)
    return ErrorCode.none, {**entries, **{tp: denied for tp in asked if tp[0] not in describable}}


def _topics(
    cls: type, topic_name: str, part_name: str, entries: dict[TopicPartition, OffsetFetchEntry]
) -> tuple[Any, ...]:
    part_cls = sibling(cls, part_name)
    parts = (
        (
            topic,
            build(
                part_cls,
                partition_index=partition,
                committed_offset=e.offset,
                committed_leader_epoch=e.leader_epoch,
                metadata=e.metadata,
                error_code=e.error,
            ),
        )
        for (topic, partition), e in entries.items()
    )
    return by_topic(parts, sibling(cls, topic_name))


def handle_offset_fetch(ctx: GroupsContext, request: Request) -> Any:
    req = request.body
    cls = response_class(request)
    require_stable = getattr(req, "require_stable", False)
    if request.api_version >= 8:
        group_cls = sibling(cls, "OffsetFetchResponseGroup")
        groups = []
        for g in req.groups:
            error, entries = _fetch_group(
                ctx, g.group_id, g.topics, require_stable, request.session
            )
            groups.append(
                build(
                    group_cls,
                    group_id=g.group_id,
                    error_code=error,
                    topics=_topics(
                        cls, "OffsetFetchResponseTopics", "OffsetFetchResponsePartitions", entries
                    ),
                )
            )
        return build(cls, throttle_time=ZERO, groups=tuple(groups))
    error, entries = _fetch_group(ctx, req.group_id, req.topics, require_stable, request.session)
    if request.api_version < 2 and error != ErrorCode.none:
        entries = {tp: OffsetFetchEntry(error=error) for tp in entries}
    return build(
        cls,
        throttle_time=ZERO,
        error_code=error,
        topics=_topics(cls, "OffsetFetchResponseTopic", "OffsetFetchResponsePartition", entries),
    )
