"""A Kafka-aware TCP proxy between each client and the brokers, which can cut, delay or
black-hole that client's connections.

Each client (a worker slot) gets its own listeners, one per broker it may talk to, so that a
fault can isolate one client or all of them. Kafka clients learn broker addresses from
Metadata and FindCoordinator responses; the proxy rewrites those addresses to its own
listeners for that client (opening them on demand), so every connection of the client,
bootstrap or not, stays behind the proxy. That works against any Kafka cluster, unchanged.

Faults, per client, or per broker (every client's connections to that one broker, while the
brokers still reach each other: a node cut off from its clients):
- cut: open connections are reset and new ones are closed as soon as they are accepted;
- black hole: nothing is forwarded either way (bytes wait at the proxy, as a TCP peer keeps
  retransmitting); on healing they are delivered, late, unless the client gave up first;
- delay: every frame waits a fixed latency before it is forwarded (order kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import logging
import struct
import threading
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, TypeVar

from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError

from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.bounds import skip_tagged_fields
from onceflow.protocol.errors import ProtocolError

log = logging.getLogger(__name__)

REWRITTEN = frozenset({ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER})
OPEN, CUT, BLACKHOLE, DELAY = "open", "cut", "blackhole", "delay"
MAX_FRAME = 200 * 1024 * 1024
_SIZE = struct.Struct(">i")
_REQUEST_HEADER = struct.Struct(">hhi")

Address = tuple[str, int]
T = TypeVar("T")


class ProxyError(RuntimeError):
    """The proxy could not start, or could not rewrite a response it must rewrite."""


@dataclass
class Link:
    """The state of one client's path to the brokers."""

    mode: str = OPEN
    delay: float = 0.0
    healed: asyncio.Event = field(default_factory=asyncio.Event)
    connections: set[_Connection] = field(default_factory=set)


def _healed(links: tuple[Link, ...]) -> bool:
    return all(link.healed.is_set() for link in links)


async def _wait_healed(links: tuple[Link, ...]) -> None:
    while not _healed(links):
        for link in links:
            await link.healed.wait()


def _latency(links: tuple[Link, ...]) -> float:
    return max((link.delay for link in links if link.mode == DELAY), default=0.0)


@dataclass
class ProxyStats:
    connections: int = 0
    refused: int = 0  # accepted while cut, closed at once
    reset: int = 0  # open connections cut
    upstream_failures: int = 0  # the broker did not accept (down, restarting)
    rewritten: int = 0  # Metadata / FindCoordinator / DescribeCluster responses rewritten
    frames: int = 0


class _Connection:
    def __init__(self, writers: list[asyncio.StreamWriter]) -> None:
        self.writers = writers

    def reset(self) -> None:
        for writer in self.writers:
            writer.transport.abort()


class KafkaProxy:
    """Runs its own asyncio loop in a thread; the public methods are thread-safe."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.stats = ProxyStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="verify-proxy", daemon=True)
        self._listeners: dict[tuple[str, Address], int] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._links: dict[str, Link] = {}
        self._node_links: dict[Address, Link] = {}  # faults of one broker, for every client
        self._listen_lock: asyncio.Lock | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> KafkaProxy:
        self._thread.start()
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(TimeoutError, RuntimeError):
            self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        for link in [*self._links.values(), *self._node_links.values()]:
            for conn in list(link.connections):
                conn.reset()
            link.healed.set()

    # -- clients and faults ------------------------------------------------------------------

    def bootstrap_for(self, client: str, bootstrap: str) -> str:
        """The bootstrap list `client` should use: one listener per bootstrap server."""
        servers = []
        for item in bootstrap.split(","):
            host, _, port = item.strip().rpartition(":")
            servers.append((host.strip("[]"), int(port)))
        ports = self._call(self._listeners_for(client, servers))
        return ",".join(f"{self.host}:{port}" for port in ports)

    def cut(self, clients: Iterable[str]) -> None:
        self._call(self._set(clients, CUT))

    def blackhole(self, clients: Iterable[str]) -> None:
        self._call(self._set(clients, BLACKHOLE))

    def delay(self, clients: Iterable[str], seconds: float) -> None:
        self._call(self._set(clients, DELAY, seconds))

    def heal(self, clients: Iterable[str] | None = None) -> None:
        """Heal these clients (every client and every broker by default)."""
        self._call(self._set(list(self._links) if clients is None else clients, OPEN))
        if clients is None:
            for node in list(self._node_links):
                self.heal_node(node)

    def isolate_node(self, node: Address, mode: str, seconds: float = 0.0) -> None:
        """Cut, black-hole or delay (by `seconds`) every client's connections to one broker
        (its advertised address); the brokers still reach each other."""
        if mode not in (CUT, BLACKHOLE, DELAY):
            raise ValueError(f"unknown mode {mode!r}")
        self._call(self._set_links([self._node_link(node)], mode, seconds))

    def heal_node(self, node: Address) -> None:
        self._call(self._set_links([self._node_link(node)], OPEN))

    def modes(self) -> dict[str, str]:
        return {client: link.mode for client, link in self._links.items()}

    async def _set(self, clients: Iterable[str], mode: str, delay: float = 0.0) -> None:
        await self._set_links([self._link(client) for client in clients], mode, delay)

    async def _set_links(self, links: list[Link], mode: str, delay: float = 0.0) -> None:
        for link in links:
            link.mode, link.delay = mode, delay
            if mode == BLACKHOLE:
                link.healed.clear()
            else:
                link.healed.set()
            if mode == CUT:
                for conn in list(link.connections):
                    conn.reset()
                    self.stats.reset += 1

    def _link(self, client: str) -> Link:
        link = self._links.get(client)
        if link is None:
            link = self._links[client] = Link()
            link.healed.set()
        return link

    def _node_link(self, node: Address) -> Link:
        link = self._node_links.get(node)
        if link is None:
            link = self._node_links[node] = Link()
            link.healed.set()
        return link

    # -- listeners ---------------------------------------------------------------------------

    async def _listeners_for(self, client: str, upstreams: list[Address]) -> list[int]:
        if self._listen_lock is None:
            self._listen_lock = asyncio.Lock()
        ports = []
        async with self._listen_lock:
            for upstream in upstreams:
                key = (client, upstream)
                if key not in self._listeners:
                    server = await asyncio.start_server(
                        lambda r, w, c=client, u=upstream: self._serve(c, u, r, w),
                        self.host,
                        0,
                        limit=1 << 20,
                    )
                    self._servers.append(server)
                    self._listeners[key] = server.sockets[0].getsockname()[1]
                ports.append(self._listeners[key])
        return ports

    # -- connections -------------------------------------------------------------------------

    async def _serve(
        self,
        client: str,
        upstream: Address,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.stats.connections += 1
        links = (self._link(client), self._node_link(upstream))
        if any(link.mode == CUT for link in links):
            self.stats.refused += 1
            writer.transport.abort()
            return
        conn = _Connection([writer])
        for link in links:
            link.connections.add(conn)
        try:
            await _wait_healed(links)  # a black hole: not even the broker sees the connection
            if any(link.mode == CUT for link in links) or writer.is_closing():
                return
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(*upstream, limit=1 << 20), 5
                )
            except (OSError, TimeoutError):
                self.stats.upstream_failures += 1
                return
            conn.writers.append(up_writer)
            pending: dict[int, tuple[int, int]] = {}  # correlation id -> (api key, version)
            pumps = [
                asyncio.ensure_future(self._pump(reader, up_writer, links, self._track(pending))),
                asyncio.ensure_future(
                    self._pump(up_reader, writer, links, self._rewrite(client, pending))
                ),
            ]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            for link in links:
                link.connections.discard(conn)
            conn.reset()

    def _track(
        self, pending: dict[int, tuple[int, int]]
    ) -> Callable[[bytes], Coroutine[Any, Any, bytes]]:
        async def track(frame: bytes) -> bytes:
            if len(frame) >= 12:
                api_key, version, correlation_id = _REQUEST_HEADER.unpack_from(frame, 4)
                if api_key in REWRITTEN:
                    pending[correlation_id] = (api_key, version)
            return frame

        return track

    def _rewrite(
        self, client: str, pending: dict[int, tuple[int, int]]
    ) -> Callable[[bytes], Coroutine[Any, Any, bytes]]:
        async def rewrite(frame: bytes) -> bytes:
            if len(frame) < 8:
                return frame
            (correlation_id,) = _SIZE.unpack_from(frame, 4)
            request = pending.pop(correlation_id, None)
            if request is None:
                return frame
            payload = frame[4:]
            try:
                addresses = response_addresses(payload, *request)
                ports = await self._listeners_for(client, addresses)
                mapping = {a: (self.host, port) for a, port in zip(addresses, ports, strict=True)}
                body = rewrite_addresses(payload, *request, mapping)
            except (SerialError, ProtocolError, ValueError, TypeError, KeyError) as e:
                raise ProxyError(f"cannot rewrite API {request[0]} v{request[1]}: {e}") from e
            self.stats.rewritten += 1
            return _SIZE.pack(len(body)) + body

        return rewrite

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        links: tuple[Link, ...],
        transform: Callable[[bytes], Coroutine[Any, Any, bytes]],
    ) -> None:
        """Forward whole frames; a second task writes them, so that a delay is a latency
        (frames in flight together arrive together), not a throughput cap."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        writer = asyncio.ensure_future(self._drain(queue, sink, links))
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    head = await source.readexactly(4)
                    (size,) = _SIZE.unpack(head)
                    if not 0 <= size <= MAX_FRAME:
                        return
                    frame = head + await source.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                queue.put_nowait((loop.time(), await transform(frame)))
                if writer.done():
                    return
        finally:
            queue.put_nowait(None)
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer

    async def _drain(
        self,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        sink: asyncio.StreamWriter,
        links: tuple[Link, ...],
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            item = await queue.get()
            if item is None:
                return
            arrived, frame = item
            await _wait_healed(links)
            latency = _latency(links)
            if latency > 0:
                await asyncio.sleep(max(0.0, arrived + latency - loop.time()))
            sink.write(frame)
            await sink.drain()
            self.stats.frames += 1


# -- rewriting broker addresses --------------------------------------------------------------


@cache
def _codec(api_key: int, version: int) -> tuple[Any, Any, bool]:
    cls = load_response_schema(api_key, version)
    flexible_header = ".v1." in cls.__header_schema__.__module__  # response header v1
    return entity_reader(cls), entity_writer(cls), flexible_header


def response_addresses(payload: bytes, api_key: int, version: int) -> list[Address]:
    """Broker addresses named by a Metadata / FindCoordinator / DescribeCluster response
    (`payload`: the response without its size prefix)."""
    body = _decode(payload, api_key, version)[0]
    return [(host, port) for host, port in _addresses(body) if port >= 0]


def rewrite_addresses(
    payload: bytes, api_key: int, version: int, mapping: dict[Address, Address]
) -> bytes:
    """The response with every broker address found in `mapping` replaced."""
    body, pos = _decode(payload, api_key, version)
    _, writer, _ = _codec(api_key, version)
    out = io.BytesIO()
    out.write(payload[:pos])
    writer(out, _replace_addresses(body, mapping))
    return out.getvalue()


def _decode(payload: bytes, api_key: int, version: int) -> tuple[Any, int]:
    reader, _, flexible_header = _codec(api_key, version)
    pos = 4  # correlation id
    if flexible_header:
        pos = skip_tagged_fields(payload, pos)
    body, _ = reader(payload, pos)
    return body, pos


def _addresses(entity: Any) -> Iterable[Address]:
    if dataclasses.is_dataclass(entity):
        names = {f.name for f in dataclasses.fields(entity)}
        if {"host", "port"} <= names:
            yield entity.host, int(entity.port)
        for name in names:
            yield from _addresses(getattr(entity, name))
    elif isinstance(entity, tuple):
        for item in entity:
            yield from _addresses(item)


def _replace_addresses(entity: Any, mapping: dict[Address, Address]) -> Any:
    if dataclasses.is_dataclass(entity) and not isinstance(entity, type):
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(entity):
            value = getattr(entity, f.name)
            new = _replace_addresses(value, mapping)
            if new is not value:
                changes[f.name] = new
        names = {f.name for f in dataclasses.fields(entity)}
        if {"host", "port"} <= names:
            target = mapping.get((entity.host, int(entity.port)))
            if target is not None:
                changes["host"], changes["port"] = target[0], type(entity.port)(target[1])
        return dataclasses.replace(entity, **changes) if changes else entity
    if isinstance(entity, tuple):
        items = tuple(_replace_addresses(item, mapping) for item in entity)
        return entity if all(a is b for a, b in zip(items, entity, strict=True)) else items
    return entity
