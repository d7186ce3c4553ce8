"""`listeners` and `advertised.listeners`, parsed as Kafka's KafkaConfig and SocketServer do.

A listener is NAME://HOST:PORT; its name maps to a security protocol through
`listener.security.protocol.map` (by default each protocol's own name). An empty host binds
every interface; port 0 asks the system for a free port.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class ListenerError(ValueError):
    """A listener setting that cannot be used; the message is one line for the operator."""


class SecurityProtocol(enum.Enum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


DEFAULT_PROTOCOL_MAP = ",".join(f"{p.value}:{p.value}" for p in SecurityProtocol)

# Kafka's CoreUtils.listenerListToEndPoints: NAME://HOST:PORT, the host possibly [IPv6] or empty.
_ENDPOINT = re.compile(r"^([a-zA-Z][\w.-]*)://(\[[0-9a-fA-F:.]+\]|[^:\[\]]*):(-?\d+)$")


@dataclass(frozen=True)
class Listener:
    name: str  # upper case, as Kafka's ListenerName.normalised
    protocol: SecurityProtocol
    host: str  # "" binds every interface
    port: int

    def url(self, port: int | None = None) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port if port is None else port}"


def parse_protocol_map(value: str) -> dict[str, SecurityProtocol]:
    """`listener.security.protocol.map`: NAME:PROTOCOL pairs."""
    out: dict[str, SecurityProtocol] = {}
    for item in _items(value):
        name, sep, protocol = item.partition(":")
        if not sep or not name.strip():
            raise ListenerError(
                f"listener.security.protocol.map: {item!r} is not LISTENER_NAME:SECURITY_PROTOCOL"
            )
        try:
            out[name.strip().upper()] = SecurityProtocol(protocol.strip().upper())
        except ValueError:
            raise ListenerError(
                f"listener.security.protocol.map: unknown security protocol {protocol.strip()!r} "
                f"(one of {', '.join(p.value for p in SecurityProtocol)})"
            ) from None
    return out


def parse_listeners(
    value: str, protocol_map: dict[str, SecurityProtocol], setting: str = "listeners"
) -> list[Listener]:
    """A comma list of NAME://HOST:PORT; names and (bound) ports must be distinct."""
    listeners = []
    for item in _items(value):
        match = _ENDPOINT.match(item)
        if match is None:
            raise ListenerError(f"{setting}: {item!r} is not LISTENER_NAME://HOST:PORT")
        name, host, port = match.group(1).upper(), match.group(2).strip("[]"), int(match.group(3))
        if not 0 <= port <= 65535:
            raise ListenerError(f"{setting}: port {port} of {item!r} is not in [0, 65535]")
        protocol = protocol_map.get(name)
        if protocol is None:
            raise ListenerError(
                f"{setting}: listener {name} has no security protocol "
                "(name it PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, or map it in "
                "listener.security.protocol.map)"
            )
        listeners.append(Listener(name, protocol, host, port))
    if not listeners:
        raise ListenerError(f"{setting}: no listener given")
    names = [listener.name for listener in listeners]
    if len(set(names)) != len(names):
        raise ListenerError(f"{setting}: each listener must have a distinct name ({value})")
    ports = [listener.port for listener in listeners if listener.port != 0]
    if setting == "listeners" and len(set(ports)) != len(ports):
        raise ListenerError(f"{setting}: each listener must have a distinct port ({value})")
    return listeners


def advertised_endpoints(
    listeners: list[Listener], advertised: list[Listener] | None, default_host: str | None
) -> dict[str, tuple[str, int]]:
    """Listener name -> (host, port) given to clients; port 0 means "the bound port".

    As Kafka: `advertised.listeners` names a subset of `listeners` (the others advertise their
    bind address); the meta-address 0.0.0.0 is never advertised.
    """
    out = {}
    by_name = {a.name: a for a in advertised or []}
    for name in by_name:
        if name not in {listener.name for listener in listeners}:
            raise ListenerError(
                f"advertised.listeners: listener {name} is not one of the listeners"
            )
    for listener in listeners:
        chosen = by_name.get(listener.name)
        host = chosen.host if chosen else (default_host or listener.host)
        port = chosen.port if chosen else 0
        if host in ("0.0.0.0", "::") and chosen is not None:
            raise ListenerError(
                "advertised.listeners cannot use the nonroutable meta-address 0.0.0.0; "
                "use a routable IP address or host name"
            )
        out[listener.name] = (host, port)
    return out


def _items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]
