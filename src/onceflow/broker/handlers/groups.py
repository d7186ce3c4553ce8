"""The classic group protocol: JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13),
ListGroups (16), DescribeGroups (15), DeleteGroups (42)."""

from __future__ import annotations

import asyncio
import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.dispatch import api
from onceflow.groups.coordinator import (
    JoinGroupRequest,
    JoinResult,
    LeaveMember,
    SyncGroupRequest,
    SyncResult,
)
from onceflow.protocol.entities import build, sibling
from onceflow.protocol.messages import response_type
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.broker.server import Broker
    from onceflow.protocol.messages import Request

ZERO = datetime.timedelta(0)


def _ms(value: Any, default: int = -1) -> int:
    if value is None:
        return default
    return int(value.total_seconds() * 1000)


def _refused(request: Request) -> Any | None:
    """GROUP_AUTHORIZATION_FAILED for a membership request without READ on its group (the
    other fields as Kafka leaves them), else None."""
    if auth.authorize(request.session, auth.READ, auth.GROUP, request.body.group_id):
        return None
    version = request.api_version
    return build(
        response_type(request.api_key, version),
        throttle_time=ZERO,
        error_code=ErrorCode.group_authorization_failed,
        generation_id=-1,
        protocol_type=None,
        protocol_name="" if request.api_key == 11 and version < 7 else None,
        leader="",
        member_id="",
        members=(),
        skip_assignment=False,
        assignment=b"",
    )


def _answer_later(broker: Broker) -> tuple[asyncio.Future[Any], Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def respond(result: Any) -> None:
        if not future.done():
            future.set_result(result)

    return future, respond


@api(11, 0, 9)
def handle_join_group(broker: Broker, request: Request) -> Any:
    if (refused := _refused(request)) is not None:
        return refused
    req = request.body
    version = request.api_version
    session = _ms(req.session_timeout)
    join = JoinGroupRequest(
        group_id=req.group_id,
        member_id=req.member_id,
        protocol_type=req.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in req.protocols],
        session_timeout_ms=session,
        rebalance_timeout_ms=_ms(getattr(req, "rebalance_timeout", None), session),
        group_instance_id=getattr(req, "group_instance_id", None),
        reason=getattr(req, "reason", None),
        client_id=request.client_id or "",
        client_host=request.client_host,
        require_known_member_id=version >= 4,
        supports_skip_assignment=version >= 9,
    )
    future, respond = _answer_later(broker)
    broker.groups.join_group(join, respond)
    return _join_response(future, version)


async def _join_response(future: asyncio.Future[JoinResult], version: int) -> Any:
    result = await future
    cls = response_type(11, version)
    member_cls = sibling(cls, "JoinGroupResponseMember")
    members = tuple(
        build(
            member_cls,
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            metadata=m.metadata,
        )
        for m in result.members
    )
    return build(
        cls,
        throttle_time=ZERO,
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name or ("" if version < 7 else None),
        leader=result.leader,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=members,
    )


@api(14, 0, 5)
def handle_sync_group(broker: Broker, request: Request) -> Any:
    if (refused := _refused(request)) is not None:
        return refused
    req = request.body
    sync = SyncGroupRequest(
        group_id=req.group_id,
        generation_id=req.generation_id,
        member_id=req.member_id,
        group_instance_id=getattr(req, "group_instance_id", None),
        protocol_type=getattr(req, "protocol_type", None),
        protocol_name=getattr(req, "protocol_name", None),
        assignments={a.member_id: bytes(a.assignment) for a in req.assignments},
    )
    future, respond = _answer_later(broker)
    broker.groups.sync_group(sync, respond)
    return _sync_response(future, request.api_version)


async def _sync_response(future: asyncio.Future[SyncResult], version: int) -> Any:
    result = await future
    return build(
        response_type(14, version),
        throttle_time=ZERO,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


@api(12, 0, 4)
def handle_heartbeat(broker: Broker, request: Request) -> Any:
    if (refused := _refused(request)) is not None:
        return refused
    req = request.body
    error = broker.groups.heartbeat(
        req.group_id, req.member_id, req.generation_id, getattr(req, "group_instance_id", None)
    )
    return build(response_type(12, request.api_version), throttle_time=ZERO, error_code=error)


@api(13, 0, 5)
def handle_leave_group(broker: Broker, request: Request) -> Any:
    if (refused := _refused(request)) is not None:
        return refused
    req = request.body
    cls = response_type(13, request.api_version)
    if request.api_version >= 3:
        members = [
            LeaveMember(m.member_id, m.group_instance_id, getattr(m, "reason", None))
            for m in req.members
        ]
    else:
        members = [LeaveMember(req.member_id)]
    result = broker.groups.leave_group(req.group_id, members)
    if request.api_version < 3:
        error = (
            result.members[0].error
            if result.members and result.error == ErrorCode.none
            else result.error
        )
        return build(cls, throttle_time=ZERO, error_code=error)
    member_cls = sibling(cls, "MemberResponse")
    return build(
        cls,
        throttle_time=ZERO,
        error_code=result.error,
        members=tuple(
            build(
                member_cls,
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                error_code=m.error,
            )
            for m in result.members
        ),
    )


@api(16, 0, 5)
def handle_list_groups(broker: Broker, request: Request) -> Any:
    req = request.body
    cls = response_type(16, request.api_version)
    group_cls = sibling(cls, "ListedGroup")
    listings = broker.groups.list_groups(
        getattr(req, "states_filter", None), getattr(req, "types_filter", None)
    )
    if not auth.authorize_cluster(request.session, auth.DESCRIBE):  # else only describable ones
        listings = auth.filter_authorized(
            request.session, auth.DESCRIBE, auth.GROUP, listings, lambda g: g.group_id
        )
    error = ErrorCode.coordinator_load_in_progress if broker.groups.loading else ErrorCode.none
    return build(
        cls,
        throttle_time=ZERO,
        error_code=error,
        groups=tuple(
            build(
                group_cls,
                group_id=g.group_id,
                protocol_type=g.protocol_type,
                group_state=g.state,
                group_type=g.group_type,
            )
            for g in listings
        ),
    )


@api(15, 0, 5)
def handle_describe_groups(broker: Broker, request: Request) -> Any:
    req = request.body
    cls = response_type(15, request.api_version)
    group_cls = sibling(cls, "DescribedGroup")
    member_cls = sibling(cls, "DescribedGroupMember")
    allowed = auth.filter_authorized(request.session, auth.DESCRIBE, auth.GROUP, req.groups)
    out = [
        build(
            group_cls,
            error_code=ErrorCode.group_authorization_failed,
            group_id=group,
            group_state="",
            protocol_type="",
            protocol_data="",
            members=(),
            authorized_operations=-2147483648,
        )
        for group in req.groups
        if group not in allowed
    ]
    for d in broker.groups.describe_groups(allowed):
        # Up to v5 an unknown group is state Dead with no error, as Kafka answers.
        error = ErrorCode.none if d.error == ErrorCode.group_id_not_found else d.error
        out.append(
            build(
                group_cls,
                error_code=error,
                group_id=d.group_id,
                group_state=d.state,
                protocol_type=d.protocol_type,
                protocol_data=d.protocol_data,
                members=tuple(
                    build(
                        member_cls,
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=m.metadata,
                        member_assignment=m.assignment,
                    )
                    for m in d.members
                ),
                authorized_operations=-2147483648,
            )
        )
    return build(cls, throttle_time=ZERO, groups=tuple(out))


@api(42, 0, 2)
def handle_delete_groups(broker: Broker, request: Request) -> Any:
    req = request.body
    allowed = auth.filter_authorized(request.session, auth.DELETE, auth.GROUP, req.groups_names)
    result = broker.groups.delete_groups(allowed)
    denied = {g: ErrorCode.group_authorization_failed for g in req.groups_names if g not in allowed}
    cls = response_type(42, request.api_version)
    result_cls = sibling(cls, "DeletableGroupResult")
    response = build(
        cls,
        throttle_time=ZERO,
        results=tuple(
            build(result_cls, group_id=g, error_code=e)
            for g, e in {**denied, **result.response}.items()
        ),
    )
    return broker.write_offsets_records(result.records, response)
