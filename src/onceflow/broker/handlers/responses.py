"""Response building shared by the handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from onceflow.protocol.messages import response_type

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request


def response_class(request: Request) -> type:
    """The response entity of the request's API, at the request's version."""
    return response_type(request.api_key, request.api_version)
