"""SCRAM (RFC 5802, RFC 7677) as Kafka's ScramSaslServer and ScramFormatter do it; sans-IO.

The broker keeps only what RFC 5802 lets a server keep: the salt, the iteration count, and the
stored and server keys derived from the salted password; never a password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass


class ScramError(ValueError):
    """A SCRAM message that is malformed or does not prove the credential."""


@dataclass(frozen=True)
class ScramMechanism:
    name: str
    hash_name: str
    type_id: int  # Kafka's ScramMechanism type, as AlterUserScramCredentials carries it
    min_iterations: int = 4096  # Kafka's minimum (ScramMechanism.minIterations)
    max_iterations: int = 16384  # Kafka's maximum accepted by AlterUserScramCredentials

    @property
    def key_length(self) -> int:
        return hashlib.new(self.hash_name).digest_size


SCRAM_SHA_256 = ScramMechanism("SCRAM-SHA-256", "sha256", 1)
SCRAM_SHA_512 = ScramMechanism("SCRAM-SHA-512", "sha512", 2)
MECHANISMS = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
BY_TYPE = {m.type_id: m for m in MECHANISMS.values()}
DEFAULT_ITERATIONS = 8192  # what kafka-configs and the Java admin client use


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def salted_password(
    mechanism: ScramMechanism, password: str, salt: bytes, iterations: int
) -> bytes:
    """Hi(Normalize(password), salt, i): PBKDF2 with the mechanism's HMAC (RFC 5802 2.2).
    SASLprep is left out, as Kafka's ScramFormatter does (it uses the UTF-8 bytes)."""
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode(), salt, iterations)


def credential_from_salted(
    mechanism: ScramMechanism, salted: bytes, salt: bytes, iterations: int
) -> ScramCredential:
    client_key = _hmac(mechanism, salted, b"Client Key")
    return ScramCredential(
        salt=salt,
        stored_key=hashlib.new(mechanism.hash_name, client_key).digest(),
        server_key=_hmac(mechanism, salted, b"Server Key"),
        iterations=iterations,
    )


def new_credential(
    mechanism: ScramMechanism, password: str, iterations: int = DEFAULT_ITERATIONS
) -> ScramCredential:
    """A credential for a password, with a fresh random salt."""
    salt = os.urandom(mechanism.key_length)
    return credential_from_salted(
        mechanism, salted_password(mechanism, password, salt, iterations), salt, iterations
    )


def password_matches(mechanism: ScramMechanism, credential: ScramCredential, password: str) -> bool:
    """Does `password` derive this credential's stored key? (PLAIN against the SCRAM store;
    constant time in the comparison.)"""
    salted = salted_password(mechanism, password, credential.salt, credential.iterations)
    derived = credential_from_salted(mechanism, salted, credential.salt, credential.iterations)
    return hmac.compare_digest(derived.stored_key, credential.stored_key)


class ScramServer:
    """One SCRAM exchange: client-first -> server-first, client-final -> server-final.

    `lookup(username)` gives the user's credential for this mechanism, or None. Every failure
    raises ScramError; which one is for the log, never for the client (Kafka answers every
    credential failure with the same message, so that a client cannot probe for users).
    """

    def __init__(
        self, mechanism: ScramMechanism, lookup: Callable[[str], ScramCredential | None]
    ) -> None:
        self.mechanism = mechanism
        self._lookup = lookup
        self.username: str | None = None
        self.complete = False
        self._credential: ScramCredential | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2_header = ""
        self._nonce = ""

    def evaluate(self, token: bytes) -> bytes:
        if self.complete:
            raise ScramError("the SCRAM exchange is already complete")
        if self._credential is None:
            return self._client_first(token)
        return self._client_final(token)

    def _client_first(self, token: bytes) -> bytes:
        message = _decode(token)
        # gs2-header: channel binding flag "n" or "y" (no binding), optional authzid, then ","
        flag, sep, rest = message.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not sep or not sep2 or flag not in ("n", "y"):
            raise ScramError("client-first message has no valid gs2 header (channel binding?)")
        attributes = _attributes(bare)
        if "m" in attributes:
            raise ScramError("client-first message asks for a mandatory extension")
        try:
            username = _saslname(attributes["n"])
            client_nonce = attributes["r"]
        except KeyError:
            raise ScramError("client-first message lacks n= or r=") from None
        if authzid and _saslname(authzid.removeprefix("a=")) != username:
            raise ScramError("authorization id differs from the user name")
        if _extensions(bare).get("tokenauth", "false").lower() == "true":
            raise ScramError("delegation tokens are not supported")
        self.username = username
        credential = self._lookup(username)
        if credential is None:
            raise ScramError(f"no {self.mechanism.name} credential for user {username!r}")
        self._credential = credential
        self._gs2_header = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._nonce = client_nonce + secrets.token_urlsafe(24)
        salt = base64.b64encode(credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        return self._server_first.encode()

    def _client_final(self, token: bytes) -> bytes:
        assert self._credential is not None
        message = _decode(token)
        without_proof, sep, proof_part = message.rpartition(",p=")
        if not sep:
            raise ScramError("client-final message has no proof")
        attributes = _attributes(without_proof)
        expected_binding = base64.b64encode(self._gs2_header.encode()).decode()
        if attributes.get("c") != expected_binding:
            raise ScramError("client-final message has the wrong channel binding")
        if attributes.get("r") != self._nonce:
            raise ScramError("client-final message has the wrong nonce")
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            raise ScramError("client proof is not base64") from None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        credential = self._credential
        signature = _hmac(self.mechanism, credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError("client proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        stored = hashlib.new(self.mechanism.hash_name, client_key).digest()
        if not hmac.compare_digest(stored, credential.stored_key):
            raise ScramError(f"invalid proof for user {self.username!r}")
        self.complete = True
        server_signature = _hmac(self.mechanism, credential.server_key, auth_message)
        return b"v=" + base64.b64encode(server_signature)


class ScramClient:
    """The client's side of one exchange (onceflow's own protocol client): first(), then
    final(server-first), then verify(server-final), which checks the server's signature."""

    def __init__(self, mechanism: ScramMechanism, username: str, password: str) -> None:
        self.mechanism = mechanism
        self._password = password
        name = username.replace("=", "=3D").replace(",", "=2C")
        self._client_first_bare = f"n={name},r={secrets.token_urlsafe(24)}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self._client_first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        message = _decode(server_first)
        attributes = _attributes(message)
        nonce = attributes.get("r", "")
        own_nonce = self._client_first_bare.rpartition("r=")[2]
        if not nonce.startswith(own_nonce):
            raise ScramError("server-first message does not extend the client's nonce")
        try:
            salt = base64.b64decode(attributes["s"], validate=True)
            iterations = int(attributes["i"])
        except (KeyError, ValueError):
            raise ScramError("server-first message lacks a valid salt or iteration count") from None
        if iterations < self.mechanism.min_iterations:
            raise ScramError(f"server asks for {iterations} iterations, under the minimum")
        salted = salted_password(self.mechanism, self._password, salt, iterations)
        without_proof = f"c={base64.b64encode(b'n,,').decode()},r={nonce}"
        auth_message = f"{self._client_first_bare},{message},{without_proof}".encode()
        client_key = _hmac(self.mechanism, salted, b"Client Key")
        stored_key = hashlib.new(self.mechanism.hash_name, client_key).digest()
        signature = _hmac(self.mechanism, stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = _hmac(self.mechanism, salted, b"Server Key")
        self._server_signature = _hmac(self.mechanism, server_key, auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        attributes = _attributes(_decode(server_final))
        if "e" in attributes:
            raise ScramError(f"the server refused the proof: {attributes['e']}")
        signature = base64.b64decode(attributes.get("v", ""))
        if not hmac.compare_digest(signature, self._server_signature):
            raise ScramError("the server's signature does not match: not the real server")


def _hmac(mechanism: ScramMechanism, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, mechanism.hash_name).digest()


def _decode(token: bytes) -> str:
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("SCRAM message is not UTF-8") from None


def _attributes(message: str) -> dict[str, str]:
    out = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            continue  # extensions (multi-letter keys) are read by _extensions
        out.setdefault(key, value)
    return out


def _extensions(message: str) -> dict[str, str]:
    out = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if sep and len(key) > 1:
            out[key] = value
    return out


def _saslname(value: str) -> str:
    """RFC 5802 5.1: ',' and '=' are sent as =2C and =3D; any other '=' is malformed."""
    out = []
    i = 0
    while i < len(value):
        if value[i] == "=":
            code = value[i : i + 3]
            if code == "=2C":
                out.append(",")
            elif code == "=3D":
                out.append("=")
            else:
                raise ScramError("user name has an invalid '=' escape")
            i += 3
        else:
            out.append(value[i])
            i += 1
    return "".join(out)
