"""Requests too big for one turn of the event loop: decoded and encoded off it, handled in
slices, and answered in order with the requests that follow them on their connection.

A legal request can name hundreds of thousands of elements (a 3.2 MiB ListOffsets naming one
partition 200,000 times; the 100 MiB frame limit allows 30 times more). Decoding, handling and
encoding it at once held the event loop for seconds, and every other client waited. Here:
- its body, which `parse_request` left unparsed (more than SYNC_ELEMENTS elements), is checked
  and decoded in one worker thread, and its response encoded there too: both are pure
  functions of immutable data, and the interpreter's switch interval (5 ms) hands the loop
  the GIL while the thread works;
- its handler runs on the loop, as every handler does (state is the loop's alone); handlers
  whose work grows with the request do it in slices (handlers/slices.py);
- the requests behind it on the same connection wait for it, so that a connection's requests
  still take effect in the order they arrived. Other connections are not held up.
One thread, so that big requests of many connections take turns rather than all the cores.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from onceflow.broker.handlers.slices import Sliced, run_sliced
from onceflow.protocol.errors import MalformedRequestError
from onceflow.protocol.messages import Request, decode_body, encode_body
from onceflow.rate_limited_log import RateLimitedLog

log = logging.getLogger(__name__)
limited_log = RateLimitedLog(log)

Handle = Callable[[Request], Any]


class BigRequests:
    def __init__(self) -> None:
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="big-requests")
        # The last request of each connection still being worked on off the event loop.
        self._tails: dict[Any, asyncio.Task[Any]] = {}

    def dispatch(self, connection: Any, request: Request, handle: Handle) -> Any:
        """`handle(request)` at once, or a task that runs it in its turn: when the request is
        big, a big one of the same connection is still being worked on, or the handler's work
        is to be done in slices."""
        tail = self._tails.get(connection)
        if request.unparsed is None and tail is None:
            result = handle(request)
            if not isinstance(result, Sliced):
                return result
            task = asyncio.get_running_loop().create_task(self._encoded(_finish(result)))
        else:
            task = asyncio.get_running_loop().create_task(
                self._run(connection, tail, request, handle)
            )
        self._tails[connection] = task
        task.add_done_callback(partial(self._forget, connection))
        return task

    def close(self) -> None:
        """Stop the worker: work not started is dropped, the one running ends on its own."""
        self._worker.shutdown(wait=False, cancel_futures=True)

    def _forget(self, connection: Any, task: asyncio.Task[Any]) -> None:
        if self._tails.get(connection) is task:
            del self._tails[connection]

    async def _run(
        self, connection: Any, before: asyncio.Task[Any] | None, request: Request, handle: Handle
    ) -> Any:
        if before is not None:
            await asyncio.wait([before])  # its outcome is its own answer's business
        loop = asyncio.get_running_loop()
        big = request.unparsed is not None
        if request.unparsed is not None:
            try:
                request.body = await loop.run_in_executor(
                    self._worker, decode_body, request.unparsed
                )
            except MalformedRequestError as e:
                # As a small request that does not parse: the connection is closed.
                limited_log.warning(
                    "refused:MalformedRequestError",
                    "closing connection from %s: %s",
                    getattr(connection, "peer", "?"),
                    e,
                )
                connection.abort()
                return None
            request.unparsed = None  # the frame is no longer needed
        result = handle(request)
        if big or isinstance(result, Sliced):
            return await self._encoded(_finish(result))
        return await _finish(result)

    async def _encoded(self, response: Awaitable[Any]) -> Any:
        """The response of a big request, or of work done in slices (5,000 DescribeConfigs
        resources of one topic: 250,000 entries), encoded in the worker thread."""
        result = await response
        if result is None:
            return None
        return await asyncio.get_running_loop().run_in_executor(self._worker, encode_body, result)


async def _finish(result: Any) -> Any:
    """The response a handler's result stands for: its sliced work run, its awaitable awaited."""
    if isinstance(result, Sliced):
        result = await run_sliced(result.work)
    if inspect.isawaitable(result):
        result = await result
    return result
