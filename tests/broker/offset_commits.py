"""OffsetCommit over the wire, outside group management (generation -1), as admin tools and
`assign()` consumers commit: many commits fast, for the internal logs' tests and benchmark."""

from __future__ import annotations

import datetime
import io
import socket
import struct
from collections.abc import Mapping

from kio.schema.errors import ErrorCode
from kio.schema.offset_commit.v2.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.types import GroupId, TopicName
from kio.serial import entity_writer
from kio.static.primitive import i32, i64, i64Timedelta

from onceflow.protocol.client import BrokerConnection

_BROKER_DEFAULT_RETENTION = i64Timedelta.parse(datetime.timedelta(milliseconds=-1))


def offset_commit_request(
    group: str, topic: str, offsets: Mapping[int, int]
) -> OffsetCommitRequest:
    partitions = tuple(
        OffsetCommitRequestPartition(
            partition_index=i32(p), committed_offset=i64(o), committed_metadata=""
        )
        for p, o in offsets.items()
    )
    return OffsetCommitRequest(
        group_id=GroupId(group),
        generation_id_or_member_epoch=i32(-1),
        member_id="",
        retention_time=_BROKER_DEFAULT_RETENTION,
        topics=(OffsetCommitRequestTopic(name=TopicName(topic), partitions=partitions),),
    )


def commit(
    connection: BrokerConnection, group: str, topic: str, offsets: Mapping[int, int]
) -> None:
    """One OffsetCommit, which must succeed for every partition."""
    response = connection.send(offset_commit_request(group, topic, offsets))
    errors = {p.error_code for t in response.topics for p in t.partitions}
    assert errors == {ErrorCode.none}, errors


PIPELINE_WINDOW = 256  # requests in flight per connection


def _frame(request: object, correlation_id: int) -> bytes:
    header_cls = request.__header_schema__  # type: ignore[attr-defined]
    header = header_cls(
        request_api_key=request.__api_key__,  # type: ignore[attr-defined]
        request_api_version=request.__version__,  # type: ignore[attr-defined]
        correlation_id=correlation_id,
        client_id="commits",
    )
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header)
    entity_writer(type(request))(buf, request)
    return struct.pack(">i", buf.tell()) + buf.getvalue()


def _read_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        out += chunk
    return bytes(out)


def commit_many(bootstrap: str, group: str, commits: int, topic: str, partitions: int) -> None:
    """`commits` OffsetCommit requests of every partition (offsets 0, 1, ...), pipelined
    PIPELINE_WINDOW at a time on one connection. Responses are counted, not parsed: callers
    check the committed offsets."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sent = received = 0
        while received < commits:
            batch = bytearray()
            while sent < commits and sent - received < PIPELINE_WINDOW:
                request = offset_commit_request(
                    group, topic, dict.fromkeys(range(partitions), sent)
                )
                batch += _frame(request, sent)
                sent += 1
            sock.sendall(batch)
            while received < sent and (sent == commits or sent - received >= PIPELINE_WINDOW // 2):
                size = struct.unpack(">i", _read_exact(sock, 4))[0]
                _read_exact(sock, size)
                received += 1
