"""Request parsing and response encoding with the `kio` entities.

Headers are read by hand (they are tiny and on every request); bodies go through kio's native
readers and writers, cached per (api key, version).

A body declaring more than SYNC_ELEMENTS array elements is not decoded by `parse_request`: its
walk and decoding take about a microsecond per element (0.33 s for a 3.4 MB ListOffsets), too
long for the event loop, so the request carries it `unparsed` for `decode_body` to run off the
loop; likewise `encode_body` encodes a big response ahead of `encode_response`.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError

from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.bounds import ElementBudgetExceeded, check_lengths, skip_tagged_fields
from onceflow.protocol.errors import (
    MalformedRequestError,
    UnknownApiKeyError,
    UnsupportedVersionError,
)

_HEADER_START = struct.Struct(">hhih")
_CORRELATION = struct.Struct(">i")

# Array elements a body may declare and still be decoded at once, on the event loop: a few
# milliseconds of walking and decoding. Produce and Fetch of a client stay far below it.
SYNC_ELEMENTS = 5_000


@dataclass(frozen=True, slots=True)
class UnparsedBody:
    """A request body too big to decode on the event loop, as it came: see `decode_body`."""

    cls: type
    reader: Any
    frame: bytes
    pos: int
    api_key: int
    version: int


@dataclass(frozen=True, slots=True)
class EncodedBody:
    """A response body encoded ahead (`encode_body`): `encode_response` writes it as it is."""

    data: bytes


@dataclass(slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any
    flexible: bool
    size: int
    client_host: str = ""
    # The connection's security session (onceflow.security.session.Session): listener and
    # principal, for the handlers that need them (Metadata's endpoints, SASL, an authorizer).
    session: Any = None
    # A body too big to decode on the event loop (then `body` is None until decode_body).
    unparsed: UnparsedBody | None = None


@cache
def _request_codec(api_key: int, version: int) -> tuple[type, Any, bool]:
    cls = load_request_schema(api_key, version)
    return cls, entity_reader(cls), bool(cls.__flexible__)


@cache
def response_type(api_key: int, version: int) -> type:
    return load_response_schema(api_key, version)


@cache
def _response_writer(cls: type) -> Any:
    return entity_writer(cls)


def parse_request(frame: bytes, supported: dict[int, tuple[int, int]]) -> Request:
    """Parse one request frame (without its size prefix).

    An ApiVersions request of a version this broker does not know is parsed as v0 (KIP-511) so
    that it can be answered with UNSUPPORTED_VERSION and the supported ranges.
    """
    if len(frame) < 10:
        raise MalformedRequestError(f"request of {len(frame)} bytes is too short for a header")
    api_key, version, correlation_id, client_id_len = _HEADER_START.unpack_from(frame, 0)
    if api_key not in supported:
        raise UnknownApiKeyError(f"unknown or unsupported API key {api_key}")
    low, high = supported[api_key]
    body_version = version
    if not low <= version <= high:
        if api_key != ApiKey.API_VERSIONS:
            raise UnsupportedVersionError(f"API {api_key} version {version} not in [{low}, {high}]")
        body_version = 0
    try:
        cls, reader, flexible = _request_codec(api_key, body_version)
    except (UnknownAPIKey, UnknownEntity) as e:
        raise UnsupportedVersionError(str(e)) from None
    if api_key == ApiKey.API_VERSIONS and body_version != version:
        flexible = version >= 3
    pos = 10
    client_id: str | None = None
    if client_id_len >= 0:
        if pos + client_id_len > len(frame):
            raise MalformedRequestError("client id runs past the end of the request")
        client_id = frame[pos : pos + client_id_len].decode("utf-8", "replace")
        pos += client_id_len
    if flexible:
        pos = skip_tagged_fields(frame, pos)
    if api_key == ApiKey.API_VERSIONS and body_version != version:
        return Request(api_key, version, correlation_id, client_id, cls(), flexible, len(frame))
    unparsed = UnparsedBody(cls, reader, frame, pos, api_key, version)
    try:
        body = _read_body(unparsed, SYNC_ELEMENTS)
    except ElementBudgetExceeded:
        request = Request(api_key, version, correlation_id, client_id, None, flexible, len(frame))
        request.unparsed = unparsed
        return request
    return Request(api_key, version, correlation_id, client_id, body, flexible, len(frame))


def decode_body(unparsed: UnparsedBody) -> Any:
    """The body `parse_request` left unparsed, checked and decoded; MalformedRequestError as
    parse_request raises it. Pure: safe to run in a worker thread."""
    return _read_body(unparsed, None)


def _read_body(unparsed: UnparsedBody, max_elements: int | None) -> Any:
    frame, pos = unparsed.frame, unparsed.pos
    try:
        check_lengths(unparsed.cls, frame, pos, max_elements)  # before kio trusts a count
        body, _ = unparsed.reader(frame, pos)
    except (
        MalformedRequestError,
        SerialError,
        ValueError,
        TypeError,
        KeyError,
        UnicodeDecodeError,
        OverflowError,
    ) as e:
        raise MalformedRequestError(
            f"API {unparsed.api_key} v{unparsed.version} body: {e}"
        ) from None
    return body


def encode_body(body: Any) -> EncodedBody:
    """A response body encoded now, for `encode_response` to frame. Pure: safe to run in a
    worker thread (kio entities are immutable)."""
    buf = io.BytesIO()
    _response_writer(type(body))(buf, body)
    return EncodedBody(buf.getvalue())


def encode_response(request: Request, body: Any) -> bytes:
    """Frame a response: size, header (v0, or v1 with tagged fields when flexible), body."""
    buf = io.BytesIO()
    buf.write(b"\x00\x00\x00\x00")
    buf.write(_CORRELATION.pack(request.correlation_id))
    # ApiVersions responses always use header v0 so that any client can read them.
    if request.flexible and request.api_key != ApiKey.API_VERSIONS:
        buf.write(b"\x00")
    if isinstance(body, EncodedBody):
        buf.write(body.data)
    else:
        _response_writer(type(body))(buf, body)
    out = buf.getbuffer()
    struct.pack_into(">i", out, 0, len(out) - 4)
    return bytes(out)
