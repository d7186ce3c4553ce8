"""Saturating int64 arithmetic: a time or size computed from a setting stops at the int64
bounds (still meaning "forever"), where Python's ints would fail an encoder and Java's longs
would wrap to the past."""

from __future__ import annotations

import pytest

from onceflow.records.saturating import saturate_int64, saturated_add, saturated_multiply
from onceflow.records.varint import INT64_MAX, INT64_MIN, encode_varlong

NOW_MS = 1_760_000_000_000


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (NOW_MS, 86_400_000, NOW_MS + 86_400_000),  # in range: plain addition
        (NOW_MS, INT64_MAX, INT64_MAX),  # now + delete.retention.ms=Long.MAX_VALUE
        (INT64_MAX, INT64_MAX, INT64_MAX),
        (INT64_MAX, 0, INT64_MAX),
        (-NOW_MS, INT64_MIN, INT64_MIN),
        (INT64_MIN, -1, INT64_MIN),
        (INT64_MAX, INT64_MIN, -1),  # opposite signs never saturate
    ],
)
def test_saturated_add(a: int, b: int, expected: int) -> None:
    assert saturated_add(a, b) == expected
    encode_varlong(saturated_add(a, b))  # always encodable


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (168, 3_600_000, 604_800_000),  # log.retention.hours in ms
        (INT64_MAX, 60_000, INT64_MAX),
        (-(1 << 62), 4, INT64_MIN),
        (-(1 << 62), -4, INT64_MAX),
        (INT64_MIN, 1, INT64_MIN),
        (0, INT64_MAX, 0),
    ],
)
def test_saturated_multiply(a: int, b: int, expected: int) -> None:
    assert saturated_multiply(a, b) == expected


def test_saturate_int64_leaves_the_range_alone() -> None:
    for value in (INT64_MIN, -1, 0, 1, INT64_MAX):
        assert saturate_int64(value) == value
    assert saturate_int64(INT64_MAX + 1) == INT64_MAX
    assert saturate_int64(INT64_MIN - 1) == INT64_MIN
