"""OffsetCommit over the wire, outside group management (generation -1), as admin tools and
`assign()` consumers commit: many commits fast, for the internal logs' tests and benchmark."""

from __future__ import annotations

import datetime
from collections.abc import Mapping

from kio.schema.errors import ErrorCode
from kio.schema.offset_commit.v2.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.types import GroupId, TopicName
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
