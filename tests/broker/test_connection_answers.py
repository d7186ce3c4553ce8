"""A connection answers in order, and a request that fails does not take the answers queued
before it down with it: they are written, then the connection is closed.

The connection runs in this process on a real socket, with an owner whose dispatch is
scripted, so that a handler can fail (the broker's handlers cannot be made to by a client).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from onceflow.broker.config import BrokerConfig
from onceflow.broker.connection import Connection
from onceflow.broker.connection_quotas import ConnectionQuotas
from onceflow.broker.dispatch import supported_versions
from onceflow.broker.handlers.api_versions import handle_api_versions
from onceflow.broker.memory_pool import MemoryPool
from onceflow.broker.security import BrokerSecurity
from onceflow.protocol.messages import Request
from tests.wire import WireClient, api_versions_request


class HandlerBug(RuntimeError):
    pass


@dataclass
class ScriptedOwner:
    """Answers each ApiVersions request at once, except those numbered in `failing` (they
    raise); the `held` ones wait until one has failed."""

    config: BrokerConfig
    security: BrokerSecurity
    failing: set[int]
    held: set[int]
    release: asyncio.Event = field(default_factory=asyncio.Event)
    request_memory: MemoryPool = field(default_factory=lambda: MemoryPool(1 << 20))
    quotas: ConnectionQuotas = field(default_factory=lambda: ConnectionQuotas(1 << 30, 1 << 30))
    supported: dict[int, tuple[int, int]] = field(default_factory=supported_versions)
    seen: int = 0
    closed: threading.Event = field(default_factory=threading.Event)

    def dispatch(self, connection: Connection, request: Request) -> Any:
        number = self.seen
        self.seen += 1
        return self._answer(number, request)

    async def _answer(self, number: int, request: Request) -> Any:
        if number in self.failing:
            self.release.set()  # the held ones complete only once this one has failed
            raise HandlerBug(f"request {number}")
        if number in self.held:
            await self.release.wait()
        return handle_api_versions(self.supported, request)

    def connection_closed(self, connection: Connection) -> None:
        self.closed.set()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers: list[asyncio.Server] = []

    def start(failing: set[int], held: set[int]) -> tuple[str, ScriptedOwner]:
        config = BrokerConfig(data_dir=str(tmp_path))
        owner = asyncio.run_coroutine_threadsafe(_owner(config, failing, held), loop).result(10)
        listener = config.listener_list()[0]

        async def listen() -> asyncio.Server:
            return await loop.create_server(
                lambda: Connection(owner, "127.0.0.1", listener), "127.0.0.1", 0
            )

        server = asyncio.run_coroutine_threadsafe(listen(), loop).result(10)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}", owner

    yield start
    for server in servers:
        loop.call_soon_threadsafe(server.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


async def _owner(config: BrokerConfig, failing: set[int], held: set[int]) -> ScriptedOwner:
    # asyncio objects are made on the loop that will use them
    return ScriptedOwner(config, BrokerSecurity.from_config(config), failing, held)


def test_answers_ahead_of_a_failed_request_are_written_before_the_close(serve: Any) -> None:
    # requests 0 and 1 are held until 2 has failed: all three are done when the connection
    # next looks, and 0 and 1 must still reach the client, in order, before it is closed
    address, owner = serve(failing={2}, held={0, 1})
    with WireClient(address) as client:
        ids = [client.send(api_versions_request()) for _ in range(3)]
        request = api_versions_request()
        assert client.receive(request, ids[0]).error_code == ErrorCode.none
        assert client.receive(request, ids[1]).error_code == ErrorCode.none
        assert client.closed_by_peer()
    assert owner.closed.wait(10)


def test_a_failed_first_request_closes_the_connection(serve: Any) -> None:
    address, owner = serve(failing={0}, held=set())
    with WireClient(address) as client:
        client.send(api_versions_request())
        assert client.closed_by_peer()
    assert owner.closed.wait(10)
