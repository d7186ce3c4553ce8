"""Fixtures of the records tests: hand framing of batches, golden files, kafka-python codecs."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.kafka_python_codecs import use_cramjam
from tests.records.batch_frames import Frame, frame_batch, refresh_crc

GOLDEN = Path(__file__).parent / "golden"
LIBRDKAFKA_CASES = ("none", "gzip", "snappy", "lz4", "zstd", "txn_none")


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


@pytest.fixture(scope="module")
def kafka_python_codecs() -> Iterator[None]:
    """Let kafka-python compress and decompress every codec (see tests/kafka_python_codecs.py)."""
    with pytest.MonkeyPatch.context() as mp:
        use_cramjam(mp)
        yield
