"""SaslHandshake (17) and SaslAuthenticate (36): the protocol edge of the connection's
security session (onceflow.security.session), which holds the state machine."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.entities import build
from onceflow.protocol.messages import response_type

if TYPE_CHECKING:
    from onceflow.broker.handlers.context import SecurityContext
    from onceflow.protocol.messages import Request
    from onceflow.security.session import Session

SASL_HANDSHAKE = ApiKey.SASL_HANDSHAKE
SASL_AUTHENTICATE = ApiKey.SASL_AUTHENTICATE


def handle_sasl_handshake(ctx: SecurityContext, request: Request) -> Any:
    session: Session = request.session
    error = session.handshake(request.body.mechanism, request.api_version)
    return build(
        response_type(SASL_HANDSHAKE, request.api_version),
        error_code=error,
        # Kafka lists the listener's mechanisms, also to a client that chose one it lacks.
        mechanisms=session.enabled_mechanisms(),
    )


def handle_sasl_authenticate(ctx: SecurityContext, request: Request) -> Any:
    return _authenticate(request)


async def _authenticate(request: Request) -> Any:
    session: Session = request.session
    outcome = await session.authenticate(request.body.auth_bytes)
    return build(
        response_type(SASL_AUTHENTICATE, request.api_version),
        error_code=outcome.error_code,
        error_message=outcome.error_message,
        auth_bytes=outcome.auth_bytes,
        # KIP-368 (connections.max.reauth.ms) is not offered: sessions do not expire.
        session_lifetime=datetime.timedelta(0),
    )
