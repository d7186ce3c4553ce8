"""TLS and SASL for onceflow's own protocol client, from librdkafka-named settings (what
`--command-config` gives every tool): the tools that speak the protocol themselves (the
transaction commands) then reach a secured broker as the confluent-kafka ones do."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from onceflow.security.scram import MECHANISMS, ScramClient, ScramError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISM_NAMES = ("PLAIN", *MECHANISMS)

# One SaslAuthenticate round trip: the client's bytes in, the server's bytes (or an error) out.
Exchange = Callable[[bytes], bytes]


class ClientSecurityError(ValueError):
    """Settings this client cannot use (an unknown protocol or mechanism, a missing user)."""


class AuthenticationError(Exception):
    """The broker refused the credentials, or proved to be the wrong server."""


@dataclass(frozen=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    tls: ssl.SSLContext | None = None

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> ClientSecurity:
        protocol = settings.get("security.protocol", "PLAINTEXT").upper()
        if protocol not in PROTOCOLS:
            raise ClientSecurityError(f"security.protocol={protocol} is not one of {PROTOCOLS}")
        tls = _tls_context(settings) if protocol in ("SSL", "SASL_SSL") else None
        if not protocol.startswith("SASL_"):
            return cls(protocol, tls=tls)
        mechanism = settings.get("sasl.mechanism", settings.get("sasl.mechanisms", "")).upper()
        if mechanism not in MECHANISM_NAMES:
            raise ClientSecurityError(f"sasl.mechanism={mechanism} is not one of {MECHANISM_NAMES}")
        username, password = settings.get("sasl.username"), settings.get("sasl.password")
        if username is None or password is None:
            raise ClientSecurityError(f"{protocol} needs sasl.username and sasl.password")
        return cls(protocol, mechanism, username, password, tls)

    def wrap(self, sock: socket.socket, host: str) -> socket.socket:
        """The socket as this protocol needs it (TLS handshake done), or as it is."""
        if self.tls is None:
            return sock
        return self.tls.wrap_socket(sock, server_hostname=host)

    def authenticate(self, exchange: Exchange) -> None:
        """Run the SASL exchange (after SaslHandshake chose the mechanism)."""
        assert self.mechanism is not None and self.username is not None
        assert self.password is not None
        if self.mechanism == "PLAIN":
            exchange(f"\0{self.username}\0{self.password}".encode())
            return
        client = ScramClient(MECHANISMS[self.mechanism], self.username, self.password)
        try:
            client.verify(exchange(client.final(exchange(client.first()))))
        except ScramError as e:
            raise AuthenticationError(str(e)) from None


def _tls_context(settings: Mapping[str, str]) -> ssl.SSLContext:
    """librdkafka's settings as Python's: CA file, client certificate and key, host check."""
    try:
        context = ssl.create_default_context(cafile=settings.get("ssl.ca.location"))
        certificate = settings.get("ssl.certificate.location")
        if certificate:
            context.load_cert_chain(
                certificate,
                settings.get("ssl.key.location") or None,
                password=settings.get("ssl.key.password"),
            )
    except (OSError, ssl.SSLError) as e:
        raise ClientSecurityError(f"TLS settings: {e}") from None
    if settings.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        context.check_hostname = False
    return context
