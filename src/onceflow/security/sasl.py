"""The SASL mechanisms' server side: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (scram.py), both
checked against the SCRAM credential store, as Kafka's PlainSaslServer and ScramSaslServer.

A failure raises SaslAuthenticationError with the message the client gets (Kafka's) and the
reason that is logged; neither ever holds a password.
"""

from __future__ import annotations

import asyncio
from functools import cache, partial

from onceflow.security.credentials import CredentialStore
from onceflow.security.scram import (
    MECHANISMS,
    SCRAM_SHA_256,
    ScramCredential,
    ScramError,
    ScramMechanism,
    ScramServer,
    new_credential,
    password_matches,
)

PLAIN = "PLAIN"
SUPPORTED_MECHANISMS = (PLAIN, *MECHANISMS)


# PLAIN's user not found: the password is still derived (against this), so that the time taken
# does not tell a client which users exist.
@cache
def _decoy() -> ScramCredential:
    return new_credential(SCRAM_SHA_256, "onceflow-decoy", SCRAM_SHA_256.min_iterations)


class SaslAuthenticationError(Exception):
    """Credentials that do not authenticate: `str()` is for the client, `reason` for the log."""

    def __init__(self, client_message: str, reason: str, username: str | None) -> None:
        super().__init__(client_message)
        self.reason = reason
        self.username = username


class MechanismServer:
    """One authentication exchange of one mechanism."""

    mechanism: str
    username: str | None = None
    complete: bool = False

    async def evaluate(self, token: bytes) -> bytes:
        raise NotImplementedError


class PlainServer(MechanismServer):
    mechanism = PLAIN

    def __init__(self, credentials: CredentialStore) -> None:
        self._credentials = credentials

    async def evaluate(self, token: bytes) -> bytes:
        # authzid NUL authcid NUL passwd (RFC 4616)
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise self._fail("Invalid SASL/PLAIN response: expected 3 tokens", "malformed")
        try:
            authzid, username, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise self._fail("Invalid SASL/PLAIN response: not UTF-8", "malformed") from None
        if not username:
            raise self._fail("Authentication failed: username not specified", "no username")
        self.username = username
        if not password:
            raise self._fail("Authentication failed: password not specified", "no password")
        if authzid and authzid != username:
            raise self._fail(
                "Authentication failed: Client requested an authorization id that is "
                "different from username",
                "authorization id differs from the user name",
            )
        stored = self._credentials.credentials_of(username)
        name, credential = next(iter(sorted(stored.items())), (SCRAM_SHA_256.name, _decoy()))
        # PBKDF2 costs milliseconds per thousand iterations: off the event loop.
        matches = await asyncio.to_thread(password_matches, MECHANISMS[name], credential, password)
        if not stored or not matches:
            reason = "unknown user" if not stored else "wrong password"
            raise self._fail("Authentication failed: Invalid username or password", reason)
        self.complete = True
        return b""

    def _fail(self, message: str, reason: str) -> SaslAuthenticationError:
        return SaslAuthenticationError(message, reason, self.username)


class ScramMechanismServer(MechanismServer):
    def __init__(self, mechanism: str, credentials: CredentialStore) -> None:
        self.mechanism = mechanism
        scram = MECHANISMS[mechanism]
        self._server = ScramServer(scram, partial(_lookup, credentials, scram))

    async def evaluate(self, token: bytes) -> bytes:
        try:
            response = self._server.evaluate(token)
        except ScramError as e:
            # Kafka's answer to every SCRAM failure: nothing about which check failed.
            raise SaslAuthenticationError(
                "Authentication failed during authentication due to invalid credentials "
                f"with SASL mechanism {self.mechanism}",
                str(e),
                self._server.username,
            ) from None
        finally:
            self.username = self._server.username
        self.complete = self._server.complete
        return response


def _lookup(
    credentials: CredentialStore, mechanism: ScramMechanism, user: str
) -> ScramCredential | None:
    return credentials.get(user, mechanism)


def mechanism_server(mechanism: str, credentials: CredentialStore) -> MechanismServer:
    if mechanism == PLAIN:
        return PlainServer(credentials)
    return ScramMechanismServer(mechanism, credentials)
