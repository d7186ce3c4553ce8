"""FindCoordinator (10): this broker coordinates every group and transactional id."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.dispatch import api
from onceflow.protocol.entities import build, sibling
from onceflow.protocol.messages import response_type
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.broker.server import Broker
    from onceflow.protocol.messages import Request

GROUP = 0
TRANSACTION = 1


@api(10, 0, 6)
def handle_find_coordinator(broker: Broker, request: Request) -> Any:
    req = request.body
    cls = response_type(10, request.api_version)
    key_type = getattr(req, "key_type", GROUP)
    found = broker.advertised_endpoint(request) if key_type in (GROUP, TRANSACTION) else None

    def answer(key: str) -> tuple[ErrorCode, int, str, int]:
        if found is None:
            return ErrorCode.invalid_request, -1, "", -1
        resource = auth.GROUP if key_type == GROUP else auth.TRANSACTIONAL_ID
        if not auth.authorize(request.session, auth.DESCRIBE, resource, key):
            return auth.failed(resource), -1, "", -1
        return ErrorCode.none, broker.config.node_id, *found

    if request.api_version >= 4:
        coordinator_cls = sibling(cls, "Coordinator")
        coordinators = []
        for key in req.coordinator_keys:
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
        return build(cls, throttle_time=datetime.timedelta(0), coordinators=tuple(coordinators))
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
