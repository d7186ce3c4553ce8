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
    known = key_type in (GROUP, TRANSACTION)
    host, port = ctx.endpoint(request) if known else ("", -1)
    found = {
        "node_id": ctx.node.node_id if known else -1,
        "host": host,
        "port": port,
        "error_code": ErrorCode.none if known else ErrorCode.invalid_request,
        "error_message": None,
    }
    if request.api_version >= 4:
        # Batched (KIP-699): one answer per key, each the same.
        coordinator_cls = sibling(cls, "Coordinator")
        coordinators = tuple(
            build(coordinator_cls, key=key, **found) for key in req.coordinator_keys
        )
        return build(cls, throttle_time=datetime.timedelta(0), coordinators=coordinators)
    return build(cls, throttle_time=datetime.timedelta(0), **found)
