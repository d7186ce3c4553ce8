"""DescribeClientQuotas (48): onceflow enforces no client quotas, so every filter Kafka accepts
matches no entity. kafka-configs asks it before it prints a user's SCRAM credentials
(`--describe --entity-type users`), as Kafka's ConfigCommand describes quotas and credentials
together. The filter is checked as Kafka's ClientQuotasImage.describe checks it; DESCRIBE_CONFIGS
on the Cluster is needed (else CLUSTER_AUTHORIZATION_FAILED). AlterClientQuotas is not offered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import AdminContext
from onceflow.broker.handlers.responses import NO_THROTTLE, response_class
from onceflow.protocol.entities import build
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request

USER, CLIENT_ID, IP = "user", "client-id", "ip"
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


def handle_describe_client_quotas(ctx: AdminContext, request: Request) -> Any:
    cls = response_class(request)
    if not auth.authorize_cluster(request.session, auth.DESCRIBE_CONFIGS):
        error: tuple[ErrorCode, str | None] | None = (ErrorCode.cluster_authorization_failed, None)
    else:
        error = filter_error(request.body.components)
    if error is not None:
        code, message = error
        return build(
            cls, throttle_time=NO_THROTTLE, error_code=code, error_message=message, entries=None
        )
    return build(
        cls, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, error_message=None, entries=()
    )


def filter_error(components: Any) -> tuple[ErrorCode, str] | None:
    """Kafka's refusal of a quota filter, or None when it is well formed."""
    seen: set[str] = set()
    for component in components:
        entity_type = component.entity_type
        if not entity_type:
            return ErrorCode.invalid_request, "Invalid empty entity type."
        if entity_type in seen:
            return (
                ErrorCode.invalid_request,
                f"Entity type {entity_type} cannot appear more than once in the filter.",
            )
        seen.add(entity_type)
        if entity_type not in (USER, CLIENT_ID, IP):
            return ErrorCode.unsupported_version, f"Unsupported entity type {entity_type}"
        match_type = component.match_type
        if match_type == MATCH_EXACT and component.match is None:
            return (
                ErrorCode.invalid_request,
                "Request specified MATCH_TYPE_EXACT, but set match string to null.",
            )
        if match_type in (MATCH_DEFAULT, MATCH_SPECIFIED) and component.match is not None:
            name = "MATCH_TYPE_DEFAULT" if match_type == MATCH_DEFAULT else "MATCH_TYPE_SPECIFIED"
            return (
                ErrorCode.invalid_request,
                f"Request specified {name}, but also specified a match string.",
            )
        if match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            return ErrorCode.unsupported_version, f"Unsupported match type {match_type}"
    if IP in seen and (USER in seen or CLIENT_ID in seen):
        return (
            ErrorCode.invalid_request,
            "Invalid entity filter component combination. IP filter component should not be "
            "used with user or clientId filter component.",
        )
    return None
