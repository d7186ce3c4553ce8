"""The bytes of records a Fetch answer may hold (`fetch.max.bytes`): what the Fetch handler
fills and what the connection counts against the answers it queues before they are built."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request


def response_bytes_bound(fetch_max_bytes: int, request: Request) -> int:
    """The records bytes a Fetch may return: the request's max_bytes capped by the broker's
    fetch.max.bytes, whatever the client asks (only a first batch larger than that is returned
    whole, KIP-74). A body not decoded yet (big_requests.py) is bounded by the cap alone."""
    if request.body is None:
        return fetch_max_bytes
    asked = request.body.max_bytes if request.body.max_bytes > 0 else 0x7FFFFFFF
    return min(asked, fetch_max_bytes)
