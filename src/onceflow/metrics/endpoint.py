"""The scrape endpoint: HTTP GET /metrics on the broker's own event loop, bounded like any
listener.

Why on the loop and not in a thread: every piece of state it reads (partitions, producer
state, coordinators, counters) is changed only by the loop, so reading it from the loop
needs no lock and no snapshot on the hot path; a thread would race those dicts or make every
request pay for copies. A render holds the loop for time proportional to partitions +
groups' committed offsets (about a millisecond per few hundred partitions), so renders are
at most one per MIN_RENDER_INTERVAL_S: scrapers in between get the last one.

Bounds: MAX_CLIENTS connections at once (more are closed at accept), MAX_REQUEST_BYTES of
request head, REQUEST_TIMEOUT_S for the whole exchange (a client that sends slowly or does
not read its answer is aborted), one request per connection.
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from onceflow.metrics.collector import BrokerCollector
from onceflow.metrics.listen import MetricsListenError, parse_listen

__all__ = ["MetricsEndpoint", "MetricsListenError", "parse_listen"]

log = logging.getLogger(__name__)

MAX_CLIENTS = 8
MAX_REQUEST_BYTES = 8192
REQUEST_TIMEOUT_S = 10.0
MIN_RENDER_INTERVAL_S = 0.2


class MetricsEndpoint:
    def __init__(self, collector: BrokerCollector, host: str, port: int) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.host = host
        self.port = port
        self.clients: set[_ScrapeConnection] = set()
        self.refused = 0  # connections closed at accept: MAX_CLIENTS were open
        self.renders = 0
        self._server: asyncio.Server | None = None
        self._body = b""
        self._rendered_at = float("-inf")

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ScrapeConnection(self), self.host, self.port, backlog=64
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for client in list(self.clients):
            client.abort()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def render(self) -> bytes:
        now = time.monotonic()
        if now - self._rendered_at >= MIN_RENDER_INTERVAL_S:
            self._body = generate_latest(self.registry)
            self._rendered_at = time.monotonic()
            self.renders += 1
        return self._body


class _ScrapeConnection(asyncio.Protocol):
    def __init__(self, endpoint: MetricsEndpoint) -> None:
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.answered = False
        self.deadline: asyncio.TimerHandle | None = None

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
            try:
                body = self.endpoint.render()
            except Exception:
                log.exception("rendering the metrics failed")
                self._answer(500, b"rendering the metrics failed\n")
                return
            self._answer(200, body, CONTENT_TYPE_LATEST)

    def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        assert self.transport is not None
        self.answered = True
        self.buffer = bytearray()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
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
