"""A connection's security session: its listener, its principal, and on SASL listeners the
authentication state machine of Kafka's SaslServerAuthenticator.

Until a SASL connection has authenticated, only ApiVersions (once, first), SaslHandshake and
SaslAuthenticate are accepted; anything else closes the connection, as Kafka does. After
SaslHandshake v0 the client sends bare SASL tokens, size-framed without a request header
(KIP-43); v1 puts them in SaslAuthenticate requests (KIP-152). A failed authentication is
answered (SASL_AUTHENTICATION_FAILED, or for bare tokens nothing) after
`connection.failed.authentication.delay.ms`, logged once, and the connection closed.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.protocol.errors import ProtocolError
from onceflow.security.authorizer import Authorizer
from onceflow.security.credentials import CredentialStore
from onceflow.security.listeners import Listener
from onceflow.security.principal import ANONYMOUS, KafkaPrincipal, certificate_principal, user
from onceflow.security.sasl import MechanismServer, SaslAuthenticationError, mechanism_server

log = logging.getLogger("onceflow.security")

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
_SIZE = struct.Struct(">i")


class AuthenticationRequiredError(ProtocolError):
    """A request a SASL connection may not send in its state: the connection is closed."""


class SaslState(enum.Enum):
    HANDSHAKE_OR_VERSIONS_REQUEST = "HANDSHAKE_OR_VERSIONS_REQUEST"
    HANDSHAKE_REQUEST = "HANDSHAKE_REQUEST"
    AUTHENTICATE = "AUTHENTICATE"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


@dataclass(frozen=True)
class SaslSettings:
    enabled_mechanisms: tuple[str, ...]
    failed_authentication_delay_s: float
    credentials: CredentialStore


@dataclass(frozen=True)
class AuthenticateOutcome:
    """What a SaslAuthenticate request is answered."""

    error_code: ErrorCode
    error_message: str | None
    auth_bytes: bytes


@dataclass(eq=False)
class Session:
    listener: Listener
    peer: str  # ip:port, for logs
    host: str  # the client's address, as ACLs match it
    sasl: SaslSettings | None
    api_versions: tuple[int, int] = (0, 0)  # ApiVersions' supported range
    principal: KafkaPrincipal = ANONYMOUS
    state: SaslState = SaslState.COMPLETE
    # After SaslHandshake v0: the next frames are bare tokens (no request header).
    raw_tokens: bool = False
    # Authentication failed or was refused: read nothing more; close once answered. The
    # connection sets `on_must_close` to hear of it when it happens (after an await).
    must_close: bool = False
    on_must_close: Callable[[], None] | None = field(default=None, repr=False)
    mechanism: str | None = None
    # The broker's authorizer when ACLs are on (authorization.py asks it), else None.
    authorizer: Authorizer | None = field(default=None, repr=False)
    _server: MechanismServer | None = field(default=None, repr=False)
    _busy: bool = False

    def __post_init__(self) -> None:
        if self.listener.protocol.uses_sasl:
            self.state = SaslState.HANDSHAKE_OR_VERSIONS_REQUEST

    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.COMPLETE

    def tls_established(self, peer_cert: dict[str, Any] | None) -> None:
        """SSL listeners: the principal is the verified client certificate's subject (SASL_SSL
        takes the SASL identity instead, as Kafka's DefaultKafkaPrincipalBuilder)."""
        if not self.listener.protocol.uses_sasl:
            self.principal = certificate_principal(peer_cert)

    # -- the gate --------------------------------------------------------------------------

    def admit(self, api_key: int, api_version: int) -> None:
        """Raise AuthenticationRequiredError if this request may not be sent now."""
        state = self.state
        if state is SaslState.COMPLETE:
            return
        if state is SaslState.FAILED:
            raise AuthenticationRequiredError("request after a failed authentication")
        if state is SaslState.AUTHENTICATE:
            if api_key == SASL_AUTHENTICATE:
                return
            raise AuthenticationRequiredError(
                f"unexpected request of API {api_key} during SASL authentication"
            )
        if api_key == API_VERSIONS and state is SaslState.HANDSHAKE_OR_VERSIONS_REQUEST:
            low, high = self.api_versions
            if low <= api_version <= high:  # an unsupported version is answered, state kept
                self.state = SaslState.HANDSHAKE_REQUEST
            return
        if api_key == SASL_HANDSHAKE:
            return
        raise AuthenticationRequiredError(
            f"unexpected request of API {api_key} during SASL handshake "
            "(the client must authenticate first: check security.protocol and sasl.mechanism)"
        )

    # -- SaslHandshake -----------------------------------------------------------------------

    def enabled_mechanisms(self) -> tuple[str, ...]:
        return self.sasl.enabled_mechanisms if self.sasl else ()

    def handshake(self, mechanism: str, version: int) -> ErrorCode:
        """Choose the mechanism; UNSUPPORTED_SASL_MECHANISM closes the connection after the
        answer, ILLEGAL_SASL_STATE answers a connection that is not expecting one."""
        if self.sasl is None or self.state not in (
            SaslState.HANDSHAKE_OR_VERSIONS_REQUEST,
            SaslState.HANDSHAKE_REQUEST,
        ):
            return ErrorCode.illegal_sasl_state
        if mechanism not in self.sasl.enabled_mechanisms:
            self._log_failure(f"unsupported SASL mechanism {mechanism!r}")
            self._fail()
            return ErrorCode.unsupported_sasl_mechanism
        self.mechanism = mechanism
        self._server = mechanism_server(mechanism, self.sasl.credentials)
        self.state = SaslState.AUTHENTICATE
        self.raw_tokens = version == 0
        return ErrorCode.none

    # -- SaslAuthenticate and bare tokens ----------------------------------------------------

    def authenticate(self, token: bytes) -> Awaitable[AuthenticateOutcome]:
        """A SaslAuthenticate request's token (KIP-152)."""
        if self.state is not SaslState.AUTHENTICATE or self._server is None:
            return _ready(
                AuthenticateOutcome(
                    ErrorCode.illegal_sasl_state,
                    "SaslAuthenticate request received after successful authentication"
                    if self.state is SaslState.COMPLETE
                    else "SaslAuthenticate request received before SaslHandshake",
                    b"",
                )
            )
        return self._evaluate(token)

    def raw_token(self, frame: bytes) -> Awaitable[bytes | None]:
        """A bare token after SaslHandshake v0: answered by a bare size-framed token, or on
        failure by nothing (the connection is closed after the delay)."""
        return self._raw(frame)

    async def _raw(self, frame: bytes) -> bytes | None:
        outcome = await self._evaluate(frame)
        if outcome.error_code != ErrorCode.none:
            return None
        if self.authenticated:
            self.raw_tokens = False
        return _SIZE.pack(len(outcome.auth_bytes)) + outcome.auth_bytes

    async def _evaluate(self, token: bytes) -> AuthenticateOutcome:
        assert self._server is not None and self.sasl is not None
        if self._busy:
            # Clients wait for each challenge; a pipelined token is a broken client.
            self._fail()
            return AuthenticateOutcome(
                ErrorCode.illegal_sasl_state, "SASL token sent before the previous answer", b""
            )
        self._busy = True
        try:
            response = await self._server.evaluate(token)
        except SaslAuthenticationError as e:
            self._fail()
            self._log_failure(e.reason, e.username)
            # Kafka delays the answer and the close, which slows down password guessing.
            await asyncio.sleep(self.sasl.failed_authentication_delay_s)
            return AuthenticateOutcome(ErrorCode.sasl_authentication_failed, str(e), b"")
        finally:
            self._busy = False
        if self._server.complete:
            assert self._server.username is not None
            self.principal = user(self._server.username)
            self.state = SaslState.COMPLETE
            log.debug(
                "authenticated %s from %s on %s with %s",
                self.principal,
                self.peer,
                self.listener.name,
                self.mechanism,
            )
        return AuthenticateOutcome(ErrorCode.none, None, response)

    def _fail(self) -> None:
        self.state = SaslState.FAILED
        self.must_close = True
        if self.on_must_close is not None:
            self.on_must_close()

    def _log_failure(self, reason: str, username: str | None = None) -> None:
        principal = user(username) if username else self.principal
        log.info(
            "failed authentication of %r from %s on listener %s (%s): %s",
            str(principal),
            self.peer,
            self.listener.name,
            self.mechanism or "no mechanism",
            reason,
        )


async def _ready(outcome: AuthenticateOutcome) -> AuthenticateOutcome:
    return outcome
