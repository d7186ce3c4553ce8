"""ListOffsets (2): earliest, latest (high watermark or last stable offset), max timestamp,
and the first offset whose timestamp is at or after a given time."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.dispatch import api
from onceflow.broker.handlers.metadata import LEADER_EPOCH
from onceflow.protocol.entities import build, sibling
from onceflow.protocol.messages import response_type
from onceflow.records.record import decode_batch

if TYPE_CHECKING:
    from onceflow.broker.server import Broker
    from onceflow.broker.topics import Partition
    from onceflow.protocol.messages import Request

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
READ_COMMITTED = 1


def offset_for_time(partition: Partition, timestamp: int, upper: int) -> tuple[int, int]:
    """(offset, timestamp) of the first record at or after `timestamp` below `upper`,
    or (-1, -1) when there is none."""
    found = partition.log.offset_for_timestamp(timestamp)
    if found is None or found[0] >= upper:
        return -1, -1
    # The first batch whose max timestamp reaches the target holds the record we want.
    data = partition.log.read(found[0], 1, max_offset=upper).data
    batch = decode_batch(data)
    for record in batch.records:
        ts = batch.header.max_timestamp if batch.header.is_log_append_time else record.timestamp
        if ts >= timestamp:
            return record.offset, ts
    return -1, -1


def max_timestamp_offset(partition: Partition, upper: int) -> tuple[int, int]:
    best = (-1, -1)
    for header in partition.log.iter_batch_headers(partition.log.log_start_offset):
        if header.base_offset >= upper:
            break
        if header.max_timestamp > best[1] and not header.is_control:
            best = (header.base_offset, header.max_timestamp)
    if best[0] < 0:
        return best
    data = partition.log.read(best[0], 1, max_offset=upper).data
    for record in decode_batch(data).records:
        if record.timestamp == best[1]:
            return record.offset, record.timestamp
    return best


@api(2, 1, 9)
def handle_list_offsets(broker: Broker, request: Request) -> Any:
    req = request.body
    cls = response_type(2, request.api_version)
    topic_cls = sibling(cls, "ListOffsetsTopicResponse")
    part_cls = sibling(cls, "ListOffsetsPartitionResponse")
    read_committed = getattr(req, "isolation_level", 0) == READ_COMMITTED
    topics_out = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            partition = broker.topics.partition(t.name, p.partition_index)
            error, offset, ts = ErrorCode.none, -1, -1
            if partition is None:
                error = ErrorCode.unknown_topic_or_partition
            else:
                upper = partition.last_stable_offset if read_committed else partition.high_watermark
                if p.timestamp == LATEST or p.timestamp == LATEST_TIERED:
                    offset = upper
                elif p.timestamp in (EARLIEST, EARLIEST_LOCAL):
                    offset = partition.log.log_start_offset
                elif p.timestamp == MAX_TIMESTAMP:
                    offset, ts = max_timestamp_offset(partition, upper)
                elif p.timestamp < 0:
                    error = ErrorCode.invalid_request
                else:
                    offset, ts = offset_for_time(partition, p.timestamp, upper)
            parts.append(
                build(
                    part_cls,
                    partition_index=p.partition_index,
                    error_code=error,
                    timestamp=ts,
                    offset=offset,
                    leader_epoch=LEADER_EPOCH,
                    old_style_offsets=(offset,),
                )
            )
        topics_out.append(build(topic_cls, name=t.name, partitions=tuple(parts)))
    return build(cls, throttle_time=datetime.timedelta(0), topics=tuple(topics_out))
