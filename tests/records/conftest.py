"""Fixtures of the records tests: hand framing of batches, golden files, kafka-python codecs."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cramjam
import kafka.codec
import kafka.record.default_records as kafka_records
import pytest
from crc32c import crc32c

GOLDEN = Path(__file__).parent / "golden"
LIBRDKAFKA_CASES = ("none", "gzip", "snappy", "lz4", "zstd", "txn_none")

_HEADER = struct.Struct(">qiibIhiqqqhii")

Frame = Callable[..., bytes]


def frame_batch(
    section: bytes,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    magic: int = 2,
    attributes: int = 0,
    last_offset_delta: int = 0,
    base_timestamp: int = 0,
    max_timestamp: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    records_count: int = 0,
    crc: int | None = None,
) -> bytes:
    """A batch around an arbitrary records section, with a correct length and CRC by default.

    Written independently of onceflow's builder, so tests can frame content it would refuse.
    """
    out = bytearray(
        _HEADER.pack(
            base_offset,
            49 + len(section),
            partition_leader_epoch,
            magic,
            0,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            records_count,
        )
    )
    out += section
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])) if crc is None else crc)
    return bytes(out)


def refresh_crc(batch: bytes | bytearray) -> bytes:
    """The same bytes with the CRC field recomputed over what follows it."""
    out = bytearray(batch)
    if len(out) >= 21:
        struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


@pytest.fixture(scope="session")
def frame() -> Frame:
    return frame_batch


@pytest.fixture(scope="session")
def recrc() -> Callable[[bytes | bytearray], bytes]:
    return refresh_crc


@pytest.fixture(scope="session")
def librdkafka_inputs() -> list[tuple[bytes | None, bytes | None, tuple[Any, ...], int]]:
    """The (key, value, headers, timestamp) records the golden librdkafka batches hold."""
    raw = json.loads((GOLDEN / "librdkafka_inputs.json").read_text())

    def unhex(value: str | None) -> bytes | None:
        return None if value is None else bytes.fromhex(value)

    return [
        (
            unhex(rec["key"]),
            unhex(rec["value"]),
            tuple((k, unhex(v)) for k, v in rec["headers"]),
            rec["timestamp"],
        )
        for rec in raw
    ]


@pytest.fixture(scope="session")
def librdkafka_batches() -> dict[str, list[bytes]]:
    """Per captured case, each partition's records bytes from librdkafka's Produce requests."""
    cases = {}
    for case in LIBRDKAFKA_CASES:
        raw = (GOLDEN / f"librdkafka_{case}.bin").read_bytes()
        parts = []
        pos = 0
        while pos < len(raw):
            (size,) = struct.unpack_from(">i", raw, pos)
            parts.append(raw[pos + 4 : pos + 4 + size])
            pos += 4 + size
        cases[case] = parts
    return cases


class _RawSnappy:
    """What kafka-python needs of python-snappy (raw blocks; it does the xerial framing)."""

    @staticmethod
    def compress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.compress_raw(data))

    @staticmethod
    def decompress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(data))


def _lz4_frame(data: bytes) -> bytes:
    # cramjam's default frame: linked blocks plus block and content checksums, a variant of the
    # format other than the one onceflow writes, which the decoder must read as well
    return bytes(cramjam.lz4.compress(data))


@pytest.fixture(scope="module")
def kafka_python_codecs() -> Iterator[None]:
    """Let kafka-python compress and decompress every codec.

    Its optional codec libraries (python-snappy, lz4, zstandard) are not installed; cramjam
    stands in for the raw algorithms, while kafka-python keeps its own framing (xerial for
    snappy, as the Java client writes it) and its own batch code.
    """
    with pytest.MonkeyPatch.context() as mp:
        if not kafka.codec.has_snappy():
            mp.setattr(kafka.codec, "snappy", _RawSnappy)
        if not kafka.codec.has_lz4():
            mp.setattr(kafka.codec, "has_lz4", lambda: True)
            mp.setattr(kafka_records, "lz4_encode", _lz4_frame)
            mp.setattr(kafka_records, "lz4_decode", lambda d: bytes(cramjam.lz4.decompress(d)))
        if not kafka.codec.has_zstd():
            mp.setattr(kafka.codec, "has_zstd", lambda: True)
            mp.setattr(kafka_records, "zstd_encode", lambda d: bytes(cramjam.zstd.compress(d)))
            mp.setattr(kafka_records, "zstd_decode", lambda d: bytes(cramjam.zstd.decompress(d)))
        yield
