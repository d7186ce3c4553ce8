"""Waiting in tests: on a condition, with a deadline, never on a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from onceflow.broker.embedded import EmbeddedBroker

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T],
    timeout: float = 30.0,
    what: str | Callable[[], object] = "condition",
    *,
    poll: Callable[[], object] | None = None,
    interval: float = 0.05,
) -> T:
    """Call `condition` until it returns something truthy, and return that. Between calls,
    `poll()` (a client's event loop: its wait is the pause) or a sleep of `interval`. At the
    deadline the test fails, naming `what` (or what `what()` says of the state then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout} s waiting for {said}")
        if poll is None:
            time.sleep(interval)
        else:
            poll()


def wait_for_line(broker: EmbeddedBroker, text: str, timeout: float, what: str) -> str:
    """The first line holding `text` of what the broker wrote, which a reader thread copies:
    a line the broker wrote before it answered a request can still trail the answer here."""
    return wait_for(
        lambda: next((line for line in broker.output if text in line), ""), timeout, what
    )
