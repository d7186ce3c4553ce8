"""The KIP-848 consumer group protocol: ConsumerGroupHeartbeat (68), ConsumerGroupDescribe (69).

The coordinator computes the records and the answer; the answer goes out once the records are
durable in ``__consumer_offsets``. The topics the assignment is computed from are the broker's
topic registry (the groups' context's partition lookup is that registry).
"""

from __future__ import annotations

import datetime
import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import GroupsContext
from onceflow.broker.handlers.groups import member_host
from onceflow.broker.handlers.offsets import answer_when_written
from onceflow.broker.handlers.responses import response_class
from onceflow.groups.consumer_messages import Assignment, HeartbeatRequest
from onceflow.protocol.entities import build, sibling
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request

ZERO = datetime.timedelta(0)


def _ms(value: Any) -> int:
    if value is None:
        return -1
    return int(value.total_seconds() * 1000)


def _owned(topic_partitions: Any) -> Assignment | None:
    if topic_partitions is None:
        return None
    owned: dict[uuid.UUID, frozenset[int]] = {}
    for tp in topic_partitions:
        if tp.topic_id is not None:
            owned[tp.topic_id] = owned.get(tp.topic_id, frozenset()) | frozenset(tp.partitions)
    return owned


def handle_consumer_group_heartbeat(ctx: GroupsContext, request: Request) -> Any:
    req = request.body
    cls = response_class(request)
    if not auth.authorize(request.session, auth.READ, auth.GROUP, req.group_id):
        return build(
            cls,
            throttle_time=ZERO,
            error_code=ErrorCode.group_authorization_failed,
            error_message=None,
            member_id=None,
            member_epoch=-1,
            heartbeat_interval=ZERO,
            assignment=None,
        )
    heartbeat = HeartbeatRequest(
        group_id=req.group_id,
        member_id=req.member_id,
        member_epoch=req.member_epoch,
        instance_id=req.instance_id,
        rack_id=req.rack_id,
        rebalance_timeout_ms=_ms(req.rebalance_timeout),
        subscribed_topic_names=(
            None if req.subscribed_topic_names is None else tuple(req.subscribed_topic_names)
        ),
        subscribed_topic_regex=getattr(req, "subscribed_topic_regex", None),
        server_assignor=req.server_assignor,
        owned=_owned(req.topic_partitions),
        client_id=request.client_id or "",
        client_host=member_host(request.client_host),
        api_version=request.api_version,
    )
    result = ctx.coordinator.consumer_group_heartbeat(heartbeat, ctx.topics)
    answer = result.response
    assignment = None
    if answer.assignment is not None:
        assignment_cls = sibling(cls, "Assignment")
        tp_cls = sibling(cls, "TopicPartitions")
        assignment = build(
            assignment_cls,
            topic_partitions=tuple(
                build(tp_cls, topic_id=topic_id, partitions=tuple(sorted(parts)))
                for topic_id, parts in sorted(answer.assignment.items(), key=lambda i: str(i[0]))
            ),
        )
    response = build(
        cls,
        throttle_time=ZERO,
        error_code=answer.error,
        error_message=answer.error_message,
        member_id=answer.member_id,
        member_epoch=answer.member_epoch,
        heartbeat_interval=datetime.timedelta(milliseconds=answer.heartbeat_interval_ms),
        assignment=assignment,
    )
    if not result.records:
        return response
    return answer_when_written(ctx.write_offsets(result.records, None), response)


def handle_consumer_group_describe(ctx: GroupsContext, request: Request) -> Any:
    req = request.body
    cls = response_class(request)
    group_cls = sibling(cls, "DescribedGroup")
    member_cls = sibling(cls, "Member")
    assignment_cls = sibling(cls, "Assignment")
    tp_cls = sibling(cls, "TopicPartitions")
    with_operations = req.include_authorized_operations

    def assignment(parts: Any) -> Any:
        return build(
            assignment_cls,
            topic_partitions=tuple(
                build(
                    tp_cls,
                    topic_id=p.topic_id,
                    topic_name=p.topic_name,
                    partitions=p.partitions,
                )
                for p in parts
            ),
        )

    groups = []
    for group_id in req.group_ids:
        if not auth.authorize(request.session, auth.DESCRIBE, auth.GROUP, group_id):
            groups.append(
                build(
                    group_cls,
                    error_code=ErrorCode.group_authorization_failed,
                    error_message=None,
                    group_id=group_id,
                    group_state="",
                    group_epoch=-1,
                    assignment_epoch=-1,
                    assignor_name="",
                    members=(),
                    authorized_operations=auth.NOT_REQUESTED,
                )
            )
            continue
        [d] = ctx.coordinator.consumer_group_describe([group_id], ctx.topics)
        members = tuple(
            build(
                member_cls,
                member_id=m.member_id,
                instance_id=m.instance_id,
                rack_id=m.rack_id,
                member_epoch=m.member_epoch,
                client_id=m.client_id,
                client_host=m.client_host,
                subscribed_topic_names=m.subscribed_topic_names,
                subscribed_topic_regex=m.subscribed_topic_regex,
                assignment=assignment(m.assignment),
                target_assignment=assignment(m.target_assignment),
                member_type=m.member_type,
            )
            for m in d.members
        )
        groups.append(
            build(
                group_cls,
                error_code=d.error,
                error_message=d.error_message,
                group_id=group_id,
                group_state=d.state,
                group_epoch=d.group_epoch,
                assignment_epoch=d.assignment_epoch,
                assignor_name=d.assignor_name,
                members=members,
                authorized_operations=(
                    auth.authorized_operations(request.session, auth.GROUP, group_id)
                    if with_operations
                    else auth.NOT_REQUESTED
                ),
            )
        )
    return build(cls, throttle_time=ZERO, groups=tuple(groups))
