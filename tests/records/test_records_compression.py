"""Compression codecs: round trips, the framing Kafka clients use, malformed input."""

from __future__ import annotations

import contextlib
import gzip
import os
import struct

import cramjam
import kafka.codec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.records.compression import (
    LZ4_FRAME_HEADER,
    XERIAL_BLOCK_SIZE,
    XERIAL_HEADER,
    CompressionType,
    compress,
)
from onceflow.records.decompression import decompress
from onceflow.records.errors import CorruptRecordError, UnsupportedCompressionError

CODECS = list(CompressionType)
payloads = st.one_of(
    st.binary(max_size=2000),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=50), st.integers(1, 3000)),
)


@pytest.mark.parametrize("codec", CODECS)
@settings(max_examples=40)
@given(data=payloads)
def test_round_trip(codec: CompressionType, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("size", [0, 1, 65535, 65536, 65537, 200_000])
def test_round_trip_across_block_boundaries(codec: CompressionType, size: int) -> None:
    data = (os.urandom(size // 3) + b"abc" * size)[:size]
    assert decompress(codec, compress(codec, data)) == data
    assert decompress(codec, memoryview(compress(codec, bytearray(data)))) == data


@pytest.mark.parametrize("codec", [5, 6, 7, -1, 8])
def test_unknown_codec(codec: int) -> None:
    with pytest.raises(UnsupportedCompressionError):
        compress(codec, b"x")
    with pytest.raises(UnsupportedCompressionError):
        decompress(codec, b"x")


def _xerial_blocks(data: bytes) -> list[bytes]:
    assert data.startswith(XERIAL_HEADER)
    pos, blocks = len(XERIAL_HEADER), []
    while pos < len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        blocks.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    assert pos == len(data)
    return blocks


def test_snappy_is_xerial_framed_like_the_java_client() -> None:
    data = os.urandom(1000) * 80  # 80 KB: three 32 KiB blocks
    out = compress(CompressionType.SNAPPY, data)
    assert out[:16] == b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01"
    blocks = [bytes(cramjam.snappy.decompress_raw(b)) for b in _xerial_blocks(out)]
    assert [len(b) for b in blocks] == [XERIAL_BLOCK_SIZE, XERIAL_BLOCK_SIZE, 80_000 - 65_536]
    assert b"".join(blocks) == data


def test_kafka_python_reads_our_xerial_snappy(monkeypatch: pytest.MonkeyPatch) -> None:
    if not kafka.codec.has_snappy():
        raw = type("RawSnappy", (), {"decompress": staticmethod(cramjam.snappy.decompress_raw)})
        monkeypatch.setattr(kafka.codec, "snappy", raw)
    data = b"kafka " * 20_000
    assert bytes(kafka.codec.snappy_decode(compress(CompressionType.SNAPPY, data))) == data


def test_raw_snappy_as_librdkafka_sends_it() -> None:
    data = b"librdkafka " * 500
    assert decompress(CompressionType.SNAPPY, bytes(cramjam.snappy.compress_raw(data))) == data
    assert decompress(CompressionType.SNAPPY, bytes(cramjam.snappy.compress_raw(b""))) == b""


def test_xerial_with_little_endian_version_fields() -> None:
    # some producers write version/compat little-endian; Kafka clients ignore those fields
    data = b"redpanda " * 100
    framed = compress(CompressionType.SNAPPY, data)
    odd = framed[:8] + b"\x01\x00\x00\x00\x01\x00\x00\x00" + framed[16:]
    assert decompress(CompressionType.SNAPPY, odd) == data


def _xxh32(data: bytes, seed: int = 0) -> int:
    """xxHash32 of fewer than 16 bytes, to check the LZ4 frame header checksum."""
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    assert len(data) < 16
    h = (seed + p5 + len(data)) & mask
    i = 0
    while i + 4 <= len(data):
        h = rotl((h + int.from_bytes(data[i : i + 4], "little") * p3) & mask, 17) * p4 & mask
        i += 4
    while i < len(data):
        h = rotl((h + data[i] * p5) & mask, 11) * p1 & mask
        i += 1
    h ^= h >> 15
    h = h * p2 & mask
    h ^= h >> 13
    h = h * p3 & mask
    return h ^ (h >> 16)


def test_lz4_frame_header_is_javas() -> None:
    out = compress(CompressionType.LZ4, b"x" * 10)
    assert out.startswith(LZ4_FRAME_HEADER)
    flg, bd, hc = LZ4_FRAME_HEADER[4:7]
    assert flg == 0x60  # version 1, independent blocks, no block or content checksum
    assert bd == 0x40  # 64 KiB blocks
    assert hc == (_xxh32(bytes([flg, bd])) >> 8) & 0xFF
    assert out.endswith(b"\x00\x00\x00\x00")


def test_lz4_blocks_are_independent_and_incompressible_ones_stored() -> None:
    data = os.urandom(70_000)
    out = compress(CompressionType.LZ4, data)
    pos = len(LZ4_FRAME_HEADER)
    sizes = []
    while True:
        (word,) = struct.unpack_from("<I", out, pos)
        pos += 4
        if word == 0:
            break
        assert word & 0x80000000  # random bytes: stored uncompressed
        sizes.append(word & 0x7FFFFFFF)
        pos += word & 0x7FFFFFFF
    assert pos == len(out)
    assert sizes == [65536, 70_000 - 65536]
    assert decompress(CompressionType.LZ4, out) == data


def test_other_lz4_frame_variants_decode() -> None:
    data = b"linked blocks with checksums " * 5000
    assert decompress(CompressionType.LZ4, bytes(cramjam.lz4.compress(data))) == data


def test_concatenated_gzip_members_and_zstd_frames() -> None:
    assert decompress(CompressionType.GZIP, gzip.compress(b"ab") + gzip.compress(b"cd")) == b"abcd"
    zstd = bytes(cramjam.zstd.compress(b"ab")) + bytes(cramjam.zstd.compress(b"cd"))
    assert decompress(CompressionType.ZSTD, zstd) == b"abcd"


@pytest.mark.parametrize("codec", CODECS[1:])
def test_truncated_or_garbage_input_is_corrupt(codec: CompressionType) -> None:
    good = compress(codec, b"0123456789" * 1000)
    for bad in (good[: len(good) // 2], good[:-3], b"\x00" * 40, os.urandom(64)):
        try:
            out = decompress(codec, bad)
        except CorruptRecordError:
            continue
        # a stream cut at a block boundary can be valid; then it must be a prefix
        assert (b"0123456789" * 1000).startswith(out)


@pytest.mark.parametrize(
    "bad",
    [
        XERIAL_HEADER + b"\x00\x00",  # truncated block length
        XERIAL_HEADER + b"\x00\x00\x00\x09abc",  # block longer than the data
        XERIAL_HEADER + b"\xff\xff\xff\xff",  # negative block length
        XERIAL_HEADER + b"\x00\x00\x00\x02\xff\xff",  # not snappy
    ],
)
def test_malformed_xerial_is_corrupt(bad: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        decompress(CompressionType.SNAPPY, bad)


@pytest.mark.parametrize("codec", CODECS[1:])
@settings(max_examples=60)
@given(data=st.binary(max_size=300))
def test_random_bytes_never_escape_as_other_errors(codec: CompressionType, data: bytes) -> None:
    with contextlib.suppress(CorruptRecordError):
        decompress(codec, data)
