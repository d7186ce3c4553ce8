"""The scrape endpoint: HTTP GET /metrics on the broker's own event loop, bounded like any
listener.

Where the scrape runs: on the event loop, in steps. The state it reads (partitions, producer
state, coordinators, counters) is changed only by the loop, so the loop copies the numbers
(snapshot.py) and formats the copy (collector.py, with prometheus_client), giving the loop
back every STEP_SECONDS so other clients are served between steps. A thread was tried: with
the GIL it competed with the loop for the whole render (1,000 partitions scraped 4 times a
second took a client's round trip from 6 ms to 44 ms at p99, 380 ms at worst), and reading
the live state from it would race those dicts. Renders are at most one per
MIN_RENDER_INTERVAL_S; scrapers in between, or during one, share it.

Bounds: MAX_CLIENTS connections at once (more are closed at accept), MAX_REQUEST_BYTES of
request head, REQUEST_TIMEOUT_S for the whole exchange (a client that sends slowly or does
not read its answer is aborted), one request per connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Generator
from typing import TypeVar

from prometheus_client import CONTENT_TYPE_LATEST

from onceflow.metrics.collector import exposition
from onceflow.metrics.listen import MetricsListenError, parse_listen
from onceflow.metrics.snapshot import Steps

T = TypeVar("T")

__all__ = ["MetricsEndpoint", "MetricsListenError", "parse_listen"]

log = logging.getLogger(__name__)

MAX_CLIENTS = 8
MAX_REQUEST_BYTES = 8192
REQUEST_TIMEOUT_S = 10.0
MIN_RENDER_INTERVAL_S = 0.2
STEP_SECONDS = 0.002  # the loop is given back at least this often while copying the state


class MetricsEndpoint:
    def __init__(self, read: Callable[[], Steps], host: str, port: int) -> None:
        self._read = read
        self.host = host
        self.port = port
        self.clients: set[_ScrapeConnection] = set()
        self.refused = 0  # connections closed at accept: MAX_CLIENTS were open
        self.renders = 0
        self._server: asyncio.Server | None = None
        self._body = b""
        self._rendered_at = float("-inf")
        self._rendering: asyncio.Future[bytes] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ScrapeConnection(self), self.host, self.port, backlog=64
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for client in list(self.clients):
                client.abort()
            await self._server.wait_closed()
        if self._rendering is not None:
            self._rendering.cancel()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    async def render(self) -> bytes:
        """The exposition text: the last one if it is recent, else a new one (shared with
        every scraper that asks while it is made)."""
        if time.monotonic() - self._rendered_at < MIN_RENDER_INTERVAL_S:
            return self._body
        if self._rendering is None:
            self._rendering = asyncio.ensure_future(self._render())
            self._rendering.add_done_callback(self._rendered)
        return await asyncio.shield(self._rendering)

    async def _render(self) -> bytes:
        snapshot = await _in_steps(self._read())
        body = await _in_steps(exposition(snapshot))
        self._body, self._rendered_at = body, time.monotonic()
        self.renders += 1
        return body

    def _rendered(self, future: asyncio.Future[bytes]) -> None:
        self._rendering = None
        if not future.cancelled() and future.exception() is not None:
            log.error("rendering the metrics failed", exc_info=future.exception())


async def _in_steps(steps: Generator[None, None, T]) -> T:
    deadline = time.monotonic() + STEP_SECONDS
    try:
        while True:
            next(steps)
            if time.monotonic() >= deadline:
                await asyncio.sleep(0)
                deadline = time.monotonic() + STEP_SECONDS
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


class _ScrapeConnection(asyncio.Protocol):
    def __init__(self, endpoint: MetricsEndpoint) -> None:
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.answered = False
        self.deadline: asyncio.TimerHandle | None = None
        self.serving: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if len(self.endpoint.clients) >= MAX_CLIENTS:
            self.endpoint.refused += 1
            transport.abort()
            return
        self.endpoint.clients.add(self)
        loop = asyncio.get_running_loop()
        self.deadline = loop.call_later(REQUEST_TIMEOUT_S, self.abort)

    def data_received(self, data: bytes) -> None:
        if self.answered:
            return  # one request per connection; what follows is ignored
        self.buffer += data
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            if len(self.buffer) > MAX_REQUEST_BYTES:
                self._answer(431, b"request head too large\n")
            return
        if head_end > MAX_REQUEST_BYTES:
            self._answer(431, b"request head too large\n")
            return
        line = bytes(self.buffer[: self.buffer.find(b"\r\n")])
        parts = line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self._answer(400, b"bad request\n")
        elif parts[0] != b"GET":
            self._answer(405, b"only GET\n")
        elif parts[1].split(b"?", 1)[0] != b"/metrics":
            self._answer(404, b"see /metrics\n")
        else:
            self.answered = True
            self.serving = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        try:
            body = await self.endpoint.render()
        except Exception:
            self._answer(500, b"rendering the metrics failed\n")
            return
        self._answer(200, body, CONTENT_TYPE_LATEST)

    def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        assert self.transport is not None
        self.answered = True
        self.buffer = bytearray()
        if self.transport.is_closing():
            return  # the client went away while its answer was made
        reason = {
            200: "OK",
            400: "Bad Request",
            404: "Not Found",
            405: "Method Not Allowed",
            431: "Request Header Fields Too Large",
            500: "Internal Server Error",
        }
        head = (
            f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        self.transport.write(head + body)
        self.transport.close()  # after the buffer is written; the deadline still holds

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.endpoint.clients.discard(self)
        if self.deadline is not None:
            self.deadline.cancel()
        if self.serving is not None:
            self.serving.cancel()  # the render itself goes on for the others (shielded)
