"""DescribeClientQuotas: onceflow has no client quotas, so a well-formed filter matches no
entity; a malformed one gets Kafka's refusal (ClientQuotasImage.describe), and a principal
without DESCRIBE_CONFIGS on the Cluster CLUSTER_AUTHORIZATION_FAILED."""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.describe_client_quotas.v1.request import ComponentData, DescribeClientQuotasRequest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8

from tests.admin_requests import call


def describe(bootstrap: str, *components: tuple[str, int, str | None]) -> Any:
    request = DescribeClientQuotasRequest(
        components=tuple(
            ComponentData(entity_type=t, match_type=i8(m), match=name) for t, m, name in components
        ),
        strict=False,
    )
    return call(bootstrap, request)


@pytest.mark.parametrize(
    "components",
    [
        (),
        (("user", 0, "alice"),),
        (("user", 1, None), ("client-id", 2, None)),
        (("ip", 0, "127.0.0.1"),),
    ],
)
def test_a_filter_matches_no_entity(bootstrap: str, components: Any) -> None:
    answer = describe(bootstrap, *components)
    assert (answer.error_code, answer.entries) == (ErrorCode.none, ())


@pytest.mark.parametrize(
    ("components", "error", "message"),
    [
        ((("user", 0, None),), ErrorCode.invalid_request, "MATCH_TYPE_EXACT"),
        ((("user", 1, "alice"),), ErrorCode.invalid_request, "MATCH_TYPE_DEFAULT"),
        ((("user", 2, None), ("user", 0, "x")), ErrorCode.invalid_request, "more than once"),
        ((("group", 0, "g"),), ErrorCode.unsupported_version, "Unsupported entity type"),
        ((("user", 7, None),), ErrorCode.unsupported_version, "Unsupported match type"),
        ((("ip", 2, None), ("user", 2, None)), ErrorCode.invalid_request, "IP filter"),
    ],
)
def test_a_malformed_filter_is_refused(
    bootstrap: str, components: Any, error: ErrorCode, message: str
) -> None:
    answer = describe(bootstrap, *components)
    assert answer.error_code == error
    assert message in answer.error_message
    assert answer.entries is None
