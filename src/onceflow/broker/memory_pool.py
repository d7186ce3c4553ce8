"""The broker-wide memory pool for requests being received (Kafka's `queued.max.request.bytes`).

As Kafka's SimpleMemoryPool (non-strict): a frame's declared size is taken from the pool when its
size prefix has been read, before its body is; the allocation succeeds while any memory is left
(so one request of any legal size always fits), and a connection whose frame does not fit stops
reading until memory is released. Whole-frame reservations mean that a granted request can always
be completed by its sender, so waiting connections cannot deadlock each other.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

Granted = Callable[[], None]


class MemoryPool:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # <= 0: unbounded, as Kafka's -1
        self.available = capacity
        self._waiters: OrderedDict[Granted, int] = OrderedDict()

    @property
    def bounded(self) -> bool:
        return self.capacity > 0

    def allocate_or_wait(self, size: int, on_granted: Granted) -> bool:
        """Take `size` bytes now (True), or queue `on_granted`, called once they are taken."""
        if not self.bounded:
            return True
        if self.available > 0 and not self._waiters:
            self.available -= size
            return True
        self._waiters[on_granted] = size
        return False

    def release(self, size: int) -> None:
        if not self.bounded or size <= 0:
            return
        self.available += size
        # First come, first served: a big request is not starved by a stream of small ones.
        while self._waiters and self.available > 0:
            on_granted, wanted = self._waiters.popitem(last=False)
            self.available -= wanted
            on_granted()

    def cancel(self, on_granted: Granted) -> None:
        """Forget a waiter (its connection closed before memory was granted)."""
        self._waiters.pop(on_granted, None)

    @property
    def waiting(self) -> int:
        return len(self._waiters)
