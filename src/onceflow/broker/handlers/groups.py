"""The classic group protocol: JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13),
ListGroups (16), DescribeGroups (15), DeleteGroups (42)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import ipaddress
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import GroupsContext
from onceflow.broker.handlers.offsets import answer_when_written
from onceflow.broker.handlers.responses import build_from, response_class, response_classes
from onceflow.broker.handlers.slices import SLICED_ABOVE, Work, in_slices
from onceflow.groups.coordinator import (
    JoinGroupRequest,
    JoinResult,
    LeaveMember,
    SyncGroupRequest,
    SyncResult,
)
from onceflow.groups.messages import LeaveResult
from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.entities import build, sibling
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request

ZERO = datetime.timedelta(0)


def _ms(value: Any, default: int = -1) -> int:
    if value is None:
        return default
    return int(value.total_seconds() * 1000)


def member_host(client_host: str) -> str:
    """A member's host as Kafka reports it: Java's InetAddress.toString() of the client's
    address, without a reverse look-up ("/127.0.0.1"; IPv6 groups unabbreviated, as Java
    prints them; an IPv4-mapped IPv6 address as the IPv4 one, as Java makes it)."""
    try:
        address = ipaddress.ip_address(client_host.split("%", 1)[0])
    except ValueError:
        return f"/{client_host}"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if isinstance(address, ipaddress.IPv6Address):
        return "/" + ":".join(f"{int(group, 16):x}" for group in address.exploded.split(":"))
    return f"/{address}"


def _refused(request: Request) -> Any | None:
    """GROUP_AUTHORIZATION_FAILED for a membership request without READ on its group (the
    other fields as Kafka leaves them), else None."""
    if auth.authorize(request.session, auth.READ, auth.GROUP, request.body.group_id):
        return None
    version = request.api_version
    return build(
        response_class(request),
        throttle_time=ZERO,
        error_code=ErrorCode.group_authorization_failed,
        generation_id=-1,
        protocol_type=None,
        protocol_name="" if request.api_key == ApiKey.JOIN_GROUP and version < 7 else None,
        leader="",
        member_id="",
        members=(),
        skip_assignment=False,
        assignment=b"",
    )


def _answer_later() -> tuple[asyncio.Future[Any], Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def respond(result: Any) -> None:
        if not future.done():
            future.set_result(result)

    return future, respond


def handle_join_group(ctx: GroupsContext, request: Request) -> Any:
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
        client_host=member_host(request.client_host),
        require_known_member_id=version >= 4,
        supports_skip_assignment=version >= 9,
    )
    future, respond = _answer_later()
    ctx.coordinator.join_group(join, respond, ctx.topics)
    return _join_response(future, request)


async def _join_response(future: asyncio.Future[JoinResult], request: Request) -> Any:
    result = await future
    cls, member_cls = response_classes(request, "JoinGroupResponseMember")
    return build_from(
        cls,
        result,
        throttle_time=ZERO,
        error_code=result.error,
        protocol_name=result.protocol_name or ("" if request.api_version < 7 else None),
        members=tuple(build_from(member_cls, m) for m in result.members),
    )


def handle_sync_group(ctx: GroupsContext, request: Request) -> Any:
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
    future, respond = _answer_later()
    ctx.coordinator.sync_group(sync, respond, ctx.topics)
    return _sync_response(future, request)


async def _sync_response(future: asyncio.Future[SyncResult], request: Request) -> Any:
    result = await future
    return build_from(response_class(request), result, throttle_time=ZERO, error_code=result.error)


def handle_heartbeat(ctx: GroupsContext, request: Request) -> Any:
    if (refused := _refused(request)) is not None:
        return refused
    req = request.body
    error = ctx.coordinator.heartbeat(
        req.group_id, req.member_id, req.generation_id, getattr(req, "group_instance_id", None)
    )
    return build(response_class(request), throttle_time=ZERO, error_code=error)


def handle_leave_group(ctx: GroupsContext, request: Request) -> Any:
    if (refused := _refused(request)) is not None:
        return refused
    named = len(request.body.members) if request.api_version >= 3 else 1
    return in_slices(_leave_group(ctx, request), named)


def _leave_group(ctx: GroupsContext, request: Request) -> Work:
    """One step per member named (v3+), the group's change in one. Classic members leaving a
    consumer group are answered once the records removing them are durable."""
    req = request.body
    cls = response_class(request)
    written: list[Any] = []
    if request.api_version >= 3:
        members = []
        for m in req.members:
            members.append(
                LeaveMember(m.member_id, m.group_instance_id, getattr(m, "reason", None))
            )
            yield
    else:
        members = [LeaveMember(req.member_id)]
    if len(members) > SLICED_ABOVE:
        result = yield from _leave_in_chunks(ctx, req.group_id, members, written)
    else:
        result = _leave(ctx, req.group_id, members, written)
    if request.api_version < 3:
        error = (
            result.members[0].error
            if result.members and result.error == ErrorCode.none
            else result.error
        )
        return _when_written(written, build(cls, throttle_time=ZERO, error_code=error))
    member_cls = sibling(cls, "MemberResponse")
    answers = []
    for m in result.members:
        answers.append(build_from(member_cls, m, error_code=m.error))
        yield
    response = build(cls, throttle_time=ZERO, error_code=result.error, members=tuple(answers))
    return _when_written(written, response)


def _leave(
    ctx: GroupsContext, group_id: str, members: list[LeaveMember], written: list[Any]
) -> LeaveResult:
    result = ctx.coordinator.leave_group_result(group_id, members, ctx.topics)
    if result.records:
        written.append(ctx.write_offsets(result.records, None))
    return result.response


def _when_written(written: list[Any], response: Any) -> Any:
    """`response`, once the records of `written` (appended in order) are durable."""
    if not written:
        return response

    async def answer() -> Any:
        for w in written:
            await answer_when_written(w, None)
        return response

    return answer()


def _leave_in_chunks(
    ctx: GroupsContext, group_id: str, members: list[LeaveMember], written: list[Any]
) -> Work:
    """The members leave in their order, SLICED_ABOVE at a time, each chunk one step; a
    group-level error (the group gone meanwhile) answers for the whole request."""
    left: list[Any] = []
    for start in range(0, len(members), SLICED_ABOVE):
        result = _leave(ctx, group_id, members[start : start + SLICED_ABOVE], written)
        if result.error != ErrorCode.none:
            return result
        left.extend(result.members)
        yield
    return dataclasses.replace(result, members=tuple(left))


def handle_list_groups(ctx: GroupsContext, request: Request) -> Any:
    req = request.body
    cls, group_cls = response_classes(request, "ListedGroup")
    listings = ctx.coordinator.list_groups(
        getattr(req, "states_filter", None), getattr(req, "types_filter", None)
    )
    if not auth.authorize_cluster(request.session, auth.DESCRIBE):  # else only describable ones
        listings = auth.filter_authorized(
            request.session, auth.DESCRIBE, auth.GROUP, listings, lambda g: g.group_id
        )
    error = ErrorCode.coordinator_load_in_progress if ctx.coordinator.loading else ErrorCode.none
    return build(
        cls,
        throttle_time=ZERO,
        error_code=error,
        groups=tuple(build_from(group_cls, g, group_state=g.state) for g in listings),
    )


def handle_describe_groups(ctx: GroupsContext, request: Request) -> Any:
    return in_slices(_describe_groups(ctx, request), len(request.body.groups))


def _describe_groups(ctx: GroupsContext, request: Request) -> Work:
    """One step per group named (20,000 took 5 s at once): the refused ones first, as before,
    then each allowed group as named (duplicates too, as Kafka answers them)."""
    req = request.body
    cls = response_class(request)
    group_cls = sibling(cls, "DescribedGroup")
    member_cls = sibling(cls, "DescribedGroupMember")
    with_operations = getattr(req, "include_authorized_operations", False)
    allowed: list[str] = []
    out = []
    for group in req.groups:
        if auth.authorize(request.session, auth.DESCRIBE, auth.GROUP, group, log_if_denied=False):
            allowed.append(group)
        else:
            out.append(
                build(
                    group_cls,
                    error_code=ErrorCode.group_authorization_failed,
                    group_id=group,
                    group_state="",
                    protocol_type="",
                    protocol_data="",
                    members=(),
                    authorized_operations=auth.NOT_REQUESTED,
                )
            )
        yield
    for group in allowed:
        [d] = ctx.coordinator.describe_groups([group])
        # Up to v5 an unknown group is state Dead with no error, as Kafka answers.
        error = ErrorCode.none if d.error == ErrorCode.group_id_not_found else d.error
        members = tuple(
            build_from(member_cls, m, member_metadata=m.metadata, member_assignment=m.assignment)
            for m in d.members
        )
        out.append(
            build_from(
                group_cls,
                d,
                error_code=error,
                group_state=d.state,
                members=members,
                authorized_operations=auth.authorized_operations(
                    request.session, auth.GROUP, d.group_id
                )
                if with_operations
                else auth.NOT_REQUESTED,
            )
        )
        yield
    return build(cls, throttle_time=ZERO, groups=tuple(out))


def handle_delete_groups(ctx: GroupsContext, request: Request) -> Any:
    return in_slices(_delete_groups(ctx, request), len(request.body.groups_names))


def _delete_groups(ctx: GroupsContext, request: Request) -> Work:
    """One step per group named (25,000 took 8 s at once: the refused ones were looked up in
    a list); the groups' checks and the tombstones' append in one step."""
    req = request.body
    allowed: dict[str, None] = {}
    denied: dict[str, ErrorCode] = {}
    for g in req.groups_names:
        if auth.authorize(request.session, auth.DELETE, auth.GROUP, g, log_if_denied=False):
            allowed[g] = None
        else:
            denied[g] = ErrorCode.group_authorization_failed
        yield
    result = ctx.coordinator.delete_groups(allowed)
    written = ctx.write_offsets(result.records, None)
    cls = response_class(request)
    result_cls = sibling(cls, "DeletableGroupResult")
    results = []
    for g, e in {**denied, **result.response}.items():
        results.append(build(result_cls, group_id=g, error_code=e))
        yield
    return answer_when_written(written, build(cls, throttle_time=ZERO, results=tuple(results)))
