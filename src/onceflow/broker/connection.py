"""One client connection: read frames, run handlers in arrival order, answer in order."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from onceflow.broker.storage_failure import halt_on_storage_error
from onceflow.protocol.errors import ProtocolError
from onceflow.protocol.framing import SIZE, check_frame_size
from onceflow.protocol.messages import Request, encode_response, parse_request

if TYPE_CHECKING:
    from onceflow.broker.server import Broker

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64  # pipelined requests per connection before we stop reading


class Connection:
    def __init__(
        self, broker: Broker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.broker = broker
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.host = peer[0] if isinstance(peer, tuple) else str(peer)
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._pending: deque[tuple[Request, Any]] = deque()
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._closing = False

    async def serve(self) -> None:
        responder = asyncio.create_task(self._respond())
        try:
            await self._read_loop()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away, possibly mid-request: nothing was applied
        except ProtocolError as e:
            log.warning("closing connection from %s: %s", self.peer, e)
        finally:
            self._closing = True
            self._ready.set()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await responder
            self.writer.close()

    async def _read_loop(self) -> None:
        max_bytes = self.broker.config.socket_request_max_bytes
        supported = self.broker.supported
        while True:
            header = await self.reader.readexactly(4)
            size = SIZE.unpack(header)[0]
            check_frame_size(size, max_bytes)
            frame = await self.reader.readexactly(size)
            request = parse_request(frame, supported)
            request.client_host = self.host
            result = self.broker.dispatch(self, request)
            if inspect.isawaitable(result):
                result = asyncio.ensure_future(result)
            self._pending.append((request, result))
            self._ready.set()
            if len(self._pending) >= MAX_IN_FLIGHT:
                self._room.clear()
                await self._room.wait()

    async def _respond(self) -> None:
        while True:
            while not self._pending:
                if self._closing:
                    return
                self._ready.clear()
                await self._ready.wait()
            request, result = self._pending.popleft()
            if len(self._pending) < MAX_IN_FLIGHT:
                self._room.set()
            try:
                if isinstance(result, asyncio.Future):
                    result = await result
                if result is None:
                    continue
                self.writer.write(encode_response(request, result))
            except Exception as e:
                halt_on_storage_error(e)
                # A bug answering one request: close this connection, keep the broker serving.
                log.exception("request %s v%s failed", request.api_key, request.api_version)
                self.writer.close()
                return
            if not self._pending:
                await self.writer.drain()
