"""ApiVersions (18): advertise exactly what is implemented (KIP-511 for unknown versions)."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.entities import build, sibling
from onceflow.protocol.messages import response_type

if TYPE_CHECKING:
    from onceflow.broker.handlers.context import SupportedVersions
    from onceflow.protocol.messages import Request


def handle_api_versions(supported: SupportedVersions, request: Request) -> Any:
    known = supported[ApiKey.API_VERSIONS]
    unsupported = not known[0] <= request.api_version <= known[1]
    cls = response_type(ApiKey.API_VERSIONS, 0 if unsupported else request.api_version)
    version_cls = sibling(cls, "ApiVersion")
    keys = tuple(
        version_cls(api_key=k, min_version=lo, max_version=hi)
        for k, (lo, hi) in sorted(supported.items())
    )
    return build(
        cls,
        error_code=ErrorCode.unsupported_version if unsupported else ErrorCode.none,
        api_keys=keys,
        throttle_time=datetime.timedelta(0),
        supported_features=(),
        finalized_features_epoch=-1,
        finalized_features=(),
        zk_migration_ready=False,
    )
