"""Structure-aware fuzzing of the request parser, in process, for every advertised API version.

Valid requests of every (API key, version) the broker advertises are built with kio's entities
(Produce carrying real record batches), encoded as a client frames them, then mutated the way
a buggy or hostile client would break them: a length or count prefix (int16, int32 or unsigned
varint) set to a boundary value, a cut, bytes inserted or dropped, a splice with another valid
request of the same API, a header naming another version. Only ProtocolError subclasses may
come out of the parser; for a Produce request that still parses, only RecordsError subclasses
may come out of the produce validation of each partition's records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import struct
import types
import typing
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema
from kio.serial import entity_writer
from kio.static.primitive import Records, i64Timedelta

from onceflow.broker.dispatch import supported_versions
from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.errors import ProtocolError
from onceflow.protocol.messages import parse_request
from onceflow.records.builder import build_batch
from onceflow.records.errors import RecordsError
from onceflow.records.validation import validate_produce

SUPPORTED = supported_versions()


def _schema(api_key: int, version: int) -> type | None:
    try:
        return load_request_schema(api_key, version)
    except (UnknownAPIKey, UnknownEntity):
        return None


# Every advertised (key, version): with its kio schema, or None when the broker refuses it
# before parsing (Produce v0-2 are advertised for librdkafka but answered UNSUPPORTED_VERSION).
ADVERTISED = [
    (key, version, _schema(key, version))
    for key, (low, high) in sorted(SUPPORTED.items())
    for version in range(low, high + 1)
]
PARSEABLE = [(key, version, cls) for key, version, cls in ADVERTISED if cls is not None]

record_batches = st.builds(
    lambda values, pid: build_batch(
        [(None, v, (), 1_700_000_000_000) for v in values],
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=0 if pid >= 0 else -1,
    ),
    st.lists(st.binary(max_size=16), min_size=1, max_size=3),
    st.sampled_from([-1, 7]),
).map(Records)


def _strategy(hint: Any) -> st.SearchStrategy[Any]:
    """kio's registered strategies, except for record batches, which are real ones here."""
    if hint is Records:
        return record_batches
    if hint is i64Timedelta:
        # kio's registered strategy draws milliseconds up to timedelta.max, but its native
        # reader goes through a double of microseconds: past 2**53 of them it rounds, then
        # overflows ("timedelta milliseconds overflow"). Keep to what it reads back exactly
        # (285 years either way).
        bound = 2**53 // 1000
        return st.integers(-bound, bound).map(
            lambda ms: i64Timedelta.parse(datetime.timedelta(milliseconds=ms))
        )
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(_strategy(args[0]), max_size=2).map(tuple)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_strategy(a) for a in args))
    if hint is type(None):
        return st.none()
    if dataclasses.is_dataclass(hint):
        return entities(hint)  # type: ignore[arg-type]
    return st.from_type(hint)


def entities(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: _strategy(hints[f.name]) for f in dataclasses.fields(cls) if f.init}
    return st.builds(cls, **fields)


def frame_of(request: Any, version: int | None = None, client_id: str | None = "fuzz") -> bytes:
    """A request as a client frames it (without the size prefix): header v1 or v2, body."""
    cls = type(request)
    buf = io.BytesIO()
    entity_writer(cls)(buf, request)
    head = struct.pack(">hhi", cls.__api_key__, cls.__version__ if version is None else version, 7)
    if client_id is None:
        head += struct.pack(">h", -1)
    else:
        raw = client_id.encode()
        head += struct.pack(">h", len(raw)) + raw
    if cls.__flexible__:
        head += b"\x00"  # no tagged fields in the header
    return head + buf.getvalue()


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# Encodings a length or count prefix may be set to: the boundaries of each integer type.
PREFIXES = [struct.pack(">h", v) for v in (-1, -2, 0, 1, 0x7FFF, -0x8000)]
PREFIXES += [struct.pack(">i", v) for v in (-1, -2, 0, 1, 0x7FFFFFFF, -0x80000000, 1 << 20)]
PREFIXES += [_uvarint(v) for v in (0, 1, 2, 0x7F, 0x80, 0x3FFF, 1 << 28, 1 << 35)]
PREFIXES += [b"\xff" * 5, b"\x80" * 10]

mutation = st.one_of(
    st.tuples(st.just("prefix"), st.integers(0, 4096), st.sampled_from(PREFIXES)),
    st.tuples(st.just("cut"), st.integers(0, 4096), st.none()),
    st.tuples(st.just("insert"), st.integers(0, 4096), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("drop"), st.integers(0, 4096), st.integers(1, 8)),
    st.tuples(st.just("byte"), st.integers(0, 4096), st.integers(0, 255)),
)


def mutate(frame: bytes, edits: list[tuple[str, int, Any]]) -> bytes:
    data = bytearray(frame)
    for kind, where, arg in edits:
        # the first 8 bytes (API key, version, correlation id) have their own test
        i = 8 + where % max(len(data) - 7, 1)
        if kind == "prefix":
            data[i : i + len(arg)] = arg
        elif kind == "cut":
            del data[i:]
        elif kind == "insert":
            data[i:i] = arg
        elif kind == "drop":
            del data[i : i + arg]
        else:
            if i < len(data):
                data[i] = arg
    return bytes(data)


def parse_typed(frame: bytes) -> None:
    """Parse like the broker does; only the typed errors may escape."""
    try:
        request = parse_request(frame, SUPPORTED)
    except ProtocolError:
        return
    if request.api_key == ApiKey.PRODUCE:
        for topic in request.body.topic_data:
            for partition in topic.partition_data:
                if partition.records:
                    with contextlib.suppress(RecordsError):
                        validate_produce(partition.records, deep=True)


@st.composite
def valid_requests(draw: st.DrawFn) -> tuple[int, int, Any]:
    key, version, cls = draw(st.sampled_from(PARSEABLE))
    return key, version, draw(entities(cls))


fuzz = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_every_advertised_version_is_covered() -> None:
    refused = [(key, version) for key, version, cls in ADVERTISED if cls is None]
    # Only Produce v0-2 are advertised without being parsed (KAFKA-18659's quirk).
    assert refused == [(ApiKey.PRODUCE, v) for v in (0, 1, 2)]


@fuzz
@given(valid_requests())
def test_valid_requests_parse_back(request: tuple[int, int, Any]) -> None:
    key, version, body = request
    parsed = parse_request(frame_of(body), SUPPORTED)
    assert (parsed.api_key, parsed.api_version, parsed.correlation_id) == (key, version, 7)
    assert parsed.body == body


@fuzz
@given(valid_requests(), st.lists(mutation, min_size=1, max_size=4))
def test_mutated_requests_raise_only_protocol_errors(
    request: tuple[int, int, Any], edits: list[tuple[str, int, Any]]
) -> None:
    parse_typed(mutate(frame_of(request[2]), edits))


@fuzz
@given(valid_requests(), st.data())
def test_spliced_requests_of_one_api(request: tuple[int, int, Any], data: st.DataObject) -> None:
    body = request[2]
    other = data.draw(entities(type(body)))
    a, b = frame_of(body), frame_of(other)
    cut_a = data.draw(st.integers(8, len(a)))
    cut_b = data.draw(st.integers(8, len(b)))
    parse_typed(a[:cut_a] + b[cut_b:])


@fuzz
@given(valid_requests(), st.integers(-2, 20), st.sampled_from([None, "", "c" * 300]))
def test_bodies_under_another_versions_header(
    request: tuple[int, int, Any], version: int, client_id: str | None
) -> None:
    # A body of one version announced as another: every advertised version of the API, and
    # versions outside the range, flexible and not.
    parse_typed(frame_of(request[2], version=version, client_id=client_id))
