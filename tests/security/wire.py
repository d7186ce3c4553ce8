"""A bare Kafka protocol exchange over a socket (plain or TLS), for what clients hide: the
SASL state machine, bare v0 tokens, what a refused connection gets."""

from __future__ import annotations

import io
import socket
import ssl
import struct
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from onceflow.protocol.entities import build


class Wire:
    def __init__(self, port: int, context: ssl.SSLContext | None = None) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = context.wrap_socket(sock, server_hostname="127.0.0.1") if context else sock
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def send(self, api_key: int, version: int, **fields: Any) -> None:
        cls = load_request_schema(api_key, version)
        body = io.BytesIO()
        entity_writer(cls)(body, build(cls, **fields))
        self.correlation += 1
        client_id = b"wire-test"
        header = struct.pack(">hhih", api_key, version, self.correlation, len(client_id))
        header += client_id + (b"\x00" if cls.__flexible__ else b"")
        self.send_raw(header + body.getvalue())

    def send_raw(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def receive(self, api_key: int, version: int) -> Any:
        frame = self.receive_raw()
        assert frame is not None, "the broker closed the connection instead of answering"
        cls = load_response_schema(api_key, version)
        pos = 4  # correlation id
        if cls.__flexible__ and api_key != 18:
            pos += 1  # empty tagged fields of response header v1
        body, _ = entity_reader(cls)(frame, pos)
        return body

    def receive_raw(self) -> bytes | None:
        """One size-framed answer, or None when the broker closed the connection."""
        size = self._exactly(4)
        if size is None:
            return None
        payload = self._exactly(struct.unpack(">i", size)[0])
        return payload

    def request(self, api_key: int, version: int, **fields: Any) -> Any:
        self.send(api_key, version, **fields)
        return self.receive(api_key, version)

    def closed_by_broker(self) -> bool:
        """True when the broker closes without another byte."""
        return self._exactly(1) is None

    def _exactly(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            try:
                chunk = self.sock.recv(n - len(data))
            except (ConnectionResetError, ssl.SSLError):
                return None
            if not chunk:
                return None
            data += chunk
        return data
