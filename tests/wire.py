"""A raw Kafka connection for tests that must misbehave.

Well-formed requests go through onceflow's own protocol client (`tests/admin_requests.py`).
This one exists because that client refuses to do what the hostile and security tests need:
send bytes that are not a request, a frame it did not negotiate, a size that lies, a request
with no answer read, SASL's bare v0 tokens, plain bytes to a TLS port, and see whether the
broker closed the connection.
"""

from __future__ import annotations

import datetime
import io
import select
import socket
import ssl
import struct
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.serial import entity_reader, entity_writer

from onceflow.protocol.entities import build
from onceflow.records.builder import build_batch

WAIT = 10.0  # seconds any single answer may take


class WireClient:
    """One TCP connection speaking Kafka with kio entities, and able to misbehave."""

    def __init__(
        self, address: str, timeout: float = WAIT, tls: ssl.SSLContext | None = None
    ) -> None:
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock = tls.wrap_socket(sock, server_hostname=host) if tls is not None else sock
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, request: Any, client_id: str | None = "hostile") -> int:
        """Frame and send a kio request entity; returns its correlation id."""
        self.correlation_id += 1
        header_cls = request.__header_schema__
        header = header_cls(
            request_api_key=request.__api_key__,
            request_api_version=request.__version__,
            correlation_id=self.correlation_id,
            client_id=client_id,
        )
        buf = io.BytesIO()
        entity_writer(header_cls)(buf, header)
        entity_writer(type(request))(buf, request)
        self.send_frame(buf.getvalue())
        return self.correlation_id

    def receive(self, request: Any, correlation_id: int) -> Any:
        """Read one response frame and parse it as the answer to `request`."""
        data = self._read_frame()
        response_cls = load_response_schema(request.__api_key__, request.__version__)
        header, pos = entity_reader(response_cls.__header_schema__)(data, 0)
        assert header.correlation_id == correlation_id
        body, size = entity_reader(response_cls)(data, pos)  # kio returns the bytes it read
        assert pos + size == len(data), "trailing bytes after the response body"
        return body

    def call(self, request: Any) -> Any:
        return self.receive(request, self.send(request))

    def request(self, api_key: int, version: int, **fields: Any) -> Any:
        """Send the request `api_key` of `version` with `fields`, and read its answer."""
        return self.call(request_entity(api_key, version, **fields))

    def send_frame(self, payload: bytes) -> None:
        """`payload` size-framed, whatever it is (SASL v0 tokens travel so, without header)."""
        self.send_raw(struct.pack(">i", len(payload)) + payload)

    def receive_frame(self) -> bytes | None:
        """One size-framed answer as it is, or None once the broker closed the connection."""
        try:
            return self._read_frame()
        except (ConnectionError, ssl.SSLError):
            return None

    def closed_by_peer(self, timeout: float = WAIT) -> bool:
        """True when the broker closes this connection within `timeout` (nothing else arrives)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True  # closed with unread input left (a reset), or a TLS session ended
        except TimeoutError:
            return False

    def readable(self) -> bool:
        """Whether an answer (or the connection's end) has arrived, unread."""
        return bool(select.select([self.sock], [], [], 0)[0])

    def _read_frame(self) -> bytes:
        return self._read(struct.unpack(">i", self._read(4))[0])

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            out += chunk
        return bytes(out)


def request_entity(api_key: int, version: int, **fields: Any) -> Any:
    """The kio request `api_key` of `version` with `fields`."""
    return build(load_request_schema(api_key, version), **fields)


def body_of(entity: Any) -> bytes:
    """A kio entity's encoding, without size or header."""
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def request_frame(api_key: int, version: int, body: bytes, correlation_id: int = 1) -> bytes:
    """A frame with a well-formed header of the right version and `body` as given."""
    header_cls = load_request_schema(api_key, version).__header_schema__
    buf = io.BytesIO()
    header = header_cls(
        request_api_key=api_key,
        request_api_version=version,
        correlation_id=correlation_id,
        client_id="hostile",
    )
    entity_writer(header_cls)(buf, header)
    buf.write(body)
    return struct.pack(">i", buf.tell()) + buf.getvalue()


def api_versions_request(name: str = "hostile") -> ApiVersionsRequest:
    return ApiVersionsRequest(client_software_name=name, client_software_version="1")


def api_versions(address: str) -> dict[int, tuple[int, int]]:
    """The broker's advertised ranges, asked over a fresh connection."""
    with WireClient(address) as client:
        response = client.call(api_versions_request())
    assert response.error_code == ErrorCode.none
    return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}


def produce_request(topic: str, parts: dict[int, bytes], acks: int = -1) -> ProduceRequest:
    """Produce v9 of the record batches `parts` (by partition), as they are, however bad."""
    return ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=WAIT),
        topic_data=(
            TopicProduceData(
                name=topic,
                partition_data=tuple(
                    PartitionProduceData(index=i, records=r) for i, r in parts.items()
                ),
            ),
        ),
    )


def produce_errors(address: str, topic: str, parts: dict[int, bytes]) -> dict[int, ErrorCode]:
    """The error code the broker answers for each partition's batch."""
    with WireClient(address) as client:
        response = client.call(produce_request(topic, parts))
    [topic_response] = response.responses
    return {p.index: p.error_code for p in topic_response.partition_responses}


def good_batch(values: list[bytes] | None = None, **kwargs: Any) -> bytes:
    """A valid record batch (three records unless `values` says), for beside a bad one."""
    values = values or [b"a", b"b", b"c"]
    return build_batch([(None, v, (), 1_700_000_000_000) for v in values], **kwargs)


def fetch_request(
    topic: str,
    offsets: dict[int, int],
    *,
    partition_max_bytes: int = 1 << 20,
    max_bytes: int = 1 << 20,
    min_bytes: int = 1,
    max_wait: float = 0.0,
) -> FetchRequest:
    """Fetch v12 (read_uncommitted, no session) of one topic from `offsets` (by partition)."""
    partitions = tuple(
        FetchPartition(
            partition=p,
            current_leader_epoch=-1,
            fetch_offset=offset,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=partition_max_bytes,
        )
        for p, offset in offsets.items()
    )
    return FetchRequest(
        cluster_id=None,
        replica_id=-1,
        max_wait=datetime.timedelta(seconds=max_wait),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(FetchTopic(topic=topic, partitions=partitions),),
        forgotten_topics_data=(),
        rack_id="",
    )
