"""Saturating int64 arithmetic, for times and sizes derived from settings.

Kafka's `long` settings accept Long.MAX_VALUE (`delete.retention.ms`, `retention.ms`,
`max.compaction.lag.ms`...), meaning "forever". A time computed from one (now + the setting)
ends up in an int64 field or a varlong (a batch's base timestamp, an offset's expire
timestamp); there it must stop at the int64 bound, still meaning "forever", instead of failing
the encoder (Python) or wrapping to the past (Java's `long`).
"""

from __future__ import annotations

from onceflow.records.varint import INT64_MAX, INT64_MIN


def saturate_int64(value: int) -> int:
    """`value`, or the int64 bound it is past."""
    return INT64_MIN if value < INT64_MIN else INT64_MAX if value > INT64_MAX else value


def saturated_add(a: int, b: int) -> int:
    """a + b, stopped at the int64 bounds (Kafka's `now + delete.retention.ms` that cannot
    overflow)."""
    return saturate_int64(a + b)


def saturated_multiply(a: int, b: int) -> int:
    """a * b, stopped at the int64 bounds (a setting in hours or minutes turned into ms)."""
    return saturate_int64(a * b)
