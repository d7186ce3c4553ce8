"""FindCoordinator (10): this broker coordinates every group and transactional id."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import AdminContext
from onceflow.broker.handlers.responses import response_class
from onceflow.broker.handlers.slices import Work, in_slices
from onceflow.protocol.entities import build, sibling
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request

Answer = tuple[ErrorCode, int, str, int]  # error, node id, host, port

GROUP = 0
TRANSACTION = 1


def handle_find_coordinator(ctx: AdminContext, request: Request) -> Any:
    req = request.body
    cls = response_class(request)
    key_type = getattr(req, "key_type", GROUP)
    found = ctx.endpoint(request) if key_type in (GROUP, TRANSACTION) else None

    def answer(key: str) -> Answer:
        if found is None:
            return ErrorCode.invalid_request, -1, "", -1
        resource = auth.GROUP if key_type == GROUP else auth.TRANSACTIONAL_ID
        if not auth.authorize(request.session, auth.DESCRIBE, resource, key):
            return auth.failed(resource), -1, "", -1
        return ErrorCode.none, ctx.node.node_id, *found

    if request.api_version >= 4:
        return in_slices(_batched(cls, req.coordinator_keys, answer), len(req.coordinator_keys))
    error, node, host, port = answer(req.key)
    return build(
        cls,
        throttle_time=datetime.timedelta(0),
        error_code=error,
        error_message=None,
        node_id=node,
        host=host,
        port=port,
    )


def _batched(
    cls: type, keys: Any, answer: Callable[[str], tuple[ErrorCode, int, str, int]]
) -> Work:
    """Batched (KIP-699): one answer per key, each the same; one step per key."""
    coordinator_cls = sibling(cls, "Coordinator")
    coordinators = []
    for key in keys:
        error, node, host, port = answer(key)
        coordinators.append(
            build(
                coordinator_cls,
                key=key,
                node_id=node,
                host=host,
                port=port,
                error_code=error,
                error_message=None,
            )
        )
        yield
    return build(cls, throttle_time=datetime.timedelta(0), coordinators=tuple(coordinators))
