"""Answers that wait until the group coordinator's state is consistent again.

JoinGroup and SyncGroup may have to wait for other members: they take a ``respond`` callback
that is called exactly once, possibly later (from another request or from a timer). A callback
may call back into the coordinator, so running it in the middle of a change would show it a
half-changed state: callbacks are queued in an :class:`Outbox` and run at the end of the public
call that produced them (the :func:`answers` decorator).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class Outbox:
    """Callbacks with their results, run in the order they were queued."""

    def __init__(self) -> None:
        self._queue: deque[tuple[Callable[[Any], None], Any]] = deque()
        self._flushing = False

    def respond(self, callback: Callable[[Any], None], result: Any) -> None:
        self._queue.append((callback, result))

    def flush(self) -> None:
        if self._flushing:
            return  # a callback called back into the coordinator: the outer flush continues
        self._flushing = True
        try:
            while self._queue:
                callback, result = self._queue.popleft()
                callback(result)
        finally:
            self._flushing = False


class _Answering(Protocol):
    @property
    def outbox(self) -> Outbox: ...


S = TypeVar("S", bound=_Answering)


def answers(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Run the callbacks a public method queued, once the method has finished its changes."""

    @functools.wraps(method)
    def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        finally:
            self.outbox.flush()

    return wrapper
