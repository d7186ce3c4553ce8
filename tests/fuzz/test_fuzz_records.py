"""Structure-aware fuzzing of the record batch decoder (tests/records has the byte-level one).

Valid batches of every shape (codecs, headers, null keys and values, transactional, control)
are mutated field by field: a header field set to a boundary value, a varint inside a record set
to a boundary value, records re-compressed after the edit, batches chained. The CRC and the
batch length are fixed afterwards (most of the time), so the mutation reaches the parser behind
them. Only RecordsError subclasses may come out; and whatever validate_produce accepts must be
storable and served back intact by a real PartitionLog.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import struct
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceflow.log.config import LogConfig
from onceflow.log.partition_log import PartitionLog
from onceflow.records.batch import CRC_START, HEADER_SIZE, compute_crc, iter_batches
from onceflow.records.builder import build_batch
from onceflow.records.compression import compress
from onceflow.records.control import build_marker, parse_control_record
from onceflow.records.decompression import decompress
from onceflow.records.errors import RecordsError
from onceflow.records.record import decode_batch, iter_decoded_batches
from onceflow.records.validation import validate_produce
from onceflow.records.varint import encode_varint

# (offset in the header, struct format) of every field; length and CRC are fixed afterwards
HEADER_FIELDS = [
    (0, ">q"),  # base offset
    (8, ">i"),  # batch length
    (12, ">i"),  # partition leader epoch
    (16, ">b"),  # magic
    (17, ">I"),  # crc
    (21, ">h"),  # attributes
    (23, ">i"),  # last offset delta
    (27, ">q"),  # base timestamp
    (35, ">q"),  # max timestamp
    (43, ">q"),  # producer id
    (51, ">h"),  # producer epoch
    (53, ">i"),  # base sequence
    (57, ">i"),  # records count
]
BOUNDARY = [0, 1, -1, 2, 5, 7, 8, 0x20, 0x30, 0x7F, 0x80, 0xFF, 0x7FFF, -0x8000, 0x7FFFFFFF]
BOUNDARY += [-0x80000000, 2**62, -(2**63), 2**63 - 1]

header = st.tuples(st.text(max_size=4), st.one_of(st.none(), st.binary(max_size=6)))
records = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=12)),
        st.one_of(st.none(), st.binary(max_size=24)),
        st.lists(header, max_size=2).map(tuple),
        st.integers(0, 2**41),
    ),
    min_size=1,
    max_size=5,
)


@st.composite
def valid_batches(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return build_marker(
            draw(st.integers(0, 2**40)),
            draw(st.integers(0, 2**15 - 1)),
            draw(st.booleans()),
            draw(st.integers(0, 2**31 - 1)),
            draw(st.integers(0, 2**41)),
        )
    has_producer = draw(st.booleans())
    return build_batch(
        draw(records),
        compression=draw(st.integers(0, 4)),
        producer_id=draw(st.integers(0, 2**40)) if has_producer else -1,
        producer_epoch=draw(st.integers(0, 2**15 - 1)) if has_producer else -1,
        base_sequence=draw(st.integers(0, 2**31 - 1)) if has_producer else -1,
        transactional=has_producer and draw(st.booleans()),
        timestamp_type=draw(st.integers(0, 1)),
    )


def fix(data: bytearray, *, length: bool = True) -> bytes:
    """Make the length and CRC match the (mutated) bytes, so parsing goes past them."""
    if length and len(data) >= 12:
        struct.pack_into(">i", data, 8, len(data) - 12)
    if len(data) >= HEADER_SIZE:
        struct.pack_into(">I", data, 17, compute_crc(data, 0, len(data)))
    return bytes(data)


def decode_everything(data: bytes) -> None:
    """Every reader of batch bytes; only RecordsError may come out."""
    for call in (
        lambda: decode_batch(data),
        lambda: list(iter_decoded_batches(data, verify_crc=False)),
        lambda: list(iter_batches(data)),
        lambda: validate_produce(data, deep=True),
        lambda: validate_produce(data, deep=True, single_batch=False),
    ):
        with contextlib.suppress(RecordsError):
            call()
    with contextlib.suppress(RecordsError):
        batch = decode_batch(data, verify_crc=False)
        if batch.header.is_control and batch.records:
            parse_control_record(batch.records[0])


fuzz = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fuzz
@given(valid_batches())
def test_valid_batches_decode_and_validate(data: bytes) -> None:
    batch = decode_batch(data)
    assert batch.header.size == len(data)
    if not batch.header.is_control:
        validate_produce(data, deep=True)


@fuzz
@given(
    valid_batches(),
    st.lists(
        st.tuples(st.sampled_from(HEADER_FIELDS), st.sampled_from(BOUNDARY)), min_size=1, max_size=3
    ),
    st.booleans(),
)
def test_header_fields_set_to_boundary_values(
    data: bytes, edits: list[tuple[tuple[int, str], int]], keep_length: bool
) -> None:
    buf = bytearray(data)
    for (offset, fmt), value in edits:
        size = struct.calcsize(fmt)
        raw = value.to_bytes(8, "big", signed=value < 0)[-size:]
        buf[offset : offset + size] = raw
    decode_everything(fix(buf, length=keep_length))
    decode_everything(bytes(buf))


@fuzz
@given(
    valid_batches(),
    st.integers(0, 10_000),
    st.sampled_from([*BOUNDARY, -2, 3, 200, 10_000]),
    st.sampled_from(["replace", "insert"]),
)
def test_varints_inside_records_set_to_boundary_values(
    data: bytes, where: int, value: int, how: str
) -> None:
    # Work on the decompressed records section, then compress it back with the same codec, so
    # that the record parser sees the mutation whatever the codec.
    codec = data[22] & 0x07
    section = bytearray(decompress(codec, data[HEADER_SIZE:]) if codec else data[HEADER_SIZE:])
    varint = encode_varint(max(min(value, 2**31 - 1), -(2**31)))
    i = where % (len(section) + 1)
    if how == "replace":
        section[i : i + len(varint)] = varint
    else:
        section[i:i] = varint
    body = compress(codec, bytes(section)) if codec else bytes(section)
    decode_everything(fix(bytearray(data[:HEADER_SIZE] + body)))


@fuzz
@given(
    st.lists(valid_batches(), min_size=2, max_size=4),
    st.integers(0, 3),
    st.integers(0, 10_000),
    st.integers(0, 255),
)
def test_chained_batches_with_one_damaged(
    batches: list[bytes], victim: int, where: int, byte: int
) -> None:
    damaged = bytearray(batches[victim % len(batches)])
    damaged[where % len(damaged)] = byte
    chain = list(batches)
    chain[victim % len(batches)] = fix(damaged, length=where % 2 == 0)
    decode_everything(b"".join(chain))


_LOG_ROOT = Path(tempfile.mkdtemp(prefix="onceflow-fuzz-log-"))
atexit.register(shutil.rmtree, _LOG_ROOT, True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_batches(), st.integers(0, 10_000), st.integers(0, 255))
def test_what_validation_accepts_a_log_stores_and_serves_intact(
    data: bytes, where: int, byte: int
) -> None:
    buf = bytearray(data)
    buf[CRC_START + where % (len(buf) - CRC_START)] = byte
    candidate = fix(buf)
    try:
        headers = validate_produce(candidate, deep=True)
    except RecordsError:
        return
    directory = Path(tempfile.mkdtemp(dir=_LOG_ROOT))
    log = PartitionLog.open(directory, LogConfig())
    try:
        first = build_batch([(None, b"first", (), 1)])
        log.append(first, list(iter_batches(first)))
        info = log.append(candidate, headers)
        read = log.read(info.first_offset, 1 << 20)
        stored = decode_batch(read.data)
        original = decode_batch(candidate)
        assert stored.header.base_offset == info.first_offset == 1
        assert [(r.key, r.value, r.headers) for r in stored.records] == [
            (r.key, r.value, r.headers) for r in original.records
        ]
    finally:
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
