"""OffsetCommit (8) and OffsetFetch (9): committed group offsets in `__consumer_offsets`.

Both work one step per partition named (handlers/slices.py): 200,000 partitions held the event
loop 2 to 4 s at once. A commit is checked and its records built, validated against the group
and appended in one step, so that no other request comes between the group's check and the
append; the response is built after.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import GroupsContext, PartitionLookup
from onceflow.broker.handlers.responses import by_topic_in_steps, response_class
from onceflow.broker.handlers.slices import Work, in_slices
from onceflow.groups.coordinator import CoordinatorLoadInProgressError
from onceflow.groups.errors import MemberFencedError
from onceflow.groups.offsets import OffsetAndMetadata, OffsetFetchEntry, TopicPartition
from onceflow.protocol.entities import build, sibling
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request

ZERO = datetime.timedelta(0)


def requested_offsets(partitions: PartitionLookup, topics: Any, session: Any = None) -> Work:
    """The offsets of an (Txn)OffsetCommit request, and errors for partitions that do not exist
    or whose topic the principal may not READ (asked once per topic): one step per partition."""
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    errors: dict[TopicPartition, ErrorCode] = {}
    readable: dict[str, bool] = {}
    for t in topics:
        if t.name not in readable:
            readable[t.name] = auth.authorize(session, auth.READ, auth.TOPIC, t.name)
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            if not readable[t.name]:
                errors[tp] = ErrorCode.topic_authorization_failed
            elif partitions.partition(t.name, p.partition_index) is None:
                errors[tp] = ErrorCode.unknown_topic_or_partition
            else:
                offsets[tp] = OffsetAndMetadata(
                    offset=p.committed_offset,
                    leader_epoch=getattr(p, "committed_leader_epoch", -1),
                    metadata=p.committed_metadata or "",
                )
            yield
    return offsets, errors


def commit_response(cls: type, errors: dict[TopicPartition, ErrorCode]) -> Work:
    """An (Txn)OffsetCommit response: an error code per partition, one step each."""
    topic_cls = sibling(cls, cls.__name__.replace("Response", "ResponseTopic"))
    part_cls = sibling(cls, cls.__name__.replace("Response", "ResponsePartition"))
    parts = []
    for (topic, index), code in errors.items():
        parts.append((topic, build(part_cls, partition_index=index, error_code=code)))
        yield
    return build(cls, throttle_time=ZERO, topics=(yield from by_topic_in_steps(parts, topic_cls)))


def partitions_named(topics: Any) -> int:
    return sum(len(t.partitions) for t in topics)


async def answer_when_written(written: Any, response: Any) -> Any:
    """`response` once the records `written` stands for are durable (it raises if they fail)."""
    if isinstance(written, Awaitable):
        await written
    return response


def handle_offset_commit(ctx: GroupsContext, request: Request) -> Any:
    return in_slices(_offset_commit(ctx, request), partitions_named(request.body.topics))


def _offset_commit(ctx: GroupsContext, request: Request) -> Work:
    req = request.body
    if not auth.authorize(request.session, auth.READ, auth.GROUP, req.group_id):
        every = {(t.name, p.partition_index) for t in req.topics for p in t.partitions}
        denied = dict.fromkeys(sorted(every), ErrorCode.group_authorization_failed)
        return (yield from commit_response(response_class(request), denied))
    offsets, errors = yield from requested_offsets(ctx.partitions, req.topics, request.session)
    retention = getattr(req, "retention_time", None)
    retention_ms = -1 if retention is None else int(retention.total_seconds() * 1000)
    # The group's check and the append, in one step (records: one per existing partition).
    result = ctx.coordinator.commit_offsets(
        req.group_id,
        req.generation_id_or_member_epoch,
        req.member_id,
        getattr(req, "group_instance_id", None),
        offsets,
        retention_time_ms=retention_ms,
        api_version=request.api_version,
    )
    written = ctx.write_offsets(result.records, None)
    errors.update(result.response)
    response = yield from commit_response(response_class(request), errors)
    return answer_when_written(written, response)


def _fetch_group(
    ctx: GroupsContext,
    group_id: str,
    topics: Any,
    require_stable: bool,
    session: Any = None,
    member: tuple[str | None, int] = (None, -1),
) -> Work:
    """(group error, entries) of one group, one step per partition named. The group's offsets
    are read in one step, as one snapshot."""
    if not auth.authorize(session, auth.DESCRIBE, auth.GROUP, group_id):
        return ErrorCode.group_authorization_failed, {}
    asked: list[TopicPartition] | None = None
    # Partitions of topics the principal may not DESCRIBE: TOPIC_AUTHORIZATION_FAILED each
    # (or, when all are asked for, left out), as Kafka does.
    describable: dict[str, bool] = {}
    if topics is not None:
        asked = []
        for t in topics:
            if t.name not in describable:
                describable[t.name] = auth.authorize(session, auth.DESCRIBE, auth.TOPIC, t.name)
            for p in t.partition_indexes:
                asked.append((t.name, p))
                yield
    partitions = None if asked is None else [tp for tp in asked if describable[tp[0]]]
    try:
        entries = yield from ctx.coordinator.fetch_offsets_in_steps(
            group_id, partitions, require_stable, *member
        )
    except CoordinatorLoadInProgressError:
        return ErrorCode.coordinator_load_in_progress, {}
    except MemberFencedError as e:  # a KIP-848 member not at its epoch (v9+)
        return e.error_code, {}
    if asked is None:
        return ErrorCode.none, dict(
            auth.filter_authorized(
                session, auth.DESCRIBE, auth.TOPIC, entries.items(), lambda item: item[0][0]
            )
        )
    denied = OffsetFetchEntry(error=ErrorCode.topic_authorization_failed)
    for tp in asked:
        if not describable[tp[0]]:
            entries[tp] = denied
            yield
    return ErrorCode.none, entries


def _topics(
    cls: type, topic_name: str, part_name: str, entries: dict[TopicPartition, OffsetFetchEntry]
) -> Work:
    part_cls = sibling(cls, part_name)
    parts = []
    for (topic, partition), e in entries.items():
        parts.append(
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
        )
        yield
    return (yield from by_topic_in_steps(parts, sibling(cls, topic_name)))


def handle_offset_fetch(ctx: GroupsContext, request: Request) -> Any:
    req = request.body
    if request.api_version >= 8:
        named = sum(1 + sum(len(t.partition_indexes) for t in g.topics or ()) for g in req.groups)
    else:
        named = sum(len(t.partition_indexes) for t in req.topics or ())
    return in_slices(_offset_fetch(ctx, request), named)


def _offset_fetch(ctx: GroupsContext, request: Request) -> Work:
    req = request.body
    cls = response_class(request)
    require_stable = getattr(req, "require_stable", False)
    if request.api_version >= 8:
        group_cls = sibling(cls, "OffsetFetchResponseGroup")
        groups = []
        for g in req.groups:
            member = (getattr(g, "member_id", None), getattr(g, "member_epoch", -1))
            error, entries = yield from _fetch_group(
                ctx, g.group_id, g.topics, require_stable, request.session, member
            )
            topics = yield from _topics(
                cls, "OffsetFetchResponseTopics", "OffsetFetchResponsePartitions", entries
            )
            groups.append(build(group_cls, group_id=g.group_id, error_code=error, topics=topics))
            yield
        return build(cls, throttle_time=ZERO, groups=tuple(groups))
    error, entries = yield from _fetch_group(
        ctx, req.group_id, req.topics, require_stable, request.session
    )
    if request.api_version < 2 and error != ErrorCode.none:
        entries = {tp: OffsetFetchEntry(error=error) for tp in entries}
    topics = yield from _topics(
        cls, "OffsetFetchResponseTopic", "OffsetFetchResponsePartition", entries
    )
    return build(cls, throttle_time=ZERO, error_code=error, topics=topics)
