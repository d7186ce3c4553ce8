"""A transactional producer's Produce requests, appended in the order they arrived.

Handlers change state synchronously in arrival order (dispatch.py), except a transactions
version 2 Produce that must first add its partitions to the transaction: it waits for the
coordinator before it appends. A producer pipelines up to five Produce requests per partition;
one that arrives while an earlier one waits would append first (its partition already joined)
and be refused OUT_OF_ORDER_SEQUENCE_NUMBER, a refusal the Java producer cannot recover from.
Kafka never meets this: it reads a connection's next request only once the previous one is
answered. Here a producer's request that finds an earlier one of the same producer still
waiting to append waits behind it; every other request is untouched.

Bounded by what is in flight: one entry per producer with a request waiting, removed when the
last of them has appended (or given up: a cancelled or failed request lets the next go).
"""

from __future__ import annotations

import asyncio


class ProducerQueue:
    def __init__(self) -> None:
        self._last: dict[int, asyncio.Future[None]] = {}

    def waiting(self, producer_id: int) -> asyncio.Future[None] | None:
        """Done once the producer's requests in flight have appended; None if none waits."""
        last = self._last.get(producer_id)
        return None if last is None or last.done() else last

    def join(self, producer_id: int) -> asyncio.Future[None]:
        """A place at the end of the producer's queue: the caller sets it once it has
        appended (or given up), which lets the producer's next request go."""
        appended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last[producer_id] = appended

        def leave(done: asyncio.Future[None]) -> None:
            if self._last.get(producer_id) is done:
                del self._last[producer_id]

        appended.add_done_callback(leave)
        return appended

    def __len__(self) -> int:
        return len(self._last)
