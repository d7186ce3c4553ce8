"""The C record walker agrees with the pure-Python reference walk, on valid and mangled bytes,
however the bytes are cut into chunks; and decompression for validation stays bounded."""

from __future__ import annotations

import gzip
import itertools
import zlib

import cramjam
import pytest
from backports import zstd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceflow.records.batch import HEADER_SIZE, parse_header
from onceflow.records.builder import build_batch
from onceflow.records.compression import CompressionType, compress
from onceflow.records.decompression import iter_decompressed
from onceflow.records.errors import (
    CorruptRecordError,
    InvalidRecordError,
    RecordTooLargeError,
)
from onceflow.records.validation import validate_produce_records
from onceflow.records.walker import (
    RecordsSummary,
    RecordWalker,
    walk_batch,
    walk_records_reference,
)

headers_st = st.lists(
    st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
)
records_st = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=20)),
        st.one_of(st.none(), st.binary(max_size=300)),
        headers_st,
        st.integers(min_value=-(1 << 40), max_value=1 << 40),
    ),
    min_size=1,
    max_size=20,
)


def c_walk(
    data: bytes,
    cuts: list[int],
    *,
    count: int,
    base_timestamp: int,
    max_timestamp: int | None = None,
    target: int | None = None,
) -> RecordsSummary:
    walker = RecordWalker(count, base_timestamp, max_timestamp, target)
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for start, end in itertools.pairwise(bounds):
        if walker.feed(memoryview(data)[start:end]):
            break
    else:
        walker.finish()
    return RecordsSummary(walker.records, walker.null_keys, walker.found)


def outcome(fn: object, *args: object, **kwargs: object) -> RecordsSummary | type:
    try:
        return fn(*args, **kwargs)  # type: ignore[operator]
    except InvalidRecordError:
        return InvalidRecordError


def section_of(batch: bytes) -> tuple[bytes, dict[str, int]]:
    header = parse_header(batch)
    return batch[HEADER_SIZE:], {
        "count": header.records_count,
        "base_timestamp": header.base_timestamp,
        "max_timestamp": header.max_timestamp,
    }


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(records=records_st, cuts=st.lists(st.integers(min_value=0), max_size=6))
def test_valid_batches_walk_the_same_in_c_and_python(records: list, cuts: list[int]) -> None:
    data, fields = section_of(build_batch(records))
    expected = RecordsSummary(len(records), sum(1 for r in records if r[0] is None))
    assert walk_records_reference(data, **fields) == expected
    assert c_walk(data, cuts, **fields) == expected


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=records_st,
    target=st.integers(min_value=-(1 << 41), max_value=1 << 41),
    cuts=st.lists(st.integers(min_value=0), max_size=6),
)
def test_search_stops_at_the_first_record_at_or_after_the_target(
    records: list, target: int, cuts: list[int]
) -> None:
    data, fields = section_of(build_batch(records))
    found = c_walk(data, cuts, target=target, **fields).found
    assert found == walk_records_reference(data, target=target, **fields).found
    matches = [(i, r[3]) for i, r in enumerate(records) if r[3] >= target]
    assert found == (matches[0] if matches else None)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=records_st,
    edits=st.lists(
        st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)), max_size=4
    ),
    cut=st.one_of(st.none(), st.integers(min_value=0)),
    extra=st.binary(max_size=3),
    count_delta=st.integers(min_value=-2, max_value=2),
    target=st.one_of(st.none(), st.integers(min_value=-(1 << 41), max_value=1 << 41)),
    cuts=st.lists(st.integers(min_value=0), max_size=6),
)
def test_mangled_records_get_the_same_verdict_in_c_and_python(
    records: list,
    edits: list[tuple[int, int]],
    cut: int | None,
    extra: bytes,
    count_delta: int,
    target: int | None,
    cuts: list[int],
) -> None:
    data, fields = section_of(build_batch(records))
    mangled = bytearray(data)
    for where, byte in edits:
        mangled[where % len(mangled)] = byte
    if cut is not None:
        del mangled[cut % (len(mangled) + 1) :]
    mangled += extra
    fields["count"] = max(0, fields["count"] + count_delta)
    py = outcome(walk_records_reference, bytes(mangled), target=target, **fields)
    c = outcome(c_walk, bytes(mangled), cuts, target=target, **fields)
    assert c == py


@given(garbage=st.binary(max_size=200), count=st.integers(min_value=0, max_value=5))
def test_garbage_gets_the_same_verdict(garbage: bytes, count: int) -> None:
    fields = {"count": count, "base_timestamp": 0}
    assert outcome(c_walk, garbage, [7, 50], **fields) == outcome(
        walk_records_reference, garbage, **fields
    )


def test_a_batch_claiming_int32_max_records_is_invalid() -> None:
    data, fields = section_of(build_batch([(None, b"v", (), 1)]))
    fields["count"] = (1 << 31) - 1
    with pytest.raises(InvalidRecordError):
        c_walk(data, [], **fields)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"\x0e\x00\x00\x00\x01\x02v\x02\x00\x02k", "header key/value past the record"),
        (b"\x0c\x00\x00\x00\x01\x02v\x01\x01", "a null header key"),
        (b"\x0a\x00\x00\x00\x01\x02v\x03", "a negative header count"),
        (b"\x0c\x00\x00\x00\x01\x02v\x00\x00", "a record length one past its content"),
        (b"\x0a\x00\x00\x02\x01\x02v\x00", "offset delta 1 for the first record"),
        (b"\x0a\x00\x00\x00\x01\x02v\x00\x00", "a byte after the last record"),
    ],
)
def test_record_faults_are_invalid_record(body: bytes, why: str) -> None:
    for walk in (walk_records_reference, lambda d, **f: c_walk(d, [3], **f)):
        with pytest.raises(InvalidRecordError):
            walk(body, count=1, base_timestamp=0)


def test_a_record_past_the_max_timestamp_is_invalid() -> None:
    batch = build_batch([(b"k", b"v", (), 10), (b"k", b"v", (), 20)], max_timestamp=15)
    header = parse_header(batch)
    with pytest.raises(InvalidRecordError):
        walk_batch(batch, 0, header)
    # a broker-side search does not re-check stored batches
    assert walk_batch(batch, 0, header, check_timestamps=False) == RecordsSummary(2, 0)


def test_null_keys_are_counted() -> None:
    batch = build_batch([(None, b"a", (), 1), (b"k", b"b", (), 2), (None, None, (), 3)])
    assert validate_produce_records(batch).null_keys == 2


# -- bounded decompression -----------------------------------------------------------------


def zeros_zstd(total: int) -> bytes:
    compressor = zstd.ZstdCompressor()
    block = bytes(1 << 20)
    parts = [compressor.compress(block) for _ in range(total >> 20)]
    parts.append(compressor.flush())
    return b"".join(parts)


BOMBS = {
    CompressionType.GZIP: lambda n: zlib.compress(bytes(n), wbits=31),
    CompressionType.ZSTD: zeros_zstd,
    CompressionType.LZ4: lambda n: compress(CompressionType.LZ4, bytes(n)),
    CompressionType.SNAPPY: lambda n: bytes(cramjam.snappy.compress_raw(bytes(n))),
}


@pytest.mark.parametrize("codec", list(BOMBS))
def test_decompression_stops_past_the_limit(codec: CompressionType) -> None:
    bomb = BOMBS[codec](64 << 20)
    seen = 0
    with pytest.raises(RecordTooLargeError):
        for chunk in iter_decompressed(codec, bomb, 8 << 20):
            seen += len(chunk)
            assert len(chunk) <= 4 << 20  # one chunk or one codec block at a time
    assert seen <= 8 << 20


def test_xerial_snappy_checks_each_block_preamble_before_decompressing() -> None:
    data = compress(CompressionType.SNAPPY, bytes(1 << 20))
    assert b"".join(iter_decompressed(CompressionType.SNAPPY, data, 1 << 20)) == bytes(1 << 20)
    with pytest.raises(RecordTooLargeError):
        list(iter_decompressed(CompressionType.SNAPPY, data, (1 << 20) - 1))


@pytest.mark.parametrize("codec", [c for c in CompressionType if c])
def test_streamed_output_is_the_data(codec: CompressionType) -> None:
    data = bytes(range(256)) * 3000
    out = b"".join(bytes(c) for c in iter_decompressed(codec, compress(codec, data), 1 << 30))
    assert out == data


def test_gzip_members_and_trailing_bytes() -> None:
    two = gzip.compress(b"ab") + gzip.compress(b"cd")
    assert b"".join(iter_decompressed(CompressionType.GZIP, two + b"\x00\x00", 100)) == b"abcd"
    with pytest.raises(CorruptRecordError):
        list(iter_decompressed(CompressionType.GZIP, two[:-3], 100))


def test_truncated_zstd_is_corrupt() -> None:
    data = compress(CompressionType.ZSTD, bytes(range(256)) * 100)
    with pytest.raises(CorruptRecordError):
        list(iter_decompressed(CompressionType.ZSTD, data[:-3], 1 << 20))
