"""ApiVersions (18): advertise exactly what is implemented (KIP-511 for unknown versions)."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.features import (
    NO_FEATURES,
    SUPPORTED_TRANSACTION_VERSIONS,
    TRANSACTION_VERSION,
)
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
    # v3+ (KIP-584): the features this broker supports and those finalized; an answer to an
    # unsupported version is v0, which has no room for them.
    features = getattr(supported, "features", NO_FEATURES)
    supported_features: tuple[Any, ...] = ()
    finalized: tuple[Any, ...] = ()
    if not unsupported and request.api_version >= 3:
        low, high = SUPPORTED_TRANSACTION_VERSIONS
        supported_features = (
            sibling(cls, "SupportedFeatureKey")(
                name=TRANSACTION_VERSION, min_version=low, max_version=high
            ),
        )
        finalized_cls = sibling(cls, "FinalizedFeatureKey")
        finalized = tuple(
            finalized_cls(name=name, max_version_level=level, min_version_level=level)
            for name, level in features.levels().items()
        )
    return build(
        cls,
        error_code=ErrorCode.unsupported_version if unsupported else ErrorCode.none,
        api_keys=keys,
        throttle_time=datetime.timedelta(0),
        supported_features=supported_features,
        finalized_features_epoch=features.epoch,
        finalized_features=finalized,
        zk_migration_ready=False,
    )
