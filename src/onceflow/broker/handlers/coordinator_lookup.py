"""FindCoordinator (10): this broker coordinates every group and transactional id."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import AdminContext
from onceflow.broker.handlers.responses import response_class
from onceflow.protocol.entities import build, sibling

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request

GROUP = 0
TRANSACTION = 1


def handle_find_coordinator(ctx: AdminContext, request: Request) -> Any:
    req = request.body
    cls = response_class(request)
    key_type = getattr(req, "key_type", GROUP)
    error = ErrorCode.none if key_type in (GROUP, TRANSACTION) else ErrorCode.invalid_request
    node = ctx.node.node_id if error == ErrorCode.none else -1
    host = ctx.node.host if error == ErrorCode.none else ""
    port = ctx.node.port if error == ErrorCode.none else -1
    if request.api_version >= 4:
        coordinator_cls = sibling(cls, "Coordinator")
        coordinators = tuple(
            build(
                coordinator_cls,
                key=key,
                node_id=node,
                host=host,
                port=port,
                error_code=error,
                error_message=None,
            )
            for key in req.coordinator_keys
        )
        return build(cls, throttle_time=datetime.timedelta(0), coordinators=coordinators)
    return build(
        cls,
        throttle_time=datetime.timedelta(0),
        error_code=error,
        error_message=None,
        node_id=node,
        host=host,
        port=port,
    )
