"""Clocks are injected into the sans-IO cores so tests can make time jump."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]
"""A function returning the current time in milliseconds since the epoch."""


def system_clock() -> int:
    return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that only moves when told to (for tests and simulations)."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms
