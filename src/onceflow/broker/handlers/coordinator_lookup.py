"""FindCoordinator (10): this broker coordinates every group and transactional id."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.dispatch import api
from onceflow.protocol.entities import build, sibling
from onceflow.protocol.messages import response_type

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
    error = ErrorCode.none if key_type in (GROUP, TRANSACTION) else ErrorCode.invalid_request
    node = broker.config.node_id if error == ErrorCode.none else -1
    host, port = broker.advertised_endpoint(request) if error == ErrorCode.none else ("", -1)
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
