"""The request memory pool (queued.max.request.bytes): charged by the bytes that have arrived;
once used up, one connection at a time (the lane) reads on to complete its frame, the others
wait first come, first served, and none is left waiting when memory or the lane frees."""

from __future__ import annotations

from onceflow.broker.memory_pool import READ_AHEAD, MemoryPool


class Reader:
    """A connection, as the pool sees it: a callback it calls when the connection may read."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.woken = 0

    def __call__(self) -> None:
        self.woken += 1


def test_announced_sizes_cost_nothing_only_bytes_received_do() -> None:
    pool = MemoryPool(1000)
    tricklers = [Reader(f"t{i}") for i in range(100)]
    for reader in tricklers:  # each has sent one byte of a huge frame
        pool.take(1)
        assert pool.may_read(reader)
    assert pool.available == 900 and pool.waiting == 0 and pool.lane is None


def test_once_used_up_one_reader_completes_its_frame_and_the_others_wait_in_turn() -> None:
    pool = MemoryPool(1000)
    a, b, c = Reader("a"), Reader("b"), Reader("c")
    pool.take(1000)
    assert pool.may_read(a)  # the lane: it reads on past the pool
    assert pool.lane is a
    assert not pool.may_read(b)
    assert not pool.may_read(c)
    assert pool.may_read(a)  # still the lane, however often it asks
    pool.take(500)  # what the lane read past the pool
    pool.frame_complete(a)
    assert pool.lane is b and (b.woken, c.woken) == (1, 0)  # first come, first served
    pool.release(1500)  # a's frame handed over: memory for everyone
    assert pool.waiting == 0 and c.woken == 1


def test_waking_waiters_stops_at_the_memory_they_are_likely_to_take() -> None:
    pool = MemoryPool(10 * READ_AHEAD)
    readers = [Reader(str(i)) for i in range(5)]
    pool.take(10 * READ_AHEAD)
    lane, *waiting = readers
    assert pool.may_read(lane)
    assert not any(pool.may_read(r) for r in waiting)
    pool.release(2 * READ_AHEAD)  # room for about two reads
    assert [r.woken for r in waiting] == [1, 1, 0, 0]
    assert pool.waiting == 2


def test_a_closed_connection_gives_up_the_lane_and_its_place() -> None:
    pool = MemoryPool(1000)
    a, b, c = Reader("a"), Reader("b"), Reader("c")
    pool.take(1000)
    assert pool.may_read(a)
    assert not pool.may_read(b) and not pool.may_read(c)
    pool.cancel(b)  # gone while waiting: never woken
    pool.cancel(a)  # gone while holding the lane
    assert pool.lane is c and b.woken == 0 and c.woken == 1


def test_an_unbounded_pool_never_stops_a_reader() -> None:
    pool = MemoryPool(-1)
    reader = Reader("r")
    pool.take(1 << 40)
    assert pool.may_read(reader) and pool.lane is None
