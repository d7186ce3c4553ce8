"""One client connection: read frames, run handlers in arrival order, answer in order.

Every byte a client can make the broker hold for it is bounded:
- a frame being received: the bytes that have arrived are charged to the broker-wide pool
  (`queued.max.request.bytes`, memory_pool.py); while it is used up, a connection with part of
  a frame stops reading until memory is released (or it gets the pool's lane); the lane's
  holder must send LANE_MIN_BYTES a second while others wait, or it is closed;
- before a SASL connection has authenticated: frames of at most `sasl.server.max.receive.size`
  (larger closes the connection), read one at a time, outside the pool, as Kafka's
  SaslServerAuthenticator reads them;
- answers: at most MAX_IN_FLIGHT requests and about MAX_QUEUED_BYTES of answers (a Fetch counts
  its bound until answered) wait on a connection; beyond that the connection stops reading, as
  Kafka mutes a channel, until the client reads its answers. Answers are written in chunks, only
  while the socket takes them, so the transport buffers at most WRITE_BUFFER_HIGH + one chunk;
- time: a connection with no traffic for `connections.max.idle.ms` is closed.
On disconnect everything is dropped at once (no reference cycle waits for the collector).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from onceflow.broker.config import BrokerConfig
from onceflow.broker.fetch_max_bytes import response_bytes_bound
from onceflow.broker.memory_pool import READ_AHEAD, MemoryPool
from onceflow.broker.storage_failure import halt_on_storage_error
from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.errors import FrameTooLargeError, ProtocolError
from onceflow.protocol.framing import FrameReader
from onceflow.protocol.messages import Request, encode_response, parse_request
from onceflow.rate_limited_log import RateLimitedLog

if TYPE_CHECKING:
    from onceflow.broker.connection_quotas import ConnectionQuotas
    from onceflow.broker.security import BrokerSecurity
    from onceflow.security.listeners import Listener
    from onceflow.security.session import Session

log = logging.getLogger(__name__)
limited_log = RateLimitedLog(log)

MAX_IN_FLIGHT = 64  # pipelined requests per connection before we stop reading
MAX_QUEUED_BYTES = 16 << 20  # answers (computed or bounded) per connection before we stop reading
WRITE_CHUNK = 1 << 20  # an answer is handed to the socket this much at a time
WRITE_BUFFER_HIGH = 1 << 20  # transport bytes beyond which we wait for the client to read
# While the request pool is used up, the one connection reading on past it (the lane) must
# complete its frame at this rate while others wait, or it is closed: otherwise a client that
# sent queued.max.request.bytes of partial frames and then trickled would hold everyone off.
LANE_CHECK_S = 1.0
LANE_MIN_BYTES = READ_AHEAD  # per LANE_CHECK_S


class ConnectionOwner(Protocol):
    """What a connection needs of the broker: its settings, the memory pool of requests, the
    versions it parses, its security (sessions), the handler of each request, and to be told
    when it has closed."""

    config: BrokerConfig
    request_memory: MemoryPool
    supported: Mapping[int, tuple[int, int]]
    security: BrokerSecurity  # the listeners' TLS and SASL: each connection's session
    quotas: ConnectionQuotas  # counts the connections each limit closes (the metrics)

    def dispatch(self, connection: Connection, request: Request) -> Any: ...

    def connection_closed(self, connection: Connection) -> None: ...


@dataclass(slots=True, eq=False)
class _Answer:
    request: Request | None  # None: a bare SASL token's answer (SaslHandshake v0)
    future: asyncio.Future[Any] | None  # None: `data` was computed at once
    data: bytes | None
    cost: int  # bytes counted against MAX_QUEUED_BYTES until written


class Connection(asyncio.Protocol):
    def __init__(self, broker: ConnectionOwner, host: str, listener: Listener) -> None:
        self.broker = broker
        self.host = host
        self.peer = host
        self.listener = listener
        self.session: Session | None = None  # made when the transport (TLS or not) is up
        self.transport: asyncio.Transport | None = None
        self._frames = FrameReader(broker.config.socket_request_max_bytes)
        self._answers: deque[_Answer] = deque()
        self._queued = 0  # sum of the costs in _answers
        self._charged = 0  # bytes received and not handed over, charged to the pool
        self._reader = self._memory_granted  # this connection, to the pool (by identity)
        self._waiting_memory = False
        self._closing = False  # no more requests are read; answers due are still written
        self._lost = False
        self._ready = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._done = asyncio.Event()
        self._responder: asyncio.Task[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_activity = 0.0
        self._received = 0  # bytes read from the client, for the lane's progress
        self._lane_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        # security hook: the session (listener, principal; SASL state) of this connection
        self.session = self.broker.security.new_session(
            self.listener, self.peer, self.host, self.broker.supported[ApiKey.API_VERSIONS]
        )
        self.session.tls_established(transport.get_extra_info("peercert"))
        self.session.on_must_close = self._finish  # a failed authentication: answer, close
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        loop = asyncio.get_running_loop()
        self._responder = loop.create_task(self._respond())
        self._touch()
        self._schedule_idle_check(self.broker.config.connections_max_idle_ms / 1000)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return  # after a refused request nothing more is read or answered
        self._touch()
        self._received += len(data)
        self._frames.feed(data)
        self._read_requests()

    def eof_received(self) -> bool:
        # The client will send no more: answer what it already asked, then close. (TLS cannot
        # stay half-open: asyncio's SSL transport closes itself, so do not ask it to.)
        self._finish()
        return not self.listener.protocol.uses_tls

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._touch()
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._finish()
        self._release()
        self.broker.connection_closed(self)

    # -- requests ----------------------------------------------------------------------------

    def _read_requests(self) -> None:
        """Dispatch every whole frame received, as far as the limits allow; then pause reading
        if a limit is met, resume it otherwise."""
        assert self.session is not None
        pool = self.broker.request_memory
        self._limit_frames()
        while not self._closing and not self._muted():
            try:
                frame = self._frames.next_frame()
            except ProtocolError as e:
                self._refuse(e)
                break
            if frame is None:
                break
            pool.frame_complete(self._reader)
            try:
                if self.session.raw_tokens:
                    # security hook: after SaslHandshake v0 a frame is a bare SASL token
                    self._enqueue_raw(self.session.raw_token(frame))
                    continue
                request = parse_request(frame, self.broker.supported)
                del frame  # the parsed request keeps what it needs
                request.client_host = self.host
                request.session = self.session
                # security hook: an unauthenticated SASL connection sends only what SASL needs
                self.session.admit(request.api_key, request.api_version)
                result = self.broker.dispatch(self, request)
            except ProtocolError as e:
                self._refuse(e)
                break
            self._enqueue(request, result)
        self._charge_memory()
        self._update_reading()

    def _limit_frames(self) -> None:
        """Until a SASL connection has authenticated, Kafka reads its frames with a bound of
        `sasl.server.max.receive.size` (and off the request pool), so that an anonymous client
        cannot announce, and be granted, a 100 MiB frame."""
        assert self.session is not None
        config = self.broker.config
        if self.session.authenticated:
            self._frames.max_bytes = config.socket_request_max_bytes
            self._frames.setting = "socket.request.max.bytes"
        else:
            self._frames.max_bytes = min(
                config.sasl_server_max_receive_size, config.socket_request_max_bytes
            )
            self._frames.setting = "sasl.server.max.receive.size (before authentication)"

    def _charge_memory(self) -> None:
        """Charge the pool for what is held of requests not handed over yet; with part of a
        frame, ask the pool whether to read on (see memory_pool.py)."""
        assert self.session is not None
        pool = self.broker.request_memory
        held = self._frames.buffered if self.session.authenticated else 0
        if held > self._charged:
            pool.take(held - self._charged)
        elif held < self._charged:
            pool.release(self._charged - held)
        self._charged = held
        if held and not self._closing and not self._muted():
            # What is buffered is part of a frame (whole ones were dispatched, unless muted).
            self._waiting_memory = not pool.may_read(self._reader)
            if pool.lane is self._reader and self._lane_timer is None:
                self._watch_lane()

    def _watch_lane(self) -> None:
        loop = asyncio.get_running_loop()
        self._lane_timer = loop.call_later(LANE_CHECK_S, self._check_lane, self._received)

    def _check_lane(self, received_before: int) -> None:
        self._lane_timer = None
        pool = self.broker.request_memory
        if self._lost or pool.lane is not self._reader:
            return
        sent = self._received - received_before
        if pool.waiting and sent < LANE_MIN_BYTES:
            limited_log.warning(
                "lane",
                "closing connection from %s: the request memory pool "
                "(queued.max.request.bytes) is used up and it sent %d bytes of its request in "
                "%.0f s while %d connections wait for memory",
                self.peer,
                sent,
                LANE_CHECK_S,
                pool.waiting,
            )
            self.broker.quotas.refuse("queued.max.request.bytes")
            self.abort()
        else:
            self._watch_lane()

    def _memory_granted(self) -> None:
        # Called by the pool when this connection may read again.
        self._waiting_memory = False
        # Not from inside the pool's release (another connection's dispatch): on the next turn.
        asyncio.get_running_loop().call_soon(self._read_requests)

    def _muted(self) -> bool:
        if self._waiting_memory:
            return True
        if not self._answers:
            return False  # always take one request, however big its answer may be
        if self.session is not None and not self.session.authenticated:
            # During authentication one request at a time, as Kafka's authenticator: the next
            # frame is read once this one is answered, in the state its answer left (a
            # request pipelined behind SaslAuthenticate is served once authenticated).
            return True
        return len(self._answers) >= MAX_IN_FLIGHT or self._queued >= MAX_QUEUED_BYTES

    def _update_reading(self) -> None:
        if self.transport is None or self._lost:
            return
        if self._closing or self._muted():
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def _enqueue(self, request: Request, result: Any) -> None:
        if result is None:
            return  # no response is due (Produce with acks=0)
        if inspect.isawaitable(result):
            future = asyncio.ensure_future(result)
            cost = 0
            if request.api_key == ApiKey.FETCH:
                cost = response_bytes_bound(self.broker.config.fetch_max_bytes, request)
            answer = _Answer(request, future, None, cost)
        else:
            try:
                data = encode_response(request, result)
            except Exception as e:
                self._failed(request, e)
                return
            answer = _Answer(request, None, data, len(data))
        self._answers.append(answer)
        self._queued += answer.cost
        self._ready.set()

    def _enqueue_raw(self, result: Any) -> None:
        """A bare SASL token's answer: bytes sent as they are, or nothing (None)."""
        answer = _Answer(None, asyncio.ensure_future(result), None, 0)
        self._answers.append(answer)
        self._ready.set()

    def _refuse(self, error: ProtocolError) -> None:
        limited_log.warning(
            f"refused:{type(error).__name__}", "closing connection from %s: %s", self.peer, error
        )
        if isinstance(error, FrameTooLargeError):  # the setting's name, before any "(...)"
            self.broker.quotas.refuse(self._frames.setting.split(" ")[0])
        self._frames.clear()
        self._finish()

    def _failed(self, request: Request | None, error: Exception) -> None:
        halt_on_storage_error(error)
        # A bug answering one request: close this connection, keep the broker serving.
        what = "a SASL token" if request is None else f"{request.api_key} v{request.api_version}"
        log.error("request %s failed", what, exc_info=error)
        self.abort()

    # -- answers -----------------------------------------------------------------------------

    async def _respond(self) -> None:
        try:
            while True:
                while not self._answers:
                    if self._closing:
                        return
                    self._ready.clear()
                    await self._ready.wait()
                first = self._answers[0]
                if first.future is not None and not first.future.done():
                    # shield: closing this connection must not cancel work shared with other
                    # requests (a group-commit round); a failure is handled below
                    with contextlib.suppress(Exception):
                        await asyncio.shield(first.future)
                ready = self._ready_answers()
                if ready is None:
                    return
                await self._write(ready)
                if self._lost:
                    return
                for _ in range(len(ready)):
                    answer = self._answers.popleft()
                    self._queued -= answer.cost
                if not self._closing:
                    self._read_requests()  # room for more requests may have been made
        except asyncio.CancelledError:
            pass  # the connection is gone
        finally:
            if self.transport is not None and not self._lost:
                self.transport.close()
            self._done.set()

    def _ready_answers(self) -> list[bytes] | None:
        """The encoded answers at the head of the queue that are ready, in order, up to about
        WRITE_CHUNK bytes (at least the first): handed to the socket in one write, as a group
        commit completes many produce requests at once. None if the first one failed (the
        connection is then closed); one that failed behind ready answers ends the group, so
        that the answers before it are written first."""
        ready: list[bytes] = []
        size = 0
        for answer in self._answers:
            if answer.future is not None:
                if not answer.future.done():
                    break
                try:
                    body = answer.future.result()
                    if answer.request is None:
                        answer.data = body  # a bare SASL token, or None
                    elif body is not None:
                        answer.data = encode_response(answer.request, body)
                except Exception as e:
                    if ready:
                        break  # fails on the next round, after what precedes it is written
                    self._failed(answer.request, e)
                    return None
                answer.future = None
            data = answer.data or b""
            if ready and size + len(data) > WRITE_CHUNK:
                break
            ready.append(data)
            size += len(data)
        return ready

    async def _write(self, answers: list[bytes]) -> None:
        assert self.transport is not None
        data = answers[0] if len(answers) == 1 else b"".join(answers)
        with memoryview(data) as view:
            for start in range(0, len(view), WRITE_CHUNK):
                if self._lost:
                    return
                await self._writable.wait()
                self.transport.write(view[start : start + WRITE_CHUNK])
                self._touch()

    # -- closing -----------------------------------------------------------------------------

    def _finish(self) -> None:
        """Read no more requests; the responder closes once the answers due are written."""
        self._closing = True
        self._ready.set()
        if self.transport is not None and not self._lost:
            self.transport.pause_reading()

    def abort(self) -> None:
        """Close at once, dropping unread input and unwritten answers."""
        self._finish()
        if self.transport is None:
            self._done.set()  # never attached to a socket: nothing to wait for
        elif not self._lost:
            self.transport.abort()

    async def closed(self) -> None:
        """Wait until the connection is gone and its responder has ended."""
        await self._done.wait()

    def _release(self) -> None:
        """Drop everything held for this connection, at once."""
        self._waiting_memory = False
        self._frames.clear()
        pool = self.broker.request_memory
        pool.cancel(self._reader)
        pool.release(self._charged)
        self._charged = 0
        for answer in self._answers:
            if answer.future is not None:
                # The work goes on (a produce is applied as Kafka does); its answer is dropped.
                answer.future.add_done_callback(_discard)
        self._answers.clear()
        self._queued = 0
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._lane_timer is not None:
            self._lane_timer.cancel()
            self._lane_timer = None
        if self._responder is not None and not self._responder.done():
            self._responder.cancel()
        self._writable.set()

    # -- idleness ----------------------------------------------------------------------------

    def _touch(self) -> None:
        self._last_activity = asyncio.get_running_loop().time()

    def _schedule_idle_check(self, delay: float) -> None:
        if self.broker.config.connections_max_idle_ms > 0:
            loop = asyncio.get_running_loop()
            self._idle_timer = loop.call_later(max(delay, 0.001), self._check_idle)

    def _check_idle(self) -> None:
        """connections.max.idle.ms: nothing read or written for that long closes the connection
        (a half-sent request, or answers the client does not read, included)."""
        self._idle_timer = None
        if self._lost:
            return
        idle = self.broker.config.connections_max_idle_ms / 1000
        elapsed = asyncio.get_running_loop().time() - self._last_activity
        if elapsed >= idle:
            limited_log.info(
                "idle", "closing connection from %s idle for %.1fs", self.peer, elapsed
            )
            self.broker.quotas.refuse("connections.max.idle.ms")
            self.abort()
        else:
            self._schedule_idle_check(idle - elapsed)


def _discard(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.debug("request of a closed connection failed: %r", future.exception())
