"""The keyless records of a batch refused by a compacted topic, named as Kafka names them."""

from __future__ import annotations

import pytest

from onceflow.records.batch import parse_header
from onceflow.records.builder import build_batch
from onceflow.records.validation import null_key_indexes, refusal_message

TS = 1_700_000_000_000


def _batch(keys: list[bytes | None], compression: int = 0, value: bytes = b"v") -> bytes:
    return build_batch([(k, value, (), TS) for k in keys], compression=compression)


@pytest.mark.parametrize("compression", [0, 1, 2, 3, 4])  # none, gzip, snappy, lz4, zstd
def test_indexes_of_the_keyless_records(compression: int) -> None:
    keys: list[bytes | None] = [b"a", None, b"", None, b"b" * 300, None]
    data = _batch(keys, compression)
    # an empty key is a key (Kafka's Record.hasKey: key != null)
    assert null_key_indexes(data, 0, parse_header(data)) == [1, 3, 5]


def test_records_spanning_decompressed_chunks() -> None:
    keys = [None if i % 7 == 0 else b"k%d" % i for i in range(2000)]
    data = _batch(keys, compression=1, value=b"x" * 500)  # gzip yields it in many chunks
    found = null_key_indexes(data, 0, parse_header(data), max_records=2000)
    assert found == list(range(0, 2000, 7))


def test_the_scan_is_bounded() -> None:
    data = _batch([None] * 50)
    assert null_key_indexes(data, 0, parse_header(data), max_records=10) == list(range(10))


def test_refusal_message_is_kafkas() -> None:
    errors = [(i, "Compacted topic cannot accept message without key") for i in range(5)]
    message = refusal_message(5, errors)
    assert message.startswith("One or more records have been rejected due to 5 record errors")
    assert message.count("RecordError(batchIndex=") == 3
