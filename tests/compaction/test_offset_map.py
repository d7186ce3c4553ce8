"""The cleaner's offset map: Kafka's SkimpyOffsetMap sizing, latest offset per key, bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.compaction import OffsetMap, OffsetMapConfigError
from onceflow.compaction.offset_map import (
    BYTES_PER_ENTRY,
    DEFAULT_DEDUPE_BUFFER_SIZE,
    DEFAULT_IO_BUFFER_LOAD_FACTOR,
)


def test_kafka_defaults_size_the_map() -> None:
    assert DEFAULT_DEDUPE_BUFFER_SIZE == 128 * 1024 * 1024
    assert DEFAULT_IO_BUFFER_LOAD_FACTOR == 0.9
    m = OffsetMap(24_000)
    assert (m.slots, m.capacity, m.memory) == (1000, 900, 24_000)


def test_memory_does_not_depend_on_key_sizes() -> None:
    m = OffsetMap(BYTES_PER_ENTRY * 100)
    for i in range(90):
        m.put(b"k" * 10_000 + b"%d" % i, i)
    assert m.memory == BYTES_PER_ENTRY * 100
    assert m.is_full
    assert [m.get(b"k" * 10_000 + b"%d" % i) for i in (0, 89)] == [0, 89]


def test_a_map_that_holds_nothing_is_refused() -> None:
    with pytest.raises(OffsetMapConfigError):
        OffsetMap(BYTES_PER_ENTRY)  # one slot x 0.9 < 1, as Kafka's require()


def test_put_into_a_table_without_free_slot_raises() -> None:
    m = OffsetMap(BYTES_PER_ENTRY * 2, load_factor=1.0)
    m.put(b"a", 1)
    m.put(b"b", 2)
    with pytest.raises(OffsetMapConfigError):
        m.put(b"c", 3)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=8), max_size=300))
def test_get_returns_the_latest_offset_put(keys: list[bytes]) -> None:
    m = OffsetMap(BYTES_PER_ENTRY * 400, load_factor=1.0)
    expected: dict[bytes, int] = {}
    for offset, key in enumerate(keys):
        m.put(key, offset)
        expected[key] = offset
    assert len(m) == len(expected)
    for key, offset in expected.items():
        assert m.get(key) == offset
    assert m.get(b"absent key longer than 8") == -1
    assert m.latest_offset == len(keys) - 1
    m.clear()
    assert (len(m), m.latest_offset) == (0, -1)
    assert all(m.get(k) == -1 for k in expected)
