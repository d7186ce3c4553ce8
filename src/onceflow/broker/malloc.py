"""Give freed request and response buffers back to the operating system.

glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), after which
buffers of many MiB come from the heap and stay in the process when freed: a broker that served
big fetches would keep that memory after the clients leave. A fixed low threshold would fix
that, but then every buffer of a fetch (the reads, the response) is a fresh mapping whose pages
fault in one by one: it cut 1 KiB consume throughput by about a quarter. So the allocator keeps
its policy, and the broker trims the heap (malloc_trim) shortly after connections close.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_DELAY_S = 1.0  # one trim for a burst of disconnections


def _malloc_trim() -> Callable[[], object] | None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        log.debug("no malloc_trim in %s: the allocator keeps its own policy", name)
        return None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


class HeapTrimmer:
    """Trims the heap once, TRIM_DELAY_S after the first of a burst of requests for it."""

    def __init__(self) -> None:
        self._trim = _malloc_trim()
        self._pending: asyncio.TimerHandle | None = None
        self.trims = 0

    def request(self) -> None:
        if self._trim is None or self._pending is not None:
            return
        self._pending = asyncio.get_running_loop().call_later(TRIM_DELAY_S, self._run)

    def _run(self) -> None:
        self._pending = None
        if self._trim is not None:
            self._trim()
            self.trims += 1

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
