"""Request parsing and response framing: golden bytes, KIP-511, hostile input."""

from __future__ import annotations

import contextlib
import datetime
import io
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.serial import entity_writer

from onceflow.broker.dispatch import supported_versions
from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.errors import (
    FrameTooLargeError,
    MalformedRequestError,
    ProtocolError,
    UnknownApiKeyError,
    UnsupportedVersionError,
)
from onceflow.protocol.framing import check_frame_size
from onceflow.protocol.messages import Request, encode_response, parse_request, response_type

SUPPORTED = supported_versions()


def header_v2(api_key: int, version: int, correlation_id: int, client_id: str | None) -> bytes:
    cid = (
        b"\xff\xff" if client_id is None else struct.pack(">h", len(client_id)) + client_id.encode()
    )
    return struct.pack(">hhi", api_key, version, correlation_id) + cid + b"\x00"


def body_bytes(entity: object) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def test_parse_flexible_request_golden() -> None:
    body = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name="orders"),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    frame = header_v2(ApiKey.METADATA, 12, 42, "cli") + body_bytes(body)
    request = parse_request(frame, SUPPORTED)
    assert (request.api_key, request.api_version, request.correlation_id) == (
        ApiKey.METADATA,
        12,
        42,
    )
    assert request.client_id == "cli" and request.flexible
    assert request.body == body


def test_api_versions_of_unknown_version_is_parsed_as_v0() -> None:
    frame = header_v2(ApiKey.API_VERSIONS, 99, 7, "future-client") + body_bytes(
        ApiVersionsRequest(client_software_name="x", client_software_version="1")
    )
    request = parse_request(frame, SUPPORTED)
    assert request.api_version == 99 and request.flexible
    assert type(request.body).__module__ == "kio.schema.api_versions.v0.request"


def test_unknown_api_key_and_version_are_refused() -> None:
    with pytest.raises(UnknownApiKeyError):
        parse_request(struct.pack(">hhih", 999, 0, 1, -1), SUPPORTED)
    _, high = SUPPORTED[ApiKey.METADATA]
    with pytest.raises(UnsupportedVersionError):
        parse_request(struct.pack(">hhih", ApiKey.METADATA, high + 1, 1, -1), SUPPORTED)


def test_truncated_body_is_malformed() -> None:
    frame = header_v2(ApiKey.METADATA, 12, 1, None) + b"\x05"  # claims 4 topics, has none
    with pytest.raises(MalformedRequestError):
        parse_request(frame, SUPPORTED)


def test_frame_size_checked_before_reading() -> None:
    check_frame_size(100, 100)
    with pytest.raises(FrameTooLargeError):
        check_frame_size(101, 100)
    with pytest.raises(ProtocolError):
        check_frame_size(-1, 100)


def test_response_header_versions() -> None:
    cls = response_type(ApiKey.API_VERSIONS, 3)
    body = cls(
        error_code=ErrorCode.none,
        api_keys=(),
        throttle_time=datetime.timedelta(0),
        supported_features=(),
        finalized_features_epoch=-1,
        finalized_features=(),
        zk_migration_ready=False,
    )
    flexible = Request(ApiKey.API_VERSIONS, 3, 9, None, None, True, 0)
    out = encode_response(flexible, body)
    # ApiVersions answers always carry header v0: size, correlation id, then the body.
    assert struct.unpack_from(">ii", out) == (len(out) - 4, 9)
    assert out[8:] == body_bytes(body)
    meta_cls = response_type(ApiKey.METADATA, 12)
    meta = meta_cls(
        throttle_time=datetime.timedelta(0),
        brokers=(),
        cluster_id=None,
        controller_id=-1,
        topics=(),
    )
    out = encode_response(Request(ApiKey.METADATA, 12, 5, None, None, True, 0), meta)
    assert out[8:9] == b"\x00" and out[9:] == body_bytes(meta)


@given(st.binary(max_size=300))
def test_random_frames_raise_only_protocol_errors(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        parse_request(data, SUPPORTED)


@given(st.sampled_from(sorted(SUPPORTED)), st.binary(max_size=200))
def test_random_bodies_for_every_api_raise_only_protocol_errors(api_key: int, body: bytes) -> None:
    low, high = SUPPORTED[api_key]
    for version in range(low, high + 1):
        with contextlib.suppress(ProtocolError):
            parse_request(header_v2(api_key, version, 1, "f") + body, SUPPORTED)
