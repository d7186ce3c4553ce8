"""The broker-wide memory pool for requests being received (Kafka's `queued.max.request.bytes`).

A connection is charged for the bytes of requests it has received and not yet handed over,
not for the size a frame announces. Kafka's SimpleMemoryPool takes the announced size when the
size prefix is read: then a few connections that announce 100 MiB frames and trickle them a
byte at a time reserve the whole pool, and no connection on any listener is read until they
go (issue 19). Charged by what has arrived, such a connection holds a few bytes.

While the pool is used up, a connection with part of a frame stops reading, except one at a
time: the *lane*, which reads on until its frame is complete, so that connections that each
hold part of a frame cannot deadlock waiting for each other (the pool is then overrun by at
most that one frame, as Kafka's non-strict pool is by one allocation). Waiters are served
first come, first served. A frame that has arrived whole is handed over at once, so small
requests are served even while the pool is used up.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

Reader = Callable[[], None]  # a connection's callback: it may read again

# What one connection may add before it looks at the pool again: asyncio reads a socket at
# most 256 KiB at a time. Waking waiters assumes each will take that much.
READ_AHEAD = 256 * 1024


class MemoryPool:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # <= 0: unbounded, as Kafka's -1
        self.available = capacity
        self._waiters: OrderedDict[Reader, None] = OrderedDict()
        self._lane: Reader | None = None

    @property
    def bounded(self) -> bool:
        return self.capacity > 0

    def take(self, size: int) -> None:
        """Charge bytes received (never refused: reading is what `may_read` stops)."""
        if self.bounded:
            self.available -= size

    def release(self, size: int) -> None:
        if not self.bounded or size <= 0:
            return
        self.available += size
        self._wake()

    def may_read(self, reader: Reader) -> bool:
        """May a connection that holds part of a frame read on? While memory is left, or as
        the lane; otherwise `reader` is queued, and called once it may."""
        if not self.bounded or reader is self._lane:
            return True
        if reader in self._waiters:
            return False
        if not self._waiters:
            if self.available > 0:
                return True
            if self._lane is None:
                self._lane = reader
                return True
        self._waiters[reader] = None
        return False

    def frame_complete(self, reader: Reader) -> None:
        """`reader`'s frame has arrived whole: if it held the lane, the lane passes on."""
        if reader is self._lane:
            self._lane = None
            self._wake()

    def cancel(self, reader: Reader) -> None:
        """Forget a connection (it closed): out of the queue, and out of the lane."""
        self._waiters.pop(reader, None)
        self.frame_complete(reader)

    def _wake(self) -> None:
        budget = self.available
        while self._waiters and (budget > 0 or self._lane is None):
            reader, _ = self._waiters.popitem(last=False)
            if budget <= 0:
                self._lane = reader
            budget -= READ_AHEAD
            reader()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def lane(self) -> Reader | None:
        return self._lane
