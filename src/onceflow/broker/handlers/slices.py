"""Handler work that grows with the request, done in slices that let other clients be served.

A handler whose work is one step per element of the request (ListOffsets, Metadata,
DescribeGroups...) writes it as a generator that yields after each step and returns the
response. `in_slices` runs it at once when the request is small; otherwise it hands it to the
dispatch (broker/big_requests.py) as `Sliced`, which runs it as a task giving the event loop a
turn every SLICE_SECONDS, after the requests before it on its connection and before those
behind it. Only the handler's own steps are sliced: each step must be short.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

# Elements a handler may step through at once: well under the milliseconds of a loop turn.
SLICED_ABOVE = 1_000
# How long a slice holds the event loop before letting other connections be served.
SLICE_SECONDS = 0.005

Work = Generator[None, None, Any]


@dataclass(frozen=True, slots=True)
class Sliced:
    """A handler's work too long for one turn of the event loop: the dispatch runs it."""

    work: Work


def in_slices(work: Work, elements: int) -> Any:
    """The response of `work` now if it covers at most SLICED_ABOVE `elements`; else `work`
    as Sliced, for the dispatch to run with `run_sliced`."""
    if elements > SLICED_ABOVE:
        return Sliced(work)
    return run_now(work)


def run_now(work: Work) -> Any:
    """Run `work` to its end without yielding to the event loop; its return value."""
    try:
        while True:
            next(work)
    except StopIteration as done:
        return done.value


async def run_sliced(work: Work) -> Any:
    """Run `work`, giving the event loop a turn every SLICE_SECONDS; its return value."""
    deadline = time.monotonic() + SLICE_SECONDS
    try:
        while True:
            next(work)
            if time.monotonic() >= deadline:
                await asyncio.sleep(0)
                deadline = time.monotonic() + SLICE_SECONDS
    except StopIteration as done:
        return done.value
