"""The table of implemented APIs: key, version range, handler.

A handler runs synchronously in arrival order (so state changes happen in the order requests
arrived on a connection) and returns the response, an awaitable of it (fsync, long poll,
rebalance), or None when no response is due (Produce with acks=0).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.index import load_request_schema

if TYPE_CHECKING:
    from onceflow.broker.server import Broker
    from onceflow.protocol.messages import Request

HandlerResult = Any | Awaitable[Any] | None
Handler = Callable[["Broker", "Request"], HandlerResult]


@dataclass(frozen=True)
class ApiHandler:
    api_key: int
    min_version: int
    max_version: int
    handle: Handler


HANDLERS: dict[int, ApiHandler] = {}


def api(
    api_key: int, min_version: int, max_version: int, parsed_from: int | None = None
) -> Callable[[Handler], Handler]:
    """Register a handler. Versions below `parsed_from` are advertised (as Kafka does for
    Produce v0, see KAFKA-18659) but their requests are refused by closing the connection."""

    def register(fn: Handler) -> Handler:
        for version in range(parsed_from or min_version, max_version + 1):
            load_request_schema(api_key, version)  # fails at import if kio lacks a version
        HANDLERS[api_key] = ApiHandler(api_key, min_version, max_version, fn)
        return fn

    return register


def supported_versions() -> dict[int, tuple[int, int]]:
    return {k: (h.min_version, h.max_version) for k, h in HANDLERS.items()}
